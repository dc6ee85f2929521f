"""Retries that wait in Redis, dead letters and re-drive, with real workers and a real site."""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from email.utils import formatdate

import pytest
import pytest_twisted

from distcrawl import cli
from distcrawl.codec.politeness import parse_retry_after
from distcrawl.config.backoff import RetrySettings
from distcrawl.demo.site import DemoSite
from distcrawl.spiders import RedisSpider
from tests.support import page_fetches, stat, wait_until
from tests.test_scheduler import crawl

FAST_BACKOFF = {
    "DISTCRAWL_RETRY_BACKOFF_BASE": 1.0,
    "DISTCRAWL_RETRY_BACKOFF_FACTOR": 2.0,
    "DISTCRAWL_RETRY_JITTER": 0.2,
}


def attempt_times(site: DemoSite) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    for line in site.read_log():
        if line.path.startswith("/page/") or line.path == "/":
            times[line.path].append(line.time)
    return times


def test_backoff_grows_is_capped_and_jittered():
    retry = RetrySettings(1, 2, 10, 0.2, 600)
    low = [retry.delay(n, rng=lambda: 0.0) for n in (1, 2, 3)]
    assert low == pytest.approx([0.8, 1.6, 3.2])
    assert [retry.delay(n, rng=lambda: 1.0) for n in (1, 2, 3)] == pytest.approx([1.2, 2.4, 4.8])
    assert retry.delay(10, rng=lambda: 1.0) == pytest.approx(12.0)  # the cap, jittered
    # Retry-After wins over a shorter backoff, but is capped
    assert retry.delay(1, retry_after=30, rng=lambda: 0.0) == 30
    assert retry.delay(1, retry_after=10_000, rng=lambda: 0.0) == 600


def test_parse_retry_after():
    assert parse_retry_after(b"120") == 120
    now = time.time()
    assert parse_retry_after(formatdate(now + 60, usegmt=True), now=now) == pytest.approx(60, abs=1)
    assert parse_retry_after(b"soon") is None
    assert parse_retry_after(None) is None


HOUR = 3600.0
SENT = 1_790_000_000.0  # the site's clock when it answered


def test_a_retry_after_date_is_read_against_the_answers_own_date():
    """The date and the Date header are the same server's clock: whatever clock the caller
    passes (an hour off either way) does not change the wait."""
    when, date = formatdate(SENT + 5, usegmt=True), formatdate(SENT, usegmt=True)
    for now in (SENT - HOUR, SENT, SENT + HOUR):
        assert parse_retry_after(when, now, date=date) == 5
    assert parse_retry_after(when.encode(), date=date.encode()) == 5
    # a date already past, by the server's clock, asks for no wait
    assert parse_retry_after(formatdate(SENT - 30, usegmt=True), date=date) == 0
    # delta-seconds ignore the Date header
    assert parse_retry_after(b"7", SENT + HOUR, date=date) == 7


def test_a_retry_after_date_without_a_usable_date_header_falls_back_to_the_given_clock():
    when = formatdate(SENT + 5, usegmt=True)
    for date in (None, b"", b"yesterday", "  "):
        assert parse_retry_after(when, SENT, date=date) == 5
        assert parse_retry_after(when, SENT + 2, date=date) == 3
    assert parse_retry_after("Mon, 99 Foo 2026 25:61:00 GMT", SENT) is None


def test_server_clock_is_what_the_last_lease_said_carried_on(monkeypatch):
    from distcrawl.codec.politeness import ServerClock

    clock = ServerClock()
    assert clock.now() is None  # no lease yet: callers fall back to this host's clock
    ticks = iter([100.0, 102.5])
    monkeypatch.setattr(time, "monotonic", lambda: next(ticks))
    clock.learn(int(SENT * 1000))
    assert clock.now() == pytest.approx(SENT + 2.5)
    clock.learn(0)  # a reply without the server's time teaches nothing
    assert clock._at == (SENT, 100.0)


def test_the_slot_hold_and_the_retry_delay_read_the_answers_date():
    """Both readers of Retry-After (the slot's hold, FeedbackBuffer; the retry's delay,
    retry_after_of) take the date against the answer's Date, not this host's clock."""
    from scrapy import Request
    from scrapy.http import HtmlResponse
    from scrapy.settings import Settings

    from distcrawl.codec.politeness import FeedbackBuffer, ServerClock, retry_after_of
    from distcrawl.config import DistcrawlConfig
    from distcrawl.model.records import Feedback

    real = time.time()
    headers = {
        "Retry-After": formatdate(real + 3605, usegmt=True),
        "Date": formatdate(real + 3600, usegmt=True),  # the site's clock is an hour ahead
    }
    request = Request("http://a.test/x")
    response = HtmlResponse(request.url, status=429, headers=headers, request=request)
    assert retry_after_of(response) == 5
    assert retry_after_of(response, now=real - HOUR) == 5
    buffer = FeedbackBuffer(DistcrawlConfig.from_settings(Settings()), ServerClock())
    assert buffer.add(request, response)
    assert buffer.drain() == [Feedback("a.test", 0, 0, 1, 5000)]
    # no Date header: the server clock the buffer was given, once a lease told it
    del response.headers[b"Date"]
    clock = ServerClock()
    clock.learn(int((real + 3600) * 1000))
    buffer = FeedbackBuffer(DistcrawlConfig.from_settings(Settings()), clock)
    assert buffer.add(request, response)
    ((_, _, _, _, hold_ms),) = buffer.drain()
    assert 4000 <= hold_ms <= 5000
    # ... capped by DISTCRAWL_RETRY_AFTER_MAX, the cap the retry's delay has too
    capped = DistcrawlConfig.from_settings(Settings({"DISTCRAWL_RETRY_AFTER_MAX": 2}))
    buffer = FeedbackBuffer(capped, clock)
    assert buffer.add(request, response)
    assert buffer.drain()[0].retry_after_ms == 2000


@pytest.mark.parametrize(("mode", "shards"), [("503", 1), ("drop", 1), ("503", 4)])
def test_transient_failures_are_retried_with_backoff_and_nothing_is_lost(
    mode, shards, demo_site, workers, redis_client
):
    site = demo_site(pages=150, fail_rate=0.1, fail_times=2, fail_mode=mode)
    redis_client.lpush("site:start_urls", site.url + "/")
    # the site's 503s stand for failures of single pages here, not for an overloaded host:
    # the host-wide slow-down they cause by default (test_politeness) would stretch the
    # retries' timing this test measures
    settings = {
        "DISTCRAWL_IDLE_TIMEOUT": 5,
        "DISTCRAWL_THROTTLE_HTTP_CODES": "429",
        "DISTCRAWL_SHARDS": shards,
    }
    pool = [workers(i, **settings, **FAST_BACKOFF) for i in (1, 2)]
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]

    assert set(page_fetches(site)) == site.expected_pages()  # every page, in the end
    assert redis_client.llen("site:dead") == 0
    failing = {p: t for p, t in attempt_times(site).items() if len(t) > 1}
    assert len(failing) >= 5  # ~10% of 151 pages, each failing twice
    for path, times in failing.items():
        assert len(times) == 3, (path, times)  # two failures, then the success
        for n, (before, after) in enumerate(itertools.pairwise(times), 1):
            backoff = 2 ** (n - 1)  # base 1 s, factor 2, +-20% jitter
            # never before it is due; after that a retry waits its turn in the queue
            # (RETRY_PRIORITY_ADJUST=-1 puts it behind the pending pages), hence the loose
            # upper bound
            assert 0.75 * backoff <= after - before <= 1.2 * backoff + 10.0, (path, times)
    # every failure's retry waited in Redis (the shared delayed set) and was moved into the
    # shared queue when due, by whichever worker leased then. (The site's log cannot say
    # which worker fetched a retry: a retried request keeps the User-Agent header the first
    # worker's UserAgentMiddleware set, as in Scrapy.)
    failures = sum(len(times) - 1 for times in failing.values())
    assert sum(stat(w, "distcrawl/retry/scheduled") for w in pool) == failures
    assert sum(stat(w, "distcrawl/retry/due") for w in pool) == failures


def test_a_page_that_always_fails_is_dead_lettered_and_can_be_redriven(
    demo_site, workers, redis_client, redis_url, capsys
):
    site = demo_site(pages=5)
    redis_client.lpush("site:start_urls", site.url + "/broken/1")
    worker = workers(1, DISTCRAWL_IDLE_TIMEOUT=2, RETRY_TIMES=2, **FAST_BACKOFF)
    assert worker.wait(60) == 0, worker.log()[-3000:]
    tries = [line for line in site.read_log() if line.path == "/broken/1"]
    assert len(tries) == 3  # 1 + RETRY_TIMES
    (record,) = [json.loads(r) for r in redis_client.lrange("site:dead", 0, -1)]
    assert record["source"] == "retry"
    assert record["attempts"] == 3 and record["status"] == 503
    assert "503" in record["reason"] and record["url"].endswith("/broken/1")
    assert [e["status"] for e in record["errors"]] == [503, 503, 503]
    assert record["worker"] and record["time"]

    assert cli.main(["--redis-url", redis_url, "dead", "redrive", "site", "--error", "503"]) == 0
    assert "re-drove 1" in capsys.readouterr().out
    assert redis_client.llen("site:dead") == 0
    assert redis_client.zcard("site:queue") == 1
    again = workers(2, DISTCRAWL_IDLE_TIMEOUT=2, RETRY_TIMES=2, **FAST_BACKOFF)
    assert again.wait(60) == 0
    tries = [line for line in site.read_log() if line.path == "/broken/1"]
    assert len(tries) == 6  # a fresh attempt count after the re-drive
    assert redis_client.llen("site:dead") == 1


def test_redrive_filters_by_domain_and_error(redis_url, redis_client, capsys):
    from distcrawl.model.deadrecord import dead_letter

    redis_client.lpush(
        "site:dead",
        dead_letter("gave up after 3 attempts: 503", url="http://a.test/x", source="retry"),
        dead_letter("gave up after 3 attempts: 500", url="http://b.test/y", source="retry"),
        dead_letter("invalid JSON: ...", raw=b'{"url": ', source="start_urls"),
    )
    assert (
        cli.main(["--redis-url", redis_url, "dead", "redrive", "site", "--domain", "b.test"]) == 0
    )
    assert redis_client.llen("site:dead") == 2
    assert redis_client.zcard("site:queue") == 1
    assert (
        cli.main(["--redis-url", redis_url, "dead", "redrive", "site", "--source", "start_urls"])
        == 0
    )
    assert redis_client.lrange("site:start_urls", 0, -1) == [b'{"url": ']
    assert (
        cli.main(["--redis-url", redis_url, "dead", "redrive", "site", "--error", "nothing"]) == 0
    )
    assert redis_client.llen("site:dead") == 1


def test_redrive_of_a_long_list_goes_page_by_page_and_keeps_the_rest_in_order(
    redis_url, redis_client, capsys, monkeypatch
):
    from distcrawl.codec import deadletter
    from distcrawl.model.deadrecord import dead_letter
    from distcrawl.model.frontier import Frontier

    letters = [
        dead_letter(f"gave up: {500 + i % 2}", url=f"http://a.test/{i}", source="retry")
        for i in range(2_000)
    ]
    redis_client.lpush("site:dead", *letters)  # the last is the newest
    calls: list[int] = []
    real = Frontier.redrive

    def counted(self, moves):
        calls.append(len(moves))
        return real(self, moves)

    monkeypatch.setattr(Frontier, "redrive", counted)
    assert cli.main(["--redis-url", redis_url, "dead", "redrive", "site", "--error", "501"]) == 0
    assert "re-drove 1000 dead letters" in capsys.readouterr().out
    # one script call per page of records read, each with that page's matches only
    assert len(calls) == 2_000 // deadletter.PAGE and max(calls) == deadletter.PAGE // 2
    assert redis_client.zcard("site:queue") == 1_000
    kept = redis_client.lrange("site:dead", 0, -1)
    assert kept == [x.encode() if isinstance(x, str) else x for x in letters[-2::-2]]


class PoisonSpider(RedisSpider):
    name = "poison"

    def parse(self, response, **kwargs):
        if response.url.endswith("/page/1"):
            raise ValueError("cannot parse this page")
        yield {"url": response.url}


@pytest_twisted.ensureDeferred
async def test_poison_callback_is_retried_a_bounded_number_of_times(
    redis_url, redis_client, demo_site
):
    site = demo_site(pages=5)
    redis_client.lpush("poison:start_urls", site.url + "/page/1", site.url + "/page/2")
    crawler = await crawl(
        PoisonSpider,
        redis_url,
        DISTCRAWL_CALLBACK_RETRIES=2,
        DISTCRAWL_IDLE_TIMEOUT=2,
        DISTCRAWL_RETRY_BACKOFF_BASE=0.3,
    )
    tries = [line for line in site.read_log() if line.path == "/page/1"]
    assert len(tries) == 3  # the first try and two retries, then no more
    (record,) = [json.loads(r) for r in redis_client.lrange("poison:dead", 0, -1)]
    assert record["source"] == "callback" and record["attempts"] == 3
    assert "ValueError: cannot parse this page" in record["reason"]
    assert "raise ValueError" in record["traceback"]
    assert crawler.stats.get_value("distcrawl/retry/callback") == 2
    assert crawler.stats.get_value("item_scraped_count") == 1  # the good page was not held up
    assert redis_client.zcard("poison:delayed") == redis_client.zcard("poison:leases") == 0


def wait_for_pages(site: DemoSite, count: int, timeout: float = 60) -> None:
    assert wait_until(lambda: len(page_fetches(site)) >= count, timeout=timeout)


@pytest.mark.parametrize("shards", [1, 4])
def test_redis_restart_mid_crawl_loses_nothing(shards, demo_site, tmp_path):
    from distcrawl.model.keys import FrontierKeys
    from distcrawl.testing.redis_server import RedisServer
    from distcrawl.testing.workers import Worker

    site = demo_site(pages=500, delay=0.05)
    with RedisServer(directory=tmp_path / "aof", appendonly=True) as server:
        server.client().lpush("site:start_urls", site.url + "/")
        pool = [
            Worker(
                i,
                redis_url=server.url,
                log_path=tmp_path / f"w{i}.log",
                settings={"DISTCRAWL_IDLE_TIMEOUT": 5, "DISTCRAWL_SHARDS": shards},
            ).start()
            for i in (1, 2)
        ]
        try:
            wait_for_pages(site, 120)
            server.restart()
            restarted_at = time.time()
            for w in pool:
                assert w.wait(180) == 0, w.log()[-3000:]
            fetched = page_fetches(site, ok_only=False)
            duplicates = sum(n - 1 for n in fetched.values())
            print(
                f"redis restart: {duplicates} duplicates, "
                f"{len(site.expected_pages() - set(page_fetches(site)))} missing"
            )
            assert set(page_fetches(site)) == site.expected_pages()
            assert any(line.time > restarted_at for line in site.read_log())
            client = server.client()
            crawl = FrontierKeys("site").sharded(shards)
            for keys in [crawl.of_shard(i) for i in range(shards)]:
                assert client.zcard(keys.queue) == client.zcard(keys.leases) == 0
        finally:
            for w in pool:
                w.stop()


def test_redis_down_for_ten_seconds_workers_survive_and_finish(demo_site, tmp_path):
    from distcrawl.testing.redis_server import RedisServer
    from distcrawl.testing.workers import Worker

    site = demo_site(pages=400, delay=0.05)
    with RedisServer(directory=tmp_path / "aof", appendonly=True) as server:
        server.client().lpush("site:start_urls", site.url + "/")
        pool = [
            Worker(
                i,
                redis_url=server.url,
                log_path=tmp_path / f"w{i}.log",
                settings={"DISTCRAWL_IDLE_TIMEOUT": 5, "DISTCRAWL_LEASE_TIMEOUT": 30},
            ).start()
            for i in (1, 2)
        ]
        try:
            wait_for_pages(site, 100)
            server.stop()
            time.sleep(10)
            for w in pool:
                assert w.alive(), w.log()[-3000:]
                assert "Redis unreachable" in w.log()  # said clearly, once
            server.restart()  # same port, same AOF
            for w in pool:
                assert w.wait(180) == 0, w.log()[-3000:]
            assert set(page_fetches(site)) == site.expected_pages()
            for w in pool:
                assert "Redis is reachable again" in w.log()
            client = server.client()
            assert client.zcard("site:queue") == client.zcard("site:leases") == 0
        finally:
            for w in pool:
                w.stop()
