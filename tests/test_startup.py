"""A new user's first minutes: what a worker says, and how it exits, when it cannot work.

Real ``scrapy crawl`` processes: the exit code and the log a new user sees are the behaviour
under test, and both are made by Scrapy's command as much as by distcrawl.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from distcrawl.testing.redis_server import RedisServer
from distcrawl.testing.workers import ROOT, Worker

#: a worker that exits is expected to do so well within this (liveness bound, not speed)
EXIT_WITHIN = 60.0

SPIDERS = """
from distcrawl.spiders import RedisCrawlSpider, RedisSpider


class Plain(RedisSpider):
    name = "plain"

    def parse(self, response):
        yield {"url": response.url}


class Rules(RedisCrawlSpider):
    name = "rules"
"""


def _project(tmp_path: Path, settings: str) -> Path:
    """A project laid out as ``scrapy startproject`` lays it out, with the given settings."""
    root = tmp_path / "proj"
    package = root / "newproj"
    (package / "spiders").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "spiders" / "__init__.py").write_text(SPIDERS)
    (package / "settings.py").write_text(settings)
    (root / "scrapy.cfg").write_text("[settings]\ndefault = newproj.settings\n")
    return root


def _crawl(project: Path, spider: str, log: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", spider, "-s", f"LOG_FILE={log}", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=EXIT_WITHIN,
    )


@pytest.mark.integration
@pytest.mark.parametrize("spider", ["plain", "rules"])
def test_redis_spider_without_the_addon_stops_naming_addons(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, spider: str
) -> None:
    """Before: closed ``finished``, 0 pages, exit 0, the pushed URL left in Redis, no word."""
    redis_client.rpush(f"{spider}:start_urls", "http://127.0.0.1:9/")
    project = _project(
        tmp_path,
        f'BOT_NAME = "newproj"\nSPIDER_MODULES = ["newproj.spiders"]\nREDIS_URL = "{redis_url}"\n',
    )
    log = tmp_path / "crawl.log"
    result = _crawl(project, spider, log)
    text = log.read_text()
    errors = [line for line in text.splitlines() if "] ERROR:" in line]
    assert result.returncode != 0, text
    assert len(errors) == 1, errors
    assert "ADDONS" in errors[0] and "distcrawl.Addon" in errors[0], errors
    assert "Spider closed (distcrawl_addon_missing)" in text
    assert "Traceback" not in text


@pytest.mark.integration
def test_redis_spider_with_start_urls_of_its_own_runs_on_plain_scrapy_with_a_warning(
    tmp_path: Path, demo_site
) -> None:
    """Without the add-on a spider given start URLs is a plain Scrapy crawl of them (what
    the benchmarks' plain Scrapy row runs): crawled, exit 0, one WARNING that Redis is not
    read; only a spider with nothing but Redis to read from is refused (test above)."""
    site = demo_site(pages=5)
    project = _project(
        tmp_path,
        'BOT_NAME = "newproj"\nSPIDER_MODULES = ["newproj.spiders"]\nROBOTSTXT_OBEY = False\n',
    )
    log = tmp_path / "crawl.log"
    result = _crawl(project, "plain", log, "-a", f"start_urls={site.url}/")
    text = log.read_text()
    warnings = [line for line in text.splitlines() if "] WARNING:" in line and "add-on" in line]
    assert result.returncode == 0, text
    assert len(warnings) == 1, warnings
    assert "plain:start_urls in Redis is not read" in warnings[0]
    assert "'downloader/response_status_count/200': 1" in text
    assert "] ERROR:" not in text and "Traceback" not in text


def _refused_worker(tmp_path: Path, url: str) -> tuple[int | None, str]:
    worker = Worker(0, redis_url=url, log_path=tmp_path / "worker.log").start()
    try:
        code = worker.wait(EXIT_WITHIN)
        return code, worker.log()
    finally:
        worker.stop(timeout=5)


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[RedisServer]:
    directory = tmp_path / "redis-auth"
    directory.mkdir()
    server = RedisServer(directory=directory, password="right-secret").start()
    yield server
    server.stop()


def _assert_refused(code: int | None, log: str, secret: str | None = None) -> None:
    errors = [line for line in log.splitlines() if "] ERROR:" in line]
    assert code is not None, "the worker did not exit: " + log[-2000:]
    assert code != 0, log[-2000:]
    assert len(errors) == 1, errors
    assert "REDIS_URL=" in errors[0], errors
    assert "Traceback" not in log, log[-3000:]
    assert "Spider closed (redis_url_refused)" in log
    if secret is not None:
        assert secret not in log


@pytest.mark.integration
def test_wrong_password_stops_the_worker(tmp_path: Path, password_redis: RedisServer) -> None:
    """Before: "Redis refused the password ... retrying", for ever, exit code none."""
    url = f"redis://:wrong-secret@127.0.0.1:{password_redis.port}/0"
    code, log = _refused_worker(tmp_path, url)
    _assert_refused(code, log, secret="wrong-secret")
    assert "refused the password" in log


@pytest.mark.integration
def test_missing_database_stops_the_worker(tmp_path: Path, password_redis: RedisServer) -> None:
    """redis-server's default ``databases 16``: DB 99 does not exist. Before: retried for ever."""
    url = f"redis://:right-secret@127.0.0.1:{password_redis.port}/99"
    code, log = _refused_worker(tmp_path, url)
    _assert_refused(code, log, secret="right-secret")
    assert "DB index" in log


@pytest.mark.integration
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://:pw-in-url@127.0.0.1:6379/0", "schemes"),
        ("redis://127.0.0.1:6379/zero", "database number"),
        ("redis://nonexistent.invalid:6379/0", "does not resolve"),
    ],
)
def test_url_no_retry_mends_stops_the_worker(tmp_path: Path, url: str, says: str) -> None:
    """Before, for a bad scheme: 216 lines, 5 tracebacks, REDIS_URL never named."""
    code, log = _refused_worker(tmp_path, url)
    _assert_refused(code, log, secret="pw-in-url")
    assert says in log


@pytest.mark.integration
def test_refused_connection_keeps_retrying_and_recovers(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """A closed port is an outage: the worker keeps its retry and joins when Redis is up."""
    redis_server.pause()
    worker = Worker(
        0,
        redis_url=redis_server.url,
        log_path=tmp_path / "worker.log",
        settings={"DISTCRAWL_DOMAIN_CONCURRENCY": 64},
    ).start()
    try:
        assert worker.wait_for_log("Redis unreachable", timeout=EXIT_WITHIN), worker.log()
        time.sleep(2.0)  # a few retries
        assert worker.alive(), worker.log()
        redis_server.resume()
        assert worker.wait_for_log("Frontier: ", timeout=EXIT_WITHIN), worker.log()
        assert "redis_url_refused" not in worker.log()
        assert worker.alive()
    finally:
        worker.stop(timeout=10)


def test_a_misspelt_setting_is_named_with_the_setting_meant(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from scrapy.settings import Settings

    from distcrawl.addon import Addon

    settings = Settings(
        {
            "DISTCRAWL_IDLE_TIMOUT": 5,
            "DISTCRAWL_IDLE_TIMEOUT": 5,
            "DISTCRAWL_ZZZ": 1,
            "CONCURRENT_REQUESTS": 4,
        }
    )
    with caplog.at_level("WARNING", logger="distcrawl.config"):
        Addon().update_settings(settings)
    lines = [r.getMessage() for r in caplog.records if r.name == "distcrawl.config"]
    assert lines == [
        "DISTCRAWL_IDLE_TIMOUT is not a distcrawl setting (did you mean DISTCRAWL_IDLE_TIMEOUT?):"
        " it is ignored; every setting: docs/settings.md",
        "DISTCRAWL_ZZZ is not a distcrawl setting: it is ignored; every setting: docs/settings.md",
    ]


@pytest.mark.integration
def test_a_worker_warns_once_of_a_misspelt_setting(tmp_path: Path, redis_url: str) -> None:
    """Before: the worker ran with ``DISTCRAWL_IDLE_TIMOUT=1`` and never said a word (nor
    ever closed)."""
    worker = Worker(
        0,
        redis_url=redis_url,
        log_path=tmp_path / "worker.log",
        settings={"DISTCRAWL_IDLE_TIMOUT": 1},
    ).start()
    try:
        assert worker.wait_for_log("Frontier: ", timeout=EXIT_WITHIN), worker.log()
        warnings = [line for line in worker.log().splitlines() if "did you mean" in line]
        assert len(warnings) == 1, warnings
        assert "DISTCRAWL_IDLE_TIMOUT" in warnings[0] and "DISTCRAWL_IDLE_TIMEOUT?" in warnings[0]
        assert "WARNING" in warnings[0]
    finally:
        worker.stop(timeout=5)


@pytest.mark.integration
def test_the_start_line_states_the_cluster_wide_bound_of_the_template(
    tmp_path: Path, redis_url: str
) -> None:
    """``scrapy startproject``'s template: DOWNLOAD_DELAY = 1, CONCURRENT_REQUESTS_PER_DOMAIN
    = 1. Before: "per domain, cluster-wide: delay 1.00s, concurrency 1" (205 pages took 4
    minutes with 2 workers and nobody said why)."""
    worker = Worker(
        0,
        redis_url=redis_url,
        log_path=tmp_path / "worker.log",
        settings={"DOWNLOAD_DELAY": 1, "CONCURRENT_REQUESTS_PER_DOMAIN": 1},
    ).start()
    try:
        assert worker.wait_for_log("Frontier: ", timeout=EXIT_WITHIN), worker.log()
    finally:
        worker.stop(timeout=10)
    line = next(line for line in worker.log().splitlines() if "distcrawl frontier" in line)
    assert "] INFO: " in line
    assert (
        "politeness is cluster-wide: at most 1.0 page/s per domain for all workers together "
        "(DOWNLOAD_DELAY=1, CONCURRENT_REQUESTS_PER_DOMAIN=1); a robots.txt Crawl-delay may "
        "lower it"
    ) in line, line


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {"DOWNLOAD_DELAY": 0.25, "CONCURRENT_REQUESTS_PER_DOMAIN": 4},
            "at most 4.0 page/s per domain for all workers together "
            "(DOWNLOAD_DELAY=0.25, CONCURRENT_REQUESTS_PER_DOMAIN=4)",
        ),
        (
            {"DISTCRAWL_DOMAIN_DELAY": 3, "DISTCRAWL_DOMAIN_CONCURRENCY": 2},
            "at most 0.33 page/s per domain for all workers together "
            "(DISTCRAWL_DOMAIN_DELAY=3, DISTCRAWL_DOMAIN_CONCURRENCY=2)",
        ),
        (
            {"CONCURRENT_REQUESTS_PER_DOMAIN": 16},
            "at most 16 requests at a time per domain for all workers together "
            "(DOWNLOAD_DELAY=0, CONCURRENT_REQUESTS_PER_DOMAIN=16)",
        ),
        (
            {
                "DOWNLOAD_DELAY": 0.5,
                "AUTOTHROTTLE_ENABLED": True,
                "DOWNLOAD_SLOTS": {"a.example": {"delay": 2}},
            },
            "at most 2.0 page/s per domain for all workers together "
            "(DOWNLOAD_DELAY=0.5, CONCURRENT_REQUESTS_PER_DOMAIN=8); AutoThrottle may lower "
            "it; DOWNLOAD_SLOTS sets its own for 1 slot(s)",
        ),
    ],
)
def test_the_cluster_wide_bound_names_the_settings_it_comes_from(
    settings: dict[str, object], expected: str
) -> None:
    from scrapy.settings import Settings

    from distcrawl.config import DistcrawlConfig
    from distcrawl.engine.opening import politeness_bound

    given = Settings(settings)
    said = politeness_bound(DistcrawlConfig.from_settings(given), given)
    assert said == "politeness is cluster-wide: " + expected
