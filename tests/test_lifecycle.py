"""A crawl's life around its workers: workers that outlive a reset of the frontier they
joined, and workers started before the first start URL is pushed.

Real ``scrapy crawl site`` processes on a real Redis; every count comes from the demo
site's own request log.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from distcrawl.keys import FrontierKeys
from tests.support import page_fetches, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SITE = FrontierKeys("site")


def distcrawl_cli(redis_url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distcrawl.cli", "--redis-url", redis_url, *argv],
        capture_output=True,
        text=True,
        timeout=30,
    )


def crawl_once(site, redis_client, times: int) -> None:
    """Push the site's home page and wait until every page was fetched ``times`` times."""
    redis_client.lpush(SITE.start_urls, site.url + "/")
    expected = site.expected_pages()

    def done() -> bool:
        fetched = page_fetches(site)
        return all(fetched[page] >= times for page in expected)

    if not wait_until(done, timeout=60):
        fetched = page_fetches(site)
        reached = sum(1 for page in expected if fetched[page] >= times)
        raise AssertionError(f"{reached} of {len(expected)} pages fetched {times} times")


def settled(redis_client) -> bool:
    """The crawl is over in Redis: nothing queued, leased or waiting to be claimed."""
    return not (
        redis_client.zcard(SITE.queue)
        or redis_client.zcard(SITE.leases)
        or redis_client.llen(SITE.start_urls)
    )


# ---------------------------------------------------------------------- a frontier reset


@pytest.mark.parametrize("how", ["reset", "flushdb"])
def test_a_live_worker_crawls_every_page_of_the_next_crawl(
    how, demo_site, workers, redis_url, redis_client
):
    site = demo_site(pages=30)
    worker = workers(1)  # no idle timeout: it stays up between the crawls
    assert worker.wait_for_log("Frontier: 0 queued"), worker.log()
    crawl_once(site, redis_client, times=1)
    assert wait_until(lambda: settled(redis_client), timeout=30)
    time.sleep(1.0)  # the worker's last acknowledgements are in

    if how == "reset":
        done = distcrawl_cli(redis_url, "reset", "site", "--yes", "--force")
        assert done.returncode == 0, done.stderr
    else:
        redis_client.flushdb()
    crawl_once(site, redis_client, times=2)

    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages()
    assert all(count == 2 for count in fetched.values()), fetched
    # robots.txt read again for the new crawl, its Crawl-delay recorded in it again
    robots = [line for line in site.read_log() if line.path == "/robots.txt"]
    assert len(robots) == 2, robots
    assert redis_client.hexists(SITE.robots, "127.0.0.1")
    log = worker.log()
    assert log.count("WARNING: The frontier 'site' this worker joined is gone") == 1, log[-3000:]
    assert worker.alive()
    worker.stop()
    assert worker.proc.returncode == 0
