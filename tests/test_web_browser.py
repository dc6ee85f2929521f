"""The web console in a real browser: Debian's headless chromium, driven by selenium through
chromedriver (both installed by .ci/setup), during a real two-worker crawl of the demo site.
One crawl serves the whole test: the page refreshes itself and matches Redis, the charts
have data points, pause, resume and a re-drive round-trip into Redis from its buttons."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from distcrawl.model.dashboard import snapshot
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from tests.support import page_fetches, wait_until
from tests.web_console import Console

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FAST = {"DISTCRAWL_HEARTBEAT_INTERVAL": 0.5}
ROOT = Path(__file__).resolve().parents[1]
#: set to a path to keep the screenshot (docs/img/console.png was made so)
SCREENSHOT = os.environ.get("DISTCRAWL_CONSOLE_SCREENSHOT")

webdriver = pytest.importorskip("selenium.webdriver")


@pytest.fixture
def browser() -> Iterator[object]:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are missing: run bash .ci/setup")
        pytest.skip("chromium and chromium-driver are not installed (bash .ci/setup)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # as root in CI
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--window-size=1280,1400",
    ):
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _text(driver, element_id: str) -> str:
    return str(driver.find_element("id", element_id).text)


def test_the_console_in_a_browser_during_a_two_worker_crawl(
    demo_site, workers, redis_client, tmp_path, redis_url, browser
):
    from selenium.webdriver.common.by import By

    keys = FrontierKeys("site")
    # slow enough (about 16 s for two workers) that the crawl is still running when the
    # browser first looks; it finishes (finish.lua) only after the resume
    site = demo_site(pages=500, delay=1.0)
    redis_client.lpush("site:start_urls", site.url + "/")
    # a dead letter to re-drive: a start URL some operator pushed wrong, later fixed
    # (a URL the crawl does not find otherwise: its fetch is the re-drive's)
    redriven = "/page/1?redriven=1"
    bad = {"reason": "invalid", "source": "start_urls", "raw": site.url + redriven, "time": 1}
    redis_client.lpush("site:dead", json.dumps(bad))
    pool = [workers(i, DISTCRAWL_IDLE_TIMEOUT=3, **FAST) for i in (1, 2)]
    web = Console(redis_url, tmp_path / "web.log", "--allow-actions").start()
    try:
        assert wait_until(lambda: len(page_fetches(site)) >= 80, timeout=60)
        browser.get(web.url + "/crawl/site")
        crawl = browser.find_element(By.ID, "crawl")
        # it refreshes by itself: the polls count up and the totals grow
        first = _text(browser, "totals")
        assert wait_until(lambda: int(crawl.get_attribute("data-polls") or 0) >= 2, timeout=15)
        assert wait_until(lambda: _text(browser, "totals") != first, timeout=15)
        assert wait_until(lambda: _text(browser, "state") == "running", timeout=10), _text(
            browser, "state"
        )
        rows = browser.find_elements(By.CSS_SELECTOR, "#workers tbody tr")
        assert len(rows) == 2 and all("alive" in r.text for r in rows)
        # the charts: this minute's pages and queue, drawn (at most 10 s for a redraw)
        assert wait_until(
            lambda: (
                int(browser.find_element(By.ID, "chart-pages").get_attribute("data-points") or 0)
                > 0
            ),
            timeout=15,
        )
        # pause from its button: into Redis, then the workers, then the page
        browser.find_element(By.ID, "pause").click()
        assert wait_until(lambda: redis_client.get("site:paused") == b"1", timeout=10)
        assert wait_until(lambda: "paused" in _text(browser, "message"), timeout=10)
        assert wait_until(lambda: snapshot(Frontier(redis_client, keys))["leased"] == 0, 20)
        assert wait_until(lambda: _text(browser, "state") == "paused", timeout=15)
        truth = snapshot(Frontier(redis_client, keys))

        def shows_truth() -> bool:
            return all(
                _text(browser, f"f-{name}") == str(truth[name])
                for name in ("queue", "leased", "delayed", "dead", "seen", "start_urls")
            )

        assert wait_until(shows_truth, timeout=10), {
            n: (_text(browser, f"f-{n}"), truth[n]) for n in ("queue", "dead", "seen")
        }
        if SCREENSHOT:
            browser.save_screenshot(SCREENSHOT)
        browser.save_screenshot(str(tmp_path / "console.png"))
        # re-drive from the dead letters' page: the entry goes back to start_urls
        browser.get(web.url + "/crawl/site/dead")
        assert site.url + redriven in browser.find_element(By.ID, "dead").text
        browser.find_element(By.ID, "redrive").click()
        assert wait_until(lambda: redis_client.llen("site:dead") == 0, timeout=10)
        assert wait_until(lambda: "re-drove 1" in _text(browser, "message"), timeout=10)
        # resume from the crawl page: the crawl runs to its end
        browser.get(web.url + "/crawl/site")
        browser.find_element(By.ID, "resume").click()
        assert wait_until(lambda: not redis_client.exists("site:paused"), timeout=10)
        for w in pool:
            assert w.wait(120) == 0, w.log()[-2000:]
        assert set(page_fetches(site)) == site.expected_pages()
        assert redriven in {line.path for line in site.read_log()}
        # finished (finish.lua decided it once, one completion event), not merely idle
        assert wait_until(lambda: _text(browser, "state") == "finished", timeout=30)
        assert redis_client.xrange("site:events")
        assert "Traceback" not in web.log()
    finally:
        web.stop()
