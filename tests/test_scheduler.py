"""In-process crawls through the distcrawl scheduler, on a real redis-server and demo site."""

from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter

import pytest
import pytest_twisted
from scrapy import Request, signals
from scrapy.crawler import AsyncCrawlerRunner
from twisted.internet import task

from distcrawl.scheduler import Scheduler
from distcrawl.spiders import RedisSpider
from distcrawl.spiders.site import SiteSpider
from distcrawl.testing.redis_server import RedisServer, find_free_port
from distcrawl.testing.workers import worker_agent
from tests.support import crawl, crawl_settings, fetched, run, stat


class MetaObjectSpider(RedisSpider):
    """Yields one request that cannot be stored: its meta holds a Python object."""

    name = "metaobj"

    def parse(self, response, **kwargs):
        yield Request(response.urljoin("/page/2"), meta={"obj": object()})
        yield Request(response.urljoin("/page/3"))


class FailingSpider(RedisSpider):
    name = "failing"

    def parse(self, response, **kwargs):
        raise RuntimeError("callback bug")


@pytest_twisted.ensureDeferred
async def test_in_process_crawl_drains_the_frontier(redis_url, redis_client, demo_site):
    site = demo_site(pages=50)
    redis_client.lpush("site:start_urls", site.url + "/")
    crawler = await crawl(SiteSpider, redis_url)
    assert sorted(set(fetched(site))) == sorted(site.expected_pages())
    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "finished"
    # 51 pages and /private/7, which robots.txt then forbids
    assert stats["distcrawl/pushed"] == 52
    # each request leased once; a reserve given back unsent (it came after the requests it
    # could replace had left) is leased again
    returned = stats.get("distcrawl/places/reserves_returned", 0)
    assert stats["distcrawl/leased"] - returned == 52
    assert stats["robotstxt/forbidden"] == 1
    assert stats["item_scraped_count"] == 51
    assert stats["dupefilter/filtered"] > 0
    assert redis_client.zcard("site:queue") == redis_client.zcard("site:leases") == 0
    assert redis_client.scard("site:seen") == 52


@pytest_twisted.ensureDeferred
async def test_the_reserves_a_worker_is_leased_are_counted(redis_url, redis_client, demo_site):
    """At 100 ms a page a worker's places are all at the site: its leases bring reserves
    (lease.lua), counted in distcrawl/places/reserves_leased; each is sent in a freed place
    (taken, reported or left to its acknowledgement) or given back unsent."""
    site = demo_site(pages=150, delay=0.1)
    redis_client.lpush("site:start_urls", site.url + "/")
    crawler = await crawl(
        SiteSpider, redis_url, CONCURRENT_REQUESTS=4, CONCURRENT_REQUESTS_PER_DOMAIN=4
    )
    assert sorted(set(fetched(site))) == sorted(site.expected_pages())
    stats = crawler.stats.get_stats()
    leased = stats.get("distcrawl/places/reserves_leased", 0)
    taken = stats.get("distcrawl/places/taken", 0)
    returned = stats.get("distcrawl/places/reserves_returned", 0)
    assert leased > 0
    assert leased >= taken + returned
    assert max(line.in_flight for line in site.read_log()) <= 4


@pytest_twisted.ensureDeferred
async def test_a_worker_short_of_requests_leases_at_once_not_at_its_next_turn(
    redis_url, redis_client, demo_site
):
    """A busy worker is fed by its engine's demand, not by the periodic turn: when the engine
    holds fewer than half of CONCURRENT_REQUESTS of its requests and none waits, it leases
    at once, counting what the engine holds now. With a turn a minute the crawl still ends
    before the first of them; counted at the last turn instead, the requests handed out
    since then kept the worker from leasing until the next one, its engine empty (at 0 ms a
    page, 5-9% of a worker's time; here minutes for 80 pages)."""
    interval = 60
    site = demo_site(pages=80)
    redis_client.lpush("site:start_urls", site.url + "/")
    crawler = await crawl(
        SiteSpider, redis_url, DISTCRAWL_FLUSH_INTERVAL=interval, DISTCRAWL_PREFETCH=16
    )
    assert sorted(set(fetched(site))) == sorted(site.expected_pages())
    assert crawler.stats.get_value("finish_reason") == "finished"
    # over before the first periodic turn after the start was due (some 8 s here)
    assert crawler.stats.get_value("elapsed_time_seconds") < interval
    assert redis_client.zcard("site:queue") == redis_client.zcard("site:leases") == 0


@pytest_twisted.ensureDeferred
async def test_unserializable_request_is_dead_lettered_and_named(
    redis_url, redis_client, demo_site, caplog
):
    site = demo_site(pages=10)
    redis_client.lpush("metaobj:start_urls", site.url + "/page/1")
    with caplog.at_level(logging.ERROR):
        crawler = await crawl(MetaObjectSpider, redis_url)
    assert "/page/3" in fetched(site)  # the rest of the callback's output went on
    assert "/page/2" not in fetched(site)
    record = json.loads(redis_client.lindex("metaobj:dead", 0))
    assert record["url"].endswith("/page/2")
    assert "cannot serialize" in record["reason"] and record["source"] == "enqueue"
    assert any("/page/2" in r.getMessage() for r in caplog.records)
    assert crawler.stats.get_value("distcrawl/unserializable") == 1


@pytest_twisted.ensureDeferred
async def test_failing_callback_does_not_leave_its_lease_behind(redis_url, redis_client, demo_site):
    site = demo_site(pages=10)
    redis_client.lpush("failing:start_urls", site.url + "/page/1")
    crawler = await crawl(FailingSpider, redis_url)
    assert crawler.stats.get_value("spider_exceptions/RuntimeError") == 1
    assert redis_client.zcard("failing:leases") == 0
    assert redis_client.hlen("failing:requests") == 0


@pytest_twisted.ensureDeferred
async def test_redirect_acknowledges_the_original_and_crawls_the_target(
    redis_url, redis_client, demo_site
):
    site = demo_site(pages=5)
    redis_client.lpush("site:start_urls", site.url + "/redirect/4")
    await crawl(SiteSpider, redis_url, DEPTH_LIMIT=1)
    assert fetched(site)[:2] == ["/redirect/4", "/page/4"]
    assert redis_client.zcard("site:leases") == 0
    assert redis_client.hlen("site:requests") == 0


@pytest_twisted.ensureDeferred
async def test_flush_on_start_clears_only_when_asked(redis_url, redis_client, demo_site):
    site = demo_site(pages=3)
    redis_client.sadd("site:seen", b"old-fingerprint")
    redis_client.lpush("site:dead", b"{}")
    redis_client.lpush("site:start_urls", site.url + "/page/1")
    await crawl(SiteSpider, redis_url, DEPTH_LIMIT=0)
    assert redis_client.sismember("site:seen", b"old-fingerprint")  # persistent by default
    assert redis_client.llen("site:dead") == 1
    runner = AsyncCrawlerRunner(
        crawl_settings(redis_url, DEPTH_LIMIT=0, DISTCRAWL_FLUSH_ON_START=True)
    )
    crawler = runner.create_crawler(SiteSpider)

    def push() -> None:
        # once the frontier is flushed (the scheduler opened): the idle timeout counts from
        # the crawl's first work, and a flushed crawl has none
        redis_client.lpush("site:start_urls", site.url + "/page/2")

    crawler.signals.connect(push, signal=signals.spider_opened)
    await run(crawler.crawl_async())
    assert not redis_client.sismember("site:seen", b"old-fingerprint")
    assert redis_client.llen("site:dead") == 0
    assert crawler.stats.get_value("distcrawl/start_urls/read") == 1


@pytest_twisted.ensureDeferred
async def test_idle_worker_stays_up_without_idle_timeout(redis_url, demo_site):
    from twisted.internet import reactor

    runner = AsyncCrawlerRunner(crawl_settings(redis_url, DISTCRAWL_IDLE_TIMEOUT=None))
    crawler = runner.create_crawler(SiteSpider)
    done = run(crawler.crawl_async())
    await task.deferLater(reactor, 3.0)
    assert not done.called  # idle for 3 s, still waiting for work
    assert isinstance(crawler.engine._slot.scheduler, Scheduler)
    await run(crawler.engine.close_async())
    await done
    assert crawler.stats.get_value("finish_reason") == "shutdown"


@pytest_twisted.ensureDeferred
async def test_worker_started_before_redis_waits_for_it(tmp_path, demo_site):
    """Redis down at start: the worker logs it, keeps running, and crawls once Redis is up."""
    from twisted.internet import reactor

    site = demo_site(pages=5)
    port = find_free_port()
    url = f"redis://:pw-secret@127.0.0.1:{port}/0"
    runner = AsyncCrawlerRunner(crawl_settings(url, DISTCRAWL_IDLE_TIMEOUT=2))
    crawler = runner.create_crawler(SiteSpider)
    errors: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            errors.append(record.getMessage())

    handler = Grab(level=logging.ERROR)
    logging.getLogger("distcrawl").addHandler(handler)
    try:
        done = run(crawler.crawl_async())
        await task.deferLater(reactor, 1.5)
        assert not done.called
        assert any("Redis unreachable" in m for m in errors)
        assert not any("pw-secret" in m for m in errors)  # the password is never logged
        server = RedisServer(port=port, directory=tmp_path, password="pw-secret").start()
        try:
            server.client().lpush("site:start_urls", site.url + "/")
            started = time.monotonic()
            await done
            assert time.monotonic() - started < 60
        finally:
            server.stop()
    finally:
        logging.getLogger("distcrawl").removeHandler(handler)
    assert sorted(set(fetched(site))) == sorted(site.expected_pages())
    assert crawler.stats.get_value("distcrawl/redis_errors") >= 1


def test_addon_enables_the_components():
    from scrapy.settings import Settings

    from distcrawl import Addon

    s = Settings()
    Addon().update_settings(s)
    assert s["SCHEDULER"] == "distcrawl.scheduler.Scheduler"
    assert s["DUPEFILTER_CLASS"] == "distcrawl.dupefilter.RedisDupeFilter"


def test_project_settings_win_over_the_addon():
    from scrapy.settings import Settings

    from distcrawl import Addon

    s = Settings({"SCHEDULER": "my.Scheduler"}, priority="project")
    Addon().update_settings(s)
    assert s["SCHEDULER"] == "my.Scheduler"


def test_addon_swaps_in_the_redis_backed_retries():
    from scrapy.downloadermiddlewares.retry import RetryMiddleware as ScrapyRetry
    from scrapy.settings import Settings

    from distcrawl import Addon
    from distcrawl.retry import CallbackRetryMiddleware, RetryMiddleware

    s = Settings()
    Addon().update_settings(s)
    downloader = s.getdict("DOWNLOADER_MIDDLEWARES")
    assert downloader[ScrapyRetry] is None
    assert downloader[RetryMiddleware] == 550
    assert s.getdict("SPIDER_MIDDLEWARES")[CallbackRetryMiddleware] == 30


# -------------------------------------------------------------------- Scrapy's contract


class TwoWaySpider(RedisSpider):
    """Two pages linking to each other and to /page/3: duplicates caught in Redis too."""

    name = "twoway"

    def parse(self, response, **kwargs):
        for n in (1, 2, 3):
            yield Request(response.urljoin(f"/page/{n}"))


class BadSlotSpider(RedisSpider):
    name = "badslot"

    def parse(self, response, **kwargs):
        yield Request(response.urljoin("/page/2"), meta={"download_slot": "a\0b"})
        yield Request(response.urljoin("/page/3"), meta={"download_slot": "x" * 300})
        yield Request(response.urljoin("/page/4"))


@pytest_twisted.ensureDeferred
async def test_scheduler_speaks_scrapys_dialect(redis_url, redis_client, demo_site, caplog):
    """len() without I/O, Scrapy's scheduler stats, request_dropped for duplicates caught in
    Redis, and DUPEFILTER_DEBUG lines with the referer."""
    site = demo_site(pages=5)
    redis_client.lpush("twoway:start_urls", site.url + "/page/1", site.url + "/page/2")
    runner = AsyncCrawlerRunner(
        crawl_settings(
            redis_url, DUPEFILTER_DEBUG=True, DISTCRAWL_LOCAL_SEEN_CACHE=0, LOG_LEVEL="DEBUG"
        )
    )
    crawler = runner.create_crawler(TwoWaySpider)
    dropped: list[str] = []
    lengths: list[int] = []

    def on_dropped(request, spider):
        dropped.append(request.url)

    def on_scheduled(request, spider):
        lengths.append(len(crawler.engine._slot.scheduler))

    crawler.signals.connect(on_dropped, signal=signals.request_dropped, weak=False)
    crawler.signals.connect(on_scheduled, signal=signals.request_scheduled, weak=False)
    with caplog.at_level(logging.DEBUG, logger="distcrawl.dupefilter"):
        await run(crawler.crawl_async())
    stats = crawler.stats.get_stats()
    assert sorted(set(fetched(site))) == ["/page/1", "/page/2", "/page/3"]
    # 3 pages of 3 links, one of them new: with no local cache every duplicate is caught
    # in Redis, and each is dropped, counted and logged as Scrapy's own filter would
    assert len(dropped) == 8 and stats["dupefilter/filtered"] == 8
    assert stats["scheduler/enqueued"] == stats["scheduler/enqueued/redis"] == 9
    assert stats["scheduler/dequeued"] == stats["scheduler/dequeued/redis"] == 3
    lines = [r.getMessage() for r in caplog.records if "Filtered duplicate" in r.getMessage()]
    assert len(lines) == 8 and all("(referer: http" in line for line in lines)
    assert lengths and all(isinstance(n, int) and n >= 0 for n in lengths)


@pytest_twisted.ensureDeferred
async def test_base_dupefilter_turns_the_shared_seen_set_off(redis_url, redis_client, demo_site):
    site = demo_site(pages=5)
    redis_client.lpush("twoway:start_urls", site.url + "/page/1")
    crawler = await crawl(
        TwoWaySpider,
        redis_url,
        DUPEFILTER_CLASS="scrapy.dupefilters.BaseDupeFilter",
        DEPTH_LIMIT=1,
    )
    assert crawler.stats.get_value("dupefilter/filtered") is None
    assert redis_client.scard("twoway:seen") == 0
    # /page/1 again, /page/2, /page/3: nothing filtered
    assert sorted(fetched(site)) == ["/page/1", "/page/1", "/page/2", "/page/3"]


def test_a_foreign_dupefilter_is_a_configuration_error_naming_the_setting(redis_url):
    from scrapy.utils.test import get_crawler

    from distcrawl.config._convert import ConfigError

    crawler = get_crawler(
        TwoWaySpider,
        crawl_settings(redis_url, DUPEFILTER_CLASS="scrapy.dupefilters.RFPDupeFilter"),
    )
    with pytest.raises(
        ConfigError, match=re.escape("DUPEFILTER_CLASS='scrapy.dupefilters.RFPDupeFilter'")
    ):
        Scheduler.from_crawler(crawler)
    # Scrapy's default left in place (no add-on, no project value) means distcrawl's own
    plain = get_crawler(TwoWaySpider, {"REDIS_URL": redis_url})
    assert Scheduler.from_crawler(plain).df is not None


@pytest_twisted.ensureDeferred
async def test_a_download_slot_that_cannot_be_a_slot_is_dead_lettered(
    redis_url, redis_client, demo_site
):
    site = demo_site(pages=10)
    redis_client.lpush("badslot:start_urls", site.url + "/page/1")
    crawler = await crawl(BadSlotSpider, redis_url)
    assert sorted(set(fetched(site))) == ["/page/1", "/page/4"]
    reasons = sorted(json.loads(r)["reason"] for r in redis_client.lrange("badslot:dead", 0, -1))
    assert reasons == [
        "invalid download slot: slot contains NUL",
        "invalid download slot: slot over 255 bytes",
    ]
    assert crawler.stats.get_value("distcrawl/invalid_slot") == 2
    assert redis_client.hlen("badslot:inflight") == 0


@pytest_twisted.ensureDeferred
async def test_a_10_mb_start_url_entry_leaves_a_64_kb_dead_letter(
    redis_url, redis_client, demo_site
):
    site = demo_site(pages=3)
    huge = b"http://127.0.0.1/" + b"x" * 10_000_000
    redis_client.lpush("site:start_urls", huge, site.url + "/page/1")
    await crawl(SiteSpider, redis_url, DEPTH_LIMIT=0)
    (raw,) = redis_client.lrange("site:dead", 0, -1)
    record = json.loads(raw)
    assert "too large" in record["reason"]
    assert record["raw_length"] == len(huge) and record["truncated"] is True
    assert len(raw) < 70_000
    assert redis_client.llen("site:start_urls") == 0


def test_an_idle_worker_makes_about_one_round_trip_a_second_and_still_picks_up_work(
    demo_site, workers, redis_client
):
    """Its lease poll, the reclaim, the liveness beat and the monitor's heartbeat go in one
    pipeline about once a second (on 0.2.x it made about nine round trips a second); a start
    URL pushed meanwhile is still taken within about one poll."""
    site = demo_site(pages=3, links=1)
    worker = workers(1, ROBOTSTXT_OBEY=False)
    assert worker.wait_for_log("Frontier: "), worker.log()
    time.sleep(3.0)  # past the first polls' back-off

    def reads() -> tuple[int, int]:
        info = redis_client.info("all")
        return int(info["total_reads_processed"]), int(info["cmdstat_evalsha"]["calls"])

    seconds = 5.0
    reads0, scripts0 = reads()
    time.sleep(seconds)
    reads1, scripts1 = reads()
    round_trips = (reads1 - reads0 - 1) / seconds  # less the second INFO
    assert round_trips <= 1.6, round_trips
    # per poll: the lease, the start_urls claim, the beat; the reclaim and sweep every 2 s
    assert (scripts1 - scripts0) / seconds <= 4.5
    assert redis_client.zscore("site:alive", worker_tag(redis_client)) is not None
    pushed = time.monotonic()
    redis_client.lpush("site:start_urls", site.url + "/")
    while redis_client.llen("site:start_urls") and time.monotonic() - pushed < 10:
        time.sleep(0.01)
    assert time.monotonic() - pushed < 3.0, "an idle worker took too long to pick up a URL"
    deadline = time.monotonic() + 30
    while set(fetched(site)) != site.expected_pages() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(fetched(site)) == site.expected_pages(), worker.log()[-3000:]


def test_an_idle_worker_is_woken_by_another_workers_commit(demo_site, workers, redis_client):
    """Work one worker discovers reaches a worker idle for long (its poll backed off to the
    longest) through the wake-up list, not at its next poll: its stats count the wake-ups
    and it fetches part of the crawl."""
    site = demo_site(pages=200, delay=0.05)
    idle = workers(1, DISTCRAWL_IDLE_TIMEOUT=3, DISTCRAWL_IDLE_POLL_MAX=30)
    assert idle.wait_for_log("Frontier: "), idle.log()
    time.sleep(2.0)  # its poll is now a long wait in Redis
    busy = workers(2, DISTCRAWL_IDLE_TIMEOUT=3)
    redis_client.lpush("site:start_urls", site.url + "/")
    for w in (idle, busy):
        assert w.wait(120) == 0, w.log()[-3000:]
    assert set(fetched(site)) == site.expected_pages()
    assert stat(idle, "distcrawl/idle/woken") + stat(busy, "distcrawl/idle/woken") >= 1
    agents = Counter(line.user_agent for line in site.read_log())
    assert agents[worker_agent(1)] > 0 and agents[worker_agent(2)] > 0, agents


def worker_tag(client) -> bytes:
    (tag,) = client.zrange("site:alive", 0, -1)
    return tag
