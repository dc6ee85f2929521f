"""One clock for ages compared across hosts: the Redis server's TIME.

Workers run on hosts whose clocks disagree. Ages that one host computes from a time another
host wrote (a shared robots.txt's, a worker's last beat) are taken against the server's
clock; these tests skew this process's ``time.time`` by a day to show that nothing depends on
it. Against a real redis-server.
"""

from __future__ import annotations

import json
import re
import time
from types import SimpleNamespace

import pytest
import pytest_twisted
from scrapy.crawler import AsyncCrawlerRunner
from scrapy.utils.defer import deferred_from_coro

from distcrawl import cli
from distcrawl.engine.liveness import Liveness
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.spiders.site import SiteSpider
from tests.support import crawl_settings, server_ms, wait_until
from tests.test_robots_bypass import PRIVATE, fetched_private

pytestmark = pytest.mark.timeout(120)

SITE = FrontierKeys("site")
DAY = 86400.0
DISALLOW = b"User-agent: *\nDisallow: /private/\n"
ALLOW = b"User-agent: *\nAllow: /\n"


def skew(monkeypatch, offset: float) -> None:
    """This process's wall clock ``offset`` seconds off, as on a badly synchronised host."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + offset)


def server_seconds(client) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


# ---------------------------------------------------------------------- robots.txt


def test_a_robots_txt_stored_on_one_host_is_fresh_on_a_host_a_day_ahead(redis_client, monkeypatch):
    writer, reader = Frontier(redis_client, SITE), Frontier(redis_client, SITE)
    skew(monkeypatch, -DAY)
    before = server_seconds(redis_client)
    writer.store_robots_txt("a.test", 200, DISALLOW)
    after = server_seconds(redis_client)
    skew(monkeypatch, +DAY)
    age, status, body = reader.robots_txt("a.test")
    assert 0 <= age < 60  # a day either way with host clocks
    assert (status, body) == (200, DISALLOW)
    # still readable with redis-cli: "<server seconds, ms> <status>\n<body>"
    stored = redis_client.get(SITE.robots_txt("a.test"))
    match = re.fullmatch(rb"(\d+\.\d{3}) 200\n" + re.escape(DISALLOW), stored)
    assert match and before - 0.001 <= float(match[1]) <= after


def test_a_robots_txt_expires_with_its_ttl_and_reset_removes_it(redis_client):
    frontier = Frontier(redis_client, SITE)
    frontier.store_robots_txt("a.test", 200, DISALLOW, ttl_ms=60_000)
    assert 59_000 <= redis_client.pttl(SITE.robots_txt("a.test")) <= 60_000
    frontier.store_robots_txt("b.test:8080", 200, DISALLOW, ttl_ms=30)
    time.sleep(0.1)
    assert frontier.robots_txt("b.test:8080") is None  # gone: read again when needed
    assert frontier.lock_robots_txt("c.test", 60_000)
    frontier.admin.clear()
    assert redis_client.keys("site:*") == []


def test_storing_frees_the_download_lock(redis_client):
    frontier = Frontier(redis_client, SITE)
    assert frontier.lock_robots_txt("a.test", 60_000)
    frontier.store_robots_txt("a.test", 0, b"")
    assert redis_client.exists(SITE.robots_lock("a.test")) == 0
    assert frontier.robots_txt("a.test")[1:] == (0, b"")
    assert frontier.robots_txt("b.test") is None


def test_a_robots_txt_ages_by_the_server_clock(redis_client, monkeypatch):
    frontier = Frontier(redis_client, SITE)
    frozen = time.time() - DAY
    monkeypatch.setattr(time, "time", lambda: frozen)  # this host's clock stands still
    frontier.store_robots_txt("a.test", 200, DISALLOW)
    first = frontier.robots_txt("a.test")[0]
    assert wait_until(lambda: frontier.robots_txt("a.test")[0] >= first + 0.5, timeout=10)


async def crawl_private(redis_url: str, redis_client, site, **extra: object) -> dict:
    for path in PRIVATE:
        redis_client.lpush(SITE.start_urls, site.url + path)
    crawler = AsyncCrawlerRunner(crawl_settings(redis_url, **extra)).create_crawler(SiteSpider)
    await deferred_from_coro(crawler.crawl_async())
    return crawler.stats.get_stats()


@pytest_twisted.ensureDeferred
async def test_a_worker_a_day_ahead_uses_the_shared_robots_txt(
    redis_url, redis_client, demo_site, monkeypatch
):
    """Before: a host a day ahead read every shared robots.txt as expired (TTL one day)."""
    site = demo_site(pages=400)
    netloc = site.url.split("://", 1)[1]
    skew(monkeypatch, -DAY)
    Frontier(redis_client, SITE).store_robots_txt(netloc, 200, DISALLOW)  # by a host behind
    skew(monkeypatch, +DAY)
    stats = await crawl_private(redis_url, redis_client, site)
    assert stats.get("robotstxt/request_count", 0) == 0  # not downloaded again
    assert stats["distcrawl/robots/shared"] >= 1
    assert stats["robotstxt/forbidden"] == len(PRIVATE)
    assert fetched_private(site) == []


@pytest_twisted.ensureDeferred
async def test_a_worker_a_day_behind_reads_an_expired_robots_txt_again(
    redis_url, redis_client, demo_site, monkeypatch
):
    """Before: a host a day behind kept using a robots.txt long expired by everyone else's
    clock; here a stale copy that allows everything, while the site now forbids /private/."""
    site = demo_site(pages=400)
    netloc = site.url.split("://", 1)[1]
    frontier = Frontier(redis_client, SITE)
    frontier.store_robots_txt(netloc, 200, ALLOW)
    ttl = 1.0
    assert wait_until(lambda: frontier.robots_txt(netloc)[0] > ttl, timeout=10)
    skew(monkeypatch, -DAY)
    stats = await crawl_private(redis_url, redis_client, site, DISTCRAWL_ROBOTS_TTL=ttl)
    assert stats["robotstxt/request_count"] == 1
    assert stats["robotstxt/forbidden"] == len(PRIVATE)
    assert fetched_private(site) == []
    # the new copy was shared for DISTCRAWL_ROBOTS_TTL (1 s): stamped anew, or gone already
    cached = frontier.robots_txt(netloc)
    if cached is not None:
        age, status, body = cached
        assert status == 200 and b"Disallow: /private/" in body
        assert 0 <= age < 60


# ---------------------------------------------------------------------- worker status


def heartbeat(redis_client, wid: str, tag: str | None, state: str, last_beat: float) -> None:
    """A heartbeat as WorkerMonitor writes it; ``last_beat`` is the worker host's clock."""
    beat = {"host": wid.split(":")[0], "pid": 1, "state": state, "last_beat": last_beat}
    if tag is not None:
        beat["tag"] = tag
    redis_client.hset(SITE.workers, wid, json.dumps(beat))


def status(capsys, redis_url: str, *extra: str) -> dict[str, dict]:
    capsys.readouterr()
    assert cli.main(["--redis-url", redis_url, "--json", "status", "site", *extra]) == 0
    return {w["id"]: w for w in json.loads(capsys.readouterr().out)["workers"]}


def test_status_judges_workers_by_their_beats_and_the_server_clock(
    redis_url, redis_client, capsys, monkeypatch
):
    now = time.time()
    # host clocks all over the place: last_beat must not matter
    heartbeat(redis_client, "ahead:1", "0000000a", "running", now + DAY)
    heartbeat(redis_client, "behind:2", "0000000b", "running", now - DAY)
    heartbeat(redis_client, "dead:3", "0000000c", "running", now + DAY)
    heartbeat(redis_client, "old:4", None, "running", now)  # no tag: an older distcrawl
    heartbeat(redis_client, "done:5", None, "finished", now - DAY)
    beaters = [
        Liveness(redis_url, SITE, tag, interval=0.1, socket_timeout=1.0)
        for tag in ("0000000a", "0000000b")
    ]
    for liveness in beaters:
        liveness.start()
    try:
        # the dead worker's last beat was 30 s ago by the server's clock
        redis_client.zadd(SITE.alive, {"0000000c": server_ms(redis_client) - 30_000})
        assert wait_until(lambda: redis_client.zcard(SITE.alive) == 3, timeout=10)
        for offset in (+DAY, -DAY):  # the CLI's host clock is off too
            skew(monkeypatch, offset)
            workers = status(capsys, redis_url)
            assert {wid: w["status"] for wid, w in workers.items()} == {
                "ahead:1": "alive",
                "behind:2": "alive",
                "dead:3": "stale",
                "old:4": "stale",
                "done:5": "exited",
            }
            assert workers["ahead:1"]["age"] < 10 and workers["behind:2"]["age"] < 10
            assert 30 <= workers["dead:3"]["age"] < 90
            assert workers["old:4"]["age"] is None and workers["done:5"]["age"] is None
            assert workers["ahead:1"]["tag"] == "0000000a"  # heartbeat fields kept
            assert workers["ahead:1"]["last_beat"] == now + DAY
        assert status(capsys, redis_url, "--stale-after", "120")["dead:3"]["status"] == "alive"
        # and as text
        capsys.readouterr()
        assert cli.main(["--redis-url", redis_url, "status", "site"]) == 0
        out = capsys.readouterr().out
        assert "workers: 2 alive of 5" in out
        assert re.search(r"done:5 +exited +finished +last beat +- +pages", out), out
        # a worker that closes normally leaves alive; its final heartbeat says it exited
        beaters[0].stop(clean=True)
        heartbeat(redis_client, "ahead:1", "0000000a", "finished", now + DAY)
        assert status(capsys, redis_url)["ahead:1"]["status"] == "exited"
    finally:
        for liveness in beaters:
            liveness.stop(clean=False)


def test_the_heartbeat_names_the_schedulers_liveness_tag():
    from distcrawl.config import DistcrawlConfig
    from distcrawl.extensions import WorkerMonitor
    from distcrawl.model.connection import RedisIO
    from distcrawl.scheduler import _SCHEDULERS

    class Crawler:  # what _snapshot reads of a crawler; weakly referenceable, as a key
        stats = None

    crawler = Crawler()
    monitor = WorkerMonitor(crawler, DistcrawlConfig(), RedisIO("redis://127.0.0.1:1/0"))  # type: ignore[arg-type]
    assert monitor._snapshot("running").heartbeat["tag"] is None  # no distcrawl scheduler
    _SCHEDULERS[crawler] = SimpleNamespace(tag="0a1b2c3d")  # type: ignore[assignment]
    try:
        assert monitor._snapshot("running").heartbeat["tag"] == "0a1b2c3d"
    finally:
        del _SCHEDULERS[crawler]
