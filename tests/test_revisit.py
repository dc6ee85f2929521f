"""Revisits: the frontier's side (commit.lua's kind 'v', lease.lua's revisit queue and share)
against a real redis-server, and the middlewares' rules without a crawl."""

from __future__ import annotations

import datetime
import itertools
import json
import time

import pytest
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.settings import Settings
from scrapy.statscollectors import StatsCollector

from distcrawl.config._convert import ConfigError
from distcrawl.config.recrawl import Outcome, recrawl_settings
from distcrawl.demo.fresh import FRESH_INDEX, fresh_path, fresh_paths
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import LeaseRef
from distcrawl.model.records import Entry, EntryKind, Politeness
from distcrawl.revisit import (
    FETCH_META,
    STATE_META,
    RecrawlMiddleware,
    RevisitState,
    content_signature,
    judge,
)
from tests.support import page_fetches, stat, wait_until

SLOT = "t.test"


def frontier_with(redis_client, share: float = 0.5, **kwargs) -> Frontier:
    return Frontier(redis_client, FrontierKeys("t"), Politeness(revisit_share=share), **kwargs)


def revisit(fp: bytes, payload: bytes, delay_ms: int, slot: str = SLOT) -> Entry:
    return Entry(EntryKind.REVISIT, fp, 0, payload, str(delay_ms).encode(), slot)


def new(fp: bytes, payload: bytes, slot: str = SLOT) -> Entry:
    return Entry(EntryKind.REQUEST, fp, 0, payload, b"", slot)


def ack_all(frontier: Frontier, leased) -> None:
    frontier.commit([LeaseRef(x.id, x.token) for x in leased], [])


def test_a_revisit_waits_for_its_due_time_and_bypasses_the_seen_set(redis_client):
    frontier = frontier_with(redis_client)
    k = frontier.keys
    # the page was crawled: its fingerprint is seen
    assert frontier.commit([], [new(b"page", b"first")]).enqueued == 1
    ack_all(frontier, frontier.lease(10, 10_000).items)
    assert frontier.commit([], [revisit(b"page", b"again", 60_000)]).enqueued == 1
    assert redis_client.zcard(k.revisits) == 1
    assert frontier.lease(10, 10_000).items == []  # not due for a minute
    assert frontier.admin.sizes()["revisits"] == 1
    # due now: leased although its fingerprint is in the seen-set
    frontier.commit([], [revisit(b"page", b"now", 0)])
    leased = frontier.lease(10, 10_000).items
    assert [x.payload for x in leased] == [b"now"]
    assert redis_client.zcard(k.revisits) == 0
    assert redis_client.zcard(k.revisit_queue) == 0


def test_a_page_keeps_one_revisit_however_often_it_is_stored(redis_client):
    frontier = frontier_with(redis_client)
    k = frontier.keys
    for i in range(5):
        frontier.commit([], [revisit(b"page", b"v%d" % i, 60_000)])
    frontier.commit([], [revisit(b"other", b"o", 60_000)])
    assert redis_client.zcard(k.revisits) == 2
    assert redis_client.hlen(k.requests) == 2  # the replaced ones' records are gone
    (rid,) = [
        r
        for r in redis_client.zrange(k.revisits, 0, -1)
        if r != redis_client.hget(k.revisit_of, b"other")
    ]
    assert redis_client.hget(k.requests, rid).endswith(b"v4")


def test_a_negative_delay_forgets_the_page(redis_client):
    frontier = frontier_with(redis_client)
    k = frontier.keys
    frontier.commit([], [revisit(b"page", b"v", 60_000)])
    frontier.commit([], [revisit(b"page", b"", -1)])
    assert redis_client.zcard(k.revisits) == 0
    assert redis_client.hlen(k.requests) == 0
    assert redis_client.hlen(k.revisit_of) == 0


def test_a_revisit_needs_a_fingerprint(redis_client):
    frontier = frontier_with(redis_client)
    with pytest.raises(Exception, match="fingerprint"):
        frontier.commit([], [revisit(b"", b"v", 0)])


@pytest.mark.parametrize(("share", "expected"), [(0.25, 10), (0.5, 20), (0.0, 0), (1.0, 40)])
def test_a_turn_takes_the_share_of_revisits_while_new_urls_wait(redis_client, share, expected):
    frontier = frontier_with(redis_client, share)
    frontier.commit([], [new(b"n%d" % i, b"new") for i in range(100)])
    frontier.commit([], [revisit(b"r%d" % i, b"old", 0) for i in range(100)])
    leased = frontier.lease(40, 10_000).items
    assert len(leased) == 40
    assert sum(x.payload == b"old" for x in leased) == expected


def test_either_kind_takes_every_turn_when_the_other_is_empty(redis_client):
    frontier = frontier_with(redis_client, 0.0)
    frontier.commit([], [revisit(b"r%d" % i, b"old", 0) for i in range(5)])
    assert [x.payload for x in frontier.lease(10, 10_000).items] == [b"old"] * 5
    frontier = frontier_with(redis_client, 1.0)
    frontier.commit([], [new(b"n%d" % i, b"new") for i in range(5)])
    assert [x.payload for x in frontier.lease(10, 10_000).items] == [b"new"] * 5


def test_a_slot_of_one_request_a_turn_gives_revisits_their_share_of_turns(redis_client):
    frontier = Frontier(
        redis_client, FrontierKeys("t"), Politeness(concurrency=1, revisit_share=0.5)
    )
    frontier.commit([], [new(b"n%d" % i, b"new") for i in range(300)])
    frontier.commit([], [revisit(b"r%d" % i, b"old", 0) for i in range(300)])
    kinds = []
    for _ in range(200):
        leased = frontier.lease(5, 10_000).items
        assert len(leased) == 1  # concurrency 1: revisits take turns, never add to them
        kinds.append(leased[0].payload)
        ack_all(frontier, leased)
    assert 70 <= kinds.count(b"old") <= 130


def test_revisits_work_with_the_bloom_filter(redis_client):
    frontier = frontier_with(redis_client, seen="bloom", bloom_capacity=1000)
    frontier.commit([], [new(b"page", b"first")])
    ack_all(frontier, frontier.lease(10, 10_000).items)
    assert frontier.commit([], [new(b"page", b"dup")]).duplicates == 1
    frontier.commit([], [revisit(b"page", b"again", 0)])
    assert [x.payload for x in frontier.lease(10, 10_000).items] == [b"again"]


def test_a_waiting_revisit_is_work_to_come_for_idle_close(redis_client):
    frontier = frontier_with(redis_client)
    frontier.commit([], [revisit(b"page", b"v", 5_000)])
    drained = frontier.drained()
    assert drained.queued == 0 and drained.next_retry_ms is not None
    assert 0 < drained.next_retry_ms <= 5_000
    assert not drained.idle(within_ms=10_000)


def test_an_expired_revisit_lease_comes_back(redis_client):
    frontier = frontier_with(redis_client)
    frontier.commit([], [revisit(b"page", b"v", 0)])
    assert len(frontier.lease(10, 1).items) == 1
    time.sleep(0.02)
    assert frontier.requeue_expired().requeued == 1
    assert [x.payload for x in frontier.lease(10, 10_000).items] == [b"v"]


# -- the middlewares' rules --------------------------------------------------------------


def html(body: str, status: int = 200) -> HtmlResponse:
    return HtmlResponse(
        "http://t.test/p",
        status=status,
        body=body.encode(),
        encoding="utf-8",
        request=Request("http://t.test/p"),
    )


def test_the_signature_reads_the_text_not_the_markup_scripts_or_excluded_parts():
    a = html("<html><body><p>Hello <b>world</b></p><script>x=1</script></body></html>")
    b = html("<html><body><div><p>Hello</p> <i>world</i></div><script>x=2</script></body></html>")
    assert content_signature(a) == content_signature(b)
    c = html("<html><body><p>Hello</p><span class='ad'>buy 1</span> tail</body></html>")
    d = html("<html><body><p>Hello</p><span class='ad'>buy 2</span> tail</body></html>")
    assert content_signature(c) != content_signature(d)
    exclude = ("//*[@class='ad']",)
    assert content_signature(c, exclude) == content_signature(d, exclude)
    # the text after an excluded element still counts
    e = html("<html><body><p>Hello</p><span class='ad'>buy 2</span> other</body></html>")
    assert content_signature(c, exclude) != content_signature(e, exclude)
    # and the response itself is left as it came, for the callback
    assert c.xpath("//span[@class='ad']/text()").get() == "buy 1"


def test_judge():
    state = RevisitState("http://t.test/p", 60.0, etag='"1"', signature="a" * 32)
    assert judge(304, state, None) is Outcome.UNCHANGED
    assert judge(200, state, "a" * 32) is Outcome.UNCHANGED
    assert judge(200, state, "b" * 32) is Outcome.CHANGED
    assert judge(200, None, "a" * 32) is Outcome.CHANGED
    assert judge(404, state, None) is Outcome.GONE
    assert judge(410, None, None) is Outcome.GONE
    assert judge(500, state, None) is Outcome.ERROR


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("x", "expected a mapping, got str"),
        ({"url": "http://t.test/p"}, "no interval"),
        ({"url": "http://t.test/p", "interval": -1}, "interval -1 is not a positive number"),
        (
            {"url": "http://t.test/p", "interval": float("inf")},
            "interval inf is not a positive number",
        ),
        ({"url": "http://t.test/p", "interval": True}, "no interval"),
        (
            {"url": "http://t.test/p", "interval": 5, "etag": "x" * 600},
            "etag is not a short printable string",
        ),
        (
            {"url": "http://t.test/p", "interval": 5, "etag": "a\r\nSet-Cookie: x"},
            "etag is not a short printable string",
        ),
        (
            {"url": "http://t.test/p", "interval": 5, "signature": "zz"},
            "signature is not 32 hex digits",
        ),
        (
            {"url": "http://t.test/p", "interval": 5, "callback": "evil"},
            r"unknown fields \['callback'\]",
        ),
    ],
)
def test_a_state_read_from_redis_is_checked(bad, why):
    with pytest.raises(ValueError, match=why):
        RevisitState.from_meta(bad)


def test_a_state_round_trips():
    state = RevisitState("http://t.test/p", 90.0, '"e"', "Tue, 01 Dec 2026 10:00:00 GMT", "f" * 32)
    assert RevisitState.from_meta(state.to_meta()) == state


# -- real crawls ---------------------------------------------------------------------------

RECRAWL = {
    "DISTCRAWL_RECRAWL_INTERVAL": 1.0,
    "DISTCRAWL_RECRAWL_MIN_INTERVAL": 0.5,
    "DISTCRAWL_RECRAWL_MAX_INTERVAL": 4.0,
    "ROBOTSTXT_OBEY": False,
}


@pytest.mark.integration
@pytest.mark.parametrize("shards", [1, 4])
def test_a_worker_revisits_static_pages_less_and_less_often(
    shards, demo_site, workers, redis_client
):
    """The demo's pages never change: each is fetched again, with a growing interval; with
    4 shards too (each page's revisit lives in its site's shard)."""
    site = demo_site(pages=5, links=2)
    redis_client.lpush("site:start_urls", site.url + "/")
    worker = workers(1, DISTCRAWL_SHARDS=shards, **RECRAWL)
    time.sleep(9)
    worker.stop()
    log = worker.log()
    assert "ERROR" not in log, log[-3000:]
    times: dict[str, list[float]] = {}
    for line in site.read_log():
        if line.path in site.expected_pages() and line.status == 200:
            times.setdefault(line.path, []).append(line.arrived)
    assert set(times) == site.expected_pages()
    for path, seen in times.items():
        gaps = [b - a for a, b in itertools.pairwise(seen)]
        # 1 s, then 1.4 s, 1.96 s...: 4 or 5 fetches in 9 s, never two within half a second
        assert 3 <= len(seen) <= 6, (path, seen)
        assert min(gaps) > 0.6, (path, gaps)
        assert gaps[-1] > gaps[0], (path, gaps)
    # one revisit a page, however often it was fetched and linked again
    parts = [FrontierKeys("site").sharded(shards).of_shard(i) for i in range(shards)]
    assert sum(redis_client.hlen(k.revisit_of) for k in parts) == len(times)
    waiting = sum(
        redis_client.zcard(k.revisits) + redis_client.zcard(k.revisit_queue) for k in parts
    )
    assert waiting <= len(times)
    assert stat(worker, "distcrawl/recrawl/unchanged") >= 2 * len(times)


@pytest.mark.integration
@pytest.mark.serial  # a politeness gap: a starved worker's send lag shortens it (0.16 s seen)
def test_revisits_and_new_urls_of_a_slot_share_its_delay_and_concurrency(
    demo_site, workers, redis_client
):
    """Pages come due for revisits within half a second while most of the site is still
    new: the slot's delay holds across both kinds and two workers, and new URLs keep being
    crawled (DISTCRAWL_RECRAWL_SHARE: half the turns each while both wait)."""
    site = demo_site(pages=40, links=3, host="127.0.0.2")
    settings = {
        **RECRAWL,
        "DISTCRAWL_RECRAWL_INTERVAL": 0.5,
        "DOWNLOAD_SLOTS": json.dumps({"127.0.0.2": {"delay": 0.2, "concurrency": 1}}),
    }
    redis_client.lpush("site:start_urls", site.url + "/")
    pool = [workers(i, **settings) for i in (1, 2)]
    expected = site.expected_pages()
    assert wait_until(lambda: set(page_fetches(site)) >= expected, timeout=60)
    for w in pool:
        w.stop()
    log = sorted(
        (line for line in site.read_log() if line.path in expected), key=lambda x: x.arrived
    )
    smallest = min(b.arrived - a.arrived for a, b in itertools.pairwise(log))
    print(f"{len(log)} requests, smallest gap {smallest:.3f}s")
    assert smallest >= 0.19  # the delay, revisits and new URLs alike
    assert max(line.in_flight for line in log) == 1
    assert len({line.user_agent for line in log}) == 2
    # revisits ran while new URLs were still being found, and did not stop them
    first_fetch: dict[str, float] = {}
    for line in log:
        first_fetch.setdefault(line.path, line.arrived)
    last_new = max(first_fetch.values())
    revisits = [x for x in log if x.arrived > first_fetch[x.path] and x.arrived < last_new]
    news = len(expected)
    print(f"{len(revisits)} revisits while {news} new pages were crawled")
    assert len(revisits) >= 10
    # with half the turns each, new pages took at most about twice as long as alone
    assert len(revisits) <= 2 * news


FAST = {
    **RECRAWL,
    "DISTCRAWL_RECRAWL_INTERVAL": 1.5,
    "DISTCRAWL_RECRAWL_MIN_INTERVAL": 1.0,
    "DISTCRAWL_RECRAWL_MAX_INTERVAL": 8.0,
}


def fetch_times(site, paths) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {p: [] for p in paths}
    for line in site.read_log():
        if line.path in out and line.status in (200, 304):
            out[line.path].append(line.arrived)
    return out


@pytest.mark.integration
def test_no_revisit_is_lost_when_a_worker_is_killed(demo_site, workers, redis_client):
    """SIGKILL a worker while pages are being revisited: the revisits it held leased come
    back like any lease, and every page goes on being revisited by the other worker."""
    site = demo_site(pages=3, fresh_pages=4, fresh_fast=1.0)
    pages = [p for p in fresh_paths(4) if "/slow/" not in p]
    settings = {
        **FAST,
        "DISTCRAWL_LEASE_TIMEOUT": 3,
        "DISTCRAWL_HEARTBEAT_INTERVAL": 0.5,
        "DISTCRAWL_WORKER_TIMEOUT": 2,
    }
    redis_client.lpush("site:start_urls", site.url + FRESH_INDEX)
    victim, survivor = (workers(i, **settings) for i in (1, 2))
    assert wait_until(lambda: all(len(t) >= 2 for t in fetch_times(site, pages).values()), 30)
    victim.kill()
    killed = time.time()
    time.sleep(12)
    survivor.stop()
    after = {p: [t for t in ts if t > killed + 4] for p, ts in fetch_times(site, pages).items()}
    print({p: len(ts) for p, ts in after.items()})
    assert all(after.values()), after  # every page still revisited
    # one revisit chain per page: none lost, none doubled
    assert redis_client.hlen("site:revisit_of") == len(fresh_paths(4)) + 1  # and the index


@pytest.mark.integration
def test_a_continuous_crawl_revisits_what_changes_and_leaves_the_rest_alone(
    demo_site, mongo_workers, mongo_client, redis_client
):
    """About 30 s of crawling pages that change every second and pages that never change:
    the changing ones are fetched far more often; the others answer 304 to conditional
    revisits, and their MongoDB documents only get their fetch fields updated."""
    site = demo_site(pages=3, fresh_pages=3, fresh_fast=1.0)
    fast = [fresh_path("fast", i) for i in range(3)]
    never = [fresh_path("never", i) for i in range(3)]
    redis_client.lpush("site:start_urls", site.url + FRESH_INDEX)
    pool = [mongo_workers(i, **FAST) for i in (1, 2)]
    time.sleep(30)
    for w in pool:
        w.stop()
        assert "ERROR" not in w.log(), w.log()[-3000:]
    stats = site.fresh_stats()
    per_fast = [stats.of(p).ok + stats.of(p).not_modified for p in fast]
    per_never = [stats.of(p).ok + stats.of(p).not_modified for p in never]
    print(f"fetches of fast pages {per_fast}, of unchanged pages {per_never}")
    assert min(per_fast) >= 2 * max(per_never)
    assert min(per_never) >= 4  # revisited all the same, less and less often
    for p in never:
        assert stats.of(p).ok == 1, (p, stats.of(p))  # then only 304s
    docs = {d["url"]: d for d in mongo_client["distcrawl"]["site"].find()}
    for p in never:
        doc = docs[site.url + p]
        count = stats.of(p)
        # every answer recorded (the last one may still be in the pipeline's batch)
        assert (
            count.ok + count.not_modified - 1 <= doc["fetch_count"] <= count.ok + count.not_modified
        )
        assert doc["change_count"] == 0
        assert doc["first_seen"] == doc["last_changed"] < doc["last_fetched"]
        # the content was written once: the item's own fetch time is the first fetch's
        first_seen = doc["first_seen"].replace(tzinfo=datetime.timezone.utc).timestamp()
        assert abs(doc["fetched_at"] - first_seen) < 2
    for p in fast:
        doc = docs[site.url + p]
        assert doc["change_count"] >= 5
        assert doc["first_seen"] < doc["last_changed"]
        assert "version" in doc["text"]


# -- the downloader middleware's decisions (a stub scheduler records the revisits) --------


class StubScheduler:
    def __init__(self) -> None:
        self.revisits: list[tuple[Request, float | None]] = []

    def leased(self, request: Request) -> bool:
        return not request.meta.get("not_leased")

    def revisit(self, request: Request, delay: float | None) -> None:
        self.revisits.append((request, delay))


@pytest.fixture
def middleware(monkeypatch):
    from scrapy.utils.test import get_crawler

    from distcrawl import revisit as module

    def make(**settings):
        crawler = get_crawler(
            settings_dict={
                "DISTCRAWL_RECRAWL_INTERVAL": 100,
                "DISTCRAWL_RECRAWL_GONE_INTERVAL": 5000,
                "DISTCRAWL_RECRAWL_ERROR_INTERVAL": 50,
                **settings,
            }
        )
        crawler.stats = StatsCollector(crawler)
        stub = StubScheduler()
        monkeypatch.setattr(module, "scheduler_of", lambda _crawler: stub)
        return RecrawlMiddleware.from_crawler(crawler), stub

    return make


def answer(request: Request, status: int = 200, body: str = "<body>x</body>", **headers):
    return HtmlResponse(
        request.url, status=status, body=body.encode(), headers=headers, request=request
    )


def test_a_first_fetch_is_due_one_interval_later_with_its_validators(middleware):
    mw, stub = middleware()
    request = Request("http://a.test/p", meta={"retry_times": 2, "keep": 1})
    mw.process_request(request)
    assert b"If-None-Match" not in request.headers  # nothing known yet
    mw.process_response(request, answer(request, ETag='"v1"', **{"Last-Modified": "Tue"}))
    ((again, delay),) = stub.revisits
    assert delay == 100
    state = RevisitState.from_meta(again.meta[STATE_META])
    assert (state.interval, state.etag, state.last_modified) == (100, '"v1"', "Tue")
    assert again.dont_filter and again.meta["keep"] == 1 and "retry_times" not in again.meta
    # the revisit sends the validators, and a 304 keeps them and grows the interval
    mw.process_request(again)
    assert again.headers[b"If-None-Match"] == b'"v1"'
    mw.process_response(again, answer(again, 304, ""))
    (third, delay) = stub.revisits[1]
    assert delay == pytest.approx(140)
    assert RevisitState.from_meta(third.meta[STATE_META]).etag == '"v1"'
    # the headers it added are not carried into the next revisit's own
    assert b"If-None-Match" not in third.headers
    assert mw.stats.get_value("distcrawl/recrawl/not_modified") == 1


def test_a_changed_page_comes_back_sooner(middleware):
    mw, stub = middleware()
    state = RevisitState("http://a.test/p", 100.0, signature="0" * 32)
    request = Request("http://a.test/p", meta={STATE_META: state.to_meta()})
    mw.process_response(request, answer(request, body="<body>new</body>"))
    assert stub.revisits[0][1] == pytest.approx(80)
    assert request.meta[FETCH_META]["outcome"] == "changed"


def test_gone_and_errors_have_intervals_of_their_own(middleware):
    mw, stub = middleware()
    state = RevisitState("http://a.test/p", 100.0).to_meta()
    gone = Request("http://a.test/p", meta={STATE_META: dict(state)})
    mw.process_response(gone, answer(gone, 404))
    failed = Request("http://a.test/p", meta={STATE_META: dict(state)})
    mw.process_response(failed, answer(failed, 503))
    broken = Request("http://a.test/p", meta={STATE_META: dict(state)})
    mw.process_exception(broken, TimeoutError())
    assert [d for _, d in stub.revisits] == [5000, 50, 50]
    # the interval itself is kept: an error says nothing about how often the page changes
    assert {RevisitState.from_meta(r.meta[STATE_META]).interval for r, _ in stub.revisits} == {
        100.0
    }


def test_gone_may_mean_never(middleware):
    mw, stub = middleware(DISTCRAWL_RECRAWL_GONE_INTERVAL="never")
    request = Request(
        "http://a.test/p", meta={STATE_META: {"url": "http://a.test/p", "interval": 9}}
    )
    mw.process_response(request, answer(request, 410))
    assert [d for _, d in stub.revisits] == [None]  # forgets the page's revisit


def test_first_intervals_per_domain_and_per_request(middleware):
    mw, stub = middleware(
        DISTCRAWL_RECRAWL_DOMAINS={"news.test": 10, "archive.test": "never"},
        DISTCRAWL_RECRAWL_MIN_INTERVAL=5,
    )
    for url, meta in [
        ("http://www.news.test/a", {}),
        ("http://archive.test/b", {}),
        ("http://other.test/c", {"recrawl_after": 7}),
        ("http://other.test/d", {"recrawl_after": 1}),  # kept within the bounds
        ("http://other.test/e", {"dont_recrawl": True}),
        ("http://other.test/f", {"not_leased": True}),  # robots.txt and the like
    ]:
        request = Request(url, meta=meta)
        mw.process_response(request, answer(request))
    assert [(r.url, d) for r, d in stub.revisits] == [
        ("http://www.news.test/a", 10),
        ("http://other.test/c", 7),
        ("http://other.test/d", 5),
    ]


def test_a_state_from_redis_that_is_bad_or_another_pages_is_not_used(middleware):
    mw, stub = middleware()
    bad = Request("http://a.test/p", meta={STATE_META: {"url": "http://a.test/p", "interval": -5}})
    mw.process_request(bad)
    mw.process_response(bad, answer(bad))
    copied = RevisitState("http://a.test/parent", 3.0, etag='"p"').to_meta()
    child = Request("http://a.test/child", meta={STATE_META: copied})
    mw.process_request(child)
    assert b"If-None-Match" not in child.headers
    mw.process_response(child, answer(child))
    assert [d for _, d in stub.revisits] == [100, 100]  # both first visits
    assert mw.stats.get_value("distcrawl/recrawl/bad_state") == 1


@pytest.mark.integration
def test_the_signature_leaves_out_what_the_settings_exclude(
    demo_site, mongo_workers, mongo_client, redis_client
):
    """Pages without validators whose only changing part is a clock: with the clock left out
    of the signature they count as unchanged (no 304 to help), and their documents keep their
    content and a change count of 0."""
    site = demo_site(pages=3, fresh_pages=2)
    never = [fresh_path("never", i, validators=False) for i in range(2)]
    redis_client.lpush("site:start_urls", *(site.url + p for p in never))
    worker = mongo_workers(
        1, **FAST, DISTCRAWL_RECRAWL_SIGNATURE_EXCLUDE=json.dumps(["//p[@class='clock']"])
    )
    assert wait_until(lambda: all(site.fresh_stats().of(p).ok >= 4 for p in never), 30)
    worker.stop()
    docs = {d["url"]: d for d in mongo_client["distcrawl"]["site"].find()}
    for p in never:
        doc = docs[site.url + p]
        assert doc["fetch_count"] >= 4 and doc["change_count"] == 0, doc
    assert stat(worker, "distcrawl/recrawl/unchanged") >= 6
    assert stat(worker, "distcrawl/recrawl/items_unchanged") >= 6


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('["//p[@class=\'clock\']", "//time"]', ("//p[@class='clock']", "//time")),
        ("//p[contains(@class, 'ad')] | //time", ("//p[contains(@class, 'ad')] | //time",)),
        (["//a", "//b"], ("//a", "//b")),
    ],
)
def test_signature_exclusions_from_settings_and_the_command_line(raw, expected):
    settings = Settings(
        {"DISTCRAWL_RECRAWL_INTERVAL": 1, "DISTCRAWL_RECRAWL_SIGNATURE_EXCLUDE": raw}
    )
    assert recrawl_settings(settings).signature_exclude == expected


def test_an_exclusion_that_is_not_xpath_stops_the_start():
    settings = Settings(
        {"DISTCRAWL_RECRAWL_INTERVAL": 1, "DISTCRAWL_RECRAWL_SIGNATURE_EXCLUDE": "//p["}
    )
    with pytest.raises(ConfigError, match="DISTCRAWL_RECRAWL_SIGNATURE_EXCLUDE"):
        recrawl_settings(settings)
