"""A slot a site asked to wait for (429/503 with Retry-After), held back by every worker at
once (engine/holds.py): the messages, the worker's leases, the subscription on a real Redis,
and real crawls in which nothing of the slot is sent once a worker knows of the wait."""

from __future__ import annotations

import re
import time

import pytest
import pytest_twisted
from scrapy import Request, signals
from scrapy.crawler import AsyncCrawlerRunner

from distcrawl.codec.politeness import MAX_SLOT, FeedbackBuffer, Hold, parse_hold
from distcrawl.engine._batch_types import LeasedRequest
from distcrawl.engine.leases import Leases
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import LeaseRef
from distcrawl.spiders.site import SiteSpider
from tests.support import Heard, crawl_settings, fetched, run, wait_until

SITE = FrontierKeys("site")


# ---------------------------------------------------------------------- the message


def test_a_hold_goes_through_its_message():
    hold = Hold("a.test:8080", 3000)
    assert parse_hold(hold.message(), 600_000) == hold
    assert parse_hold(hold.message().encode(), 600_000) == hold
    # capped as commit.lua caps Retry-After (DISTCRAWL_RETRY_AFTER_MAX)
    assert parse_hold(hold.message(), 1000) == Hold("a.test:8080", 1000)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b'"a.test"',
        b'{"slot": "a.test"}',
        b'{"ms": 1000}',
        b'{"slot": "", "ms": 1000}',
        b'{"slot": 7, "ms": 1000}',
        b'{"slot": "a.test", "ms": "1000"}',
        b'{"slot": "a.test", "ms": true}',
        b'{"slot": "a.test", "ms": 0}',
        b'{"slot": "a.test", "ms": -5}',
        b'{"slot": "a.test", "ms": 1.5}',
        b"\xff\xfe",
        ('{"slot": "%s", "ms": 1000}' % ("x" * (MAX_SLOT + 1))).encode(),
        b"{" * 100_000,
        None,
        12,
    ],
)
def test_anything_but_a_hold_is_refused(data):
    assert parse_hold(data, 600_000) is None


def test_the_hold_of_an_answer_is_its_capped_retry_after_on_its_slot():
    from scrapy.http import HtmlResponse
    from scrapy.settings import Settings

    from distcrawl.config import DistcrawlConfig

    config = DistcrawlConfig.from_settings(Settings({"DISTCRAWL_RETRY_AFTER_MAX": 60}))
    buffer = FeedbackBuffer(config)

    def hold_of(status, headers=None):
        request = Request("http://a.test:8080/x")
        response = HtmlResponse(request.url, status=status, headers=headers, request=request)
        return buffer.hold_of(request, response)

    assert hold_of(429, {"Retry-After": "3"}) == Hold(
        "a.test", 3000
    )  # the slot is the host (Scrapy's)
    assert hold_of(503, {"Retry-After": "3600"}) == Hold("a.test", 60_000)
    assert hold_of(429) is None  # no Retry-After: Redis' adaptive delay alone
    assert hold_of(429, {"Retry-After": "0"}) is None
    assert hold_of(200, {"Retry-After": "3"}) is None


# ---------------------------------------------------------------------- the worker's leases


def leased(i: int, slot: str, *, reserve: bool = False) -> LeasedRequest:
    ref = LeaseRef(f"id{i}", b"t" * 16)
    return LeasedRequest(
        ref=ref,
        slot=slot,
        request=Request(f"http://{slot}/{i}"),
        reserve=reserve,
        paced=False,
        payload=b"",
        error="",
    )


def test_a_held_slots_waiting_requests_are_given_back_and_no_reserve_takes_a_place():
    leases = Leases()
    for item in (
        leased(1, "a.test"),
        leased(2, "a.test"),
        leased(3, "b.test"),
        leased(4, "a.test", reserve=True),
        leased(5, "b.test", reserve=True),
    ):
        leases.add(item, 0)
    sent = leases.hand_out()
    assert sent is not None and sent.url == "http://a.test/1"

    assert leases.hold("a.test", 3.0) == 2  # the ready one and the reserve, not the sent one
    assert leases.holding("a.test") and not leases.holding("b.test")
    assert sorted(ref.id for ref in leases.take_given_back()) == ["id2", "id4"]
    assert leases.take_given_back() == []
    # what is left: b.test's ready request and reserve; a.test's sent one leaves the
    # downloader and its place goes free, no reserve of a.test takes it
    assert leases.left(sent) is False
    assert leases.unreported == 1
    nxt = leases.hand_out()
    assert nxt is not None and nxt.url == "http://b.test/3"
    assert leases.hand_out() is None
    # leased before Redis held the slot, or before this worker heard: given back too
    leases.add(leased(6, "a.test"), 0)
    leases.add(leased(7, "a.test", reserve=True), 0)
    assert leases.ready == 0
    assert [ref.id for ref in leases.take_given_back()] == ["id6", "id7"]
    # a shorter hold of the same slot changes nothing (nothing to publish); a close gives
    # back what waits
    assert leases.hold("a.test", 1.0) is None
    leases.add(leased(8, "a.test"), 0)
    assert "id8" in {ref.id for ref in leases.release_all()}


def test_a_hold_ends():
    leases = Leases()
    leases.hold("a.test", 0.05)
    assert leases.holding("a.test")
    time.sleep(0.06)
    assert not leases.holding("a.test")
    leases.add(leased(1, "a.test"), 0)
    assert leases.ready == 1 and leases.take_given_back() == []
    # ended holds of slots never read again are not kept for ever
    for i in range(100):
        leases.hold(f"h{i}.test", 0.01)
    time.sleep(0.02)
    leases.hold("b.test", 1.0)
    assert leases._holds.keys() == {"b.test"}


# ---------------------------------------------------------------------- the subscription


@pytest.mark.valkey
def test_the_listener_hears_holds_and_ignores_the_rest(redis_url, redis_client, caplog):
    heard = Heard(redis_url, SITE.holds)
    listener = heard.listener
    try:
        assert listener.subscribed.wait(10)
        assert redis_client.pubsub_numsub(SITE.holds) == [(SITE.holds.encode(), 1)]
        redis_client.publish(SITE.holds, b"garbage")
        redis_client.publish("other:holds", Hold("b.test", 1000).message())
        redis_client.publish(SITE.holds, Hold("a.test", 3_600_000).message())
        assert heard.got.wait(10)
        assert heard.holds == [Hold("a.test", 60_000)]
        assert listener.ignored == 1
        assert "not a hold" in caplog.text
        # a flood is counted, its log lines are not: the 1st, 10th, 100th...
        for _ in range(99):
            redis_client.publish(SITE.holds, b"garbage")
        assert wait_until(lambda: listener.ignored == 100, timeout=10)
        assert caplog.text.count("not a hold") == 3
    finally:
        listener.stop()
    assert wait_until(lambda: redis_client.pubsub_numsub(SITE.holds)[0][1] == 0, timeout=10)


@pytest.mark.valkey
def test_the_listener_subscribes_again_after_an_outage(redis_server, redis_client, caplog):
    heard = Heard(redis_server.url, SITE.holds)
    listener = heard.listener
    try:
        assert listener.subscribed.wait(10)
        redis_client.client_kill_filter(_type="pubsub")
        assert wait_until(lambda: not listener.subscribed.is_set(), timeout=10)
        assert listener.subscribed.wait(10)
        assert wait_until(lambda: redis_client.pubsub_numsub(SITE.holds)[0][1] == 1, timeout=10)
        redis_client.publish(SITE.holds, Hold("a.test", 1000).message())
        assert wait_until(lambda: heard.holds == [Hold("a.test", 1000)], timeout=10)
    finally:
        listener.stop()
    assert "Cannot hear other workers' holds" in caplog.text


def test_a_user_refused_the_channel_is_told_once_and_not_retried(
    redis_server, redis_client, caplog
):
    """A worker ACL user made before the holds channel was granted (distcrawl acl): the
    subscription is refused, said once, and not tried again every second."""
    redis_client.acl_setuser(
        "old-worker",
        enabled=True,
        passwords=["+pw-Kx3"],
        keys=["*"],
        commands=["+@all"],
        reset_channels=True,
    )
    url = redis_server.url.replace("redis://", "redis://old-worker:pw-Kx3@", 1)
    heard = Heard(url, SITE.holds)
    try:
        assert wait_until(lambda: heard.listener.refused, timeout=10)
        time.sleep(2.5)  # RETRY_AFTER is 1 s: a retry loop would be refused again by now
        refusals = [e for e in redis_client.acl_log() if e.get("username") == "old-worker"]
        assert len(refusals) == 1, refusals
        assert refusals[0]["count"] == 1
    finally:
        heard.stop()
    assert caplog.text.count("may not subscribe") == 1
    assert "pw-Kx3" not in caplog.text


# ---------------------------------------------------------------------- crawls


@pytest_twisted.ensureDeferred
async def test_nothing_of_the_slot_reaches_the_downloader_once_a_429_is_read(
    redis_url, redis_client, demo_site
):
    """The worker that reads a 429 with Retry-After sends nothing more of its slot until
    the wait is over: no request waiting here, no reserve taking the 429's place (the
    request leaves the downloader just after), nothing of a lease already on its way."""
    site = demo_site(pages=40, links=3, host="127.0.0.2", throttle_at=12, retry_after=2)
    redis_client.lpush("site:start_urls", site.url + "/")
    settings = crawl_settings(
        redis_url,
        DISTCRAWL_DOMAIN_CONCURRENCY=4,
        DISTCRAWL_IDLE_TIMEOUT=4,
    )
    crawler = AsyncCrawlerRunner(settings).create_crawler(SiteSpider)
    answered: list[float] = []
    handed: list[tuple[float, str]] = []

    def on_answer(response, request, spider):
        if response.status == 429:
            answered.append(time.monotonic())

    def on_opened(spider):
        # what the scheduler hands the engine, when: its decisions, not the downloader's
        # (a request handed out earlier may reach the downloader a reactor turn later)
        scheduler = crawler.engine.scheduler
        next_request = scheduler.next_request

        def recorded():
            request = next_request()
            if request is not None:
                handed.append((time.monotonic(), request.url))
            return request

        scheduler.next_request = recorded

    crawler.signals.connect(on_answer, signal=signals.response_downloaded)
    crawler.signals.connect(on_opened, signal=signals.spider_opened)
    await run(crawler.crawl_async())

    assert sorted(set(fetched(site))) == sorted(site.expected_pages())
    (at,) = answered
    # before holds.py, 3-4 requests of the slot a run were handed out 2-4 ms after the 429
    early = [(round(t - at, 3), url) for t, url in handed if at < t < at + 2.0 - 0.05]
    assert early == [], early
    stats = crawler.stats.get_stats()
    assert stats.get("distcrawl/politeness/holds_published") == 1
    assert stats.get("distcrawl/politeness/holds_heard") == 1  # its own, from the channel


def test_every_worker_hears_a_429_another_read(demo_site, workers, redis_client):
    """Three workers subscribed before the crawl starts: the one that reads the 429
    publishes it, and each gives back what it holds of the slot (tests/test_politeness.py
    shows the site's side)."""
    site = demo_site(pages=40, links=3, host="127.0.0.2", throttle_at=12, retry_after=2)
    settings = {"DISTCRAWL_DOMAIN_CONCURRENCY": 4, "DISTCRAWL_IDLE_TIMEOUT": 4}
    pool = [workers(i, **settings) for i in (1, 2, 3)]
    assert wait_until(lambda: redis_client.pubsub_numsub(SITE.holds)[0][1] == 3, timeout=60)
    redis_client.lpush("site:start_urls", site.url + "/")
    for w in pool:
        assert w.wait(120) == 0, w.log()[-3000:]
    assert set(fetched(site)) >= site.expected_pages()

    def stat(log: str, name: str) -> int:
        found = re.findall(rf"'distcrawl/politeness/{name}': (\d+)", log)
        return int(found[-1]) if found else 0

    logs = [w.log() for w in pool]
    assert sum(stat(log, "holds_published") for log in logs) == 1
    assert [stat(log, "holds_heard") for log in logs] == [1, 1, 1]
