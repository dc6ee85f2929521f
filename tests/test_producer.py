"""distcrawl.Producer and AsyncProducer against a real redis-server (and real workers)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis
from scrapy import Request
from scrapy.settings import Settings
from scrapy.spiderloader import get_spider_loader
from scrapy.utils.request import fingerprint as scrapy_fingerprint

from distcrawl import AsyncProducer, Outcome, Producer
from distcrawl.codec.entries import EntryMaker, Refused, entry_bytes
from distcrawl.codec.politeness import slot_for, slot_of
from distcrawl.codec.serialize import RequestCodec
from distcrawl.config import DistcrawlConfig
from distcrawl.dupefilter import get_fingerprint
from distcrawl.engine._batch_send import _execute
from distcrawl.model.deadrecord import dead_letter
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import parse_entry
from distcrawl.model.shards import COMMIT_CALL_MAX
from distcrawl.producer import ProducerError, RedriveResult
from tests.support import page_fetches, wait_until

SITE = FrontierKeys("site")


def project_settings(**overrides: Any) -> Settings:
    """The bundled project's settings with ``-s``-like overrides, as the workers get them."""
    settings = Settings()
    settings.setmodule("distcrawl.settings", priority="project")
    for name, value in overrides.items():
        settings.set(name, value, priority="cmdline")
    return settings


def queued(redis_client) -> list[dict[str, Any]]:
    """The requests in the queue, decoded (url, priority, meta, callback)."""
    codec = RequestCodec("msgpack")
    out = []
    for raw in redis_client.zrange(SITE.queue, 0, -1):
        data = codec.decode_dict(parse_entry(raw).payload)
        out.append(data | {"slot": parse_entry(raw).slot})
    return out


@pytest.fixture
def producer(redis_url):
    with Producer.from_url(redis_url, "site", project_settings()) as p:
        yield p


def test_push_outcomes_and_the_spiders_hook(producer, redis_client):
    first = producer.push("http://a.test/x", priority=3, meta={"k": 1})
    assert (first.outcome, first.url, first.reason) == (Outcome.QUEUED, "http://a.test/x", None)
    # a re-sent push (a retried task) stores nothing twice
    again = producer.push("http://a.test/x", priority=3, meta={"k": 1})
    assert again.outcome is Outcome.SEEN and again.ok
    [stored] = queued(redis_client)
    assert stored["u"] == "http://a.test/x" and stored["p"] == 3 and stored["slot"] == "a.test"
    # SiteSpider.make_request_from_data ran, as on a worker: the start URL's scope
    assert stored["M"] == {"k": 1, "site_scope": "a.test"}
    # the layout is recorded as a worker records it
    assert redis_client.hget(SITE.meta, "serializer") == b"msgpack"

    refused = producer.push("ftp://a.test/file")
    assert refused.outcome is Outcome.REFUSED and not refused.ok
    assert "unsupported scheme 'ftp'" in refused.reason
    reserved = producer.push("http://a.test/y", meta={"proxy": "http://evil.test:3128"})
    assert "reserved key(s) in JSON entry: meta.proxy" in reserved.reason
    assert "dont_filter" in producer.push("http://a.test/y", dont_filter=True).reason
    assert producer.push(42).reason == "JSON field 'url' must be str"  # type: ignore[arg-type]
    assert "not JSON data" in producer.push("http://a.test/y", meta={"b": b"x"}).reason

    # a callback only if a request read from Redis may name it (SiteSpider allows parse)
    why = producer.push("http://a.test/cb", callback="page_item").reason
    assert why == "callback refused: 'page_item' is not in DISTCRAWL_ALLOWED_CALLBACKS"
    assert "lifecycle" in producer.push("http://a.test/cb", callback="closed").reason
    assert producer.push("http://a.test/cb", callback="parse").outcome is Outcome.QUEUED
    by_url = {d["u"]: d for d in queued(redis_client)}
    assert by_url["http://a.test/cb"]["cb"] == "parse"
    assert len(by_url) == 2


def test_push_many_in_pipelined_batches_and_the_pending_cap(redis_url, redis_client):
    urls = [f"http://h{i % 7}.test/p/{i}" for i in range(1000)]
    entries: list[Any] = [*urls, *urls[:100]]  # 100 duplicates within the call
    entries += [{"url": "http://a.test/j", "priority": 2}, b"http://a.test/b", "nope"]
    with Producer.from_url(redis_url, "site", project_settings(DISTCRAWL_PUSH_BATCH_SIZE=64)) as p:
        started = time.perf_counter()
        results = p.push_many(entries)
        print(f"push_many: {len(entries)} entries in {time.perf_counter() - started:.3f}s")
    assert len(results) == len(entries)
    outcomes = Counter(r.outcome for r in results)
    assert outcomes == {Outcome.QUEUED: 1002, Outcome.SEEN: 100, Outcome.REFUSED: 1}
    assert [r.url for r in results[:1000]] == urls  # in order
    assert results[-1].reason == "not a URL (no scheme): 'nope'"
    assert redis_client.zcard(SITE.queue) == 1002

    # the cap the workers publish (DISTCRAWL_MAX_PENDING): room for 3 more
    Frontier(redis_client, SITE).publish_settings(max_pending=1005)
    with Producer.from_url(redis_url, "site", project_settings()) as p:
        results = p.push_many(f"http://cap.test/{i}" for i in range(5))
    assert [r.outcome for r in results] == [Outcome.QUEUED] * 3 + [Outcome.FULL] * 2
    assert results[-1].reason == "DISTCRAWL_MAX_PENDING reached"
    # the producer's own setting wins over the published one
    settings = project_settings(DISTCRAWL_MAX_PENDING=2000)
    with Producer.from_url(redis_url, "site", settings) as p:
        assert p.push("http://cap.test/9").outcome is Outcome.QUEUED


def test_push_many_stores_a_large_batch_in_calls_of_at_most_commit_call_max(
    redis_url, redis_client
):
    """DISTCRAWL_PUSH_BATCH_SIZE above COMMIT_CALL_MAX: the batch is several commit.lua
    calls (each a bounded time in Redis), its outcomes still in order."""
    count = 2 * COMMIT_CALL_MAX + 7
    urls = [f"http://h{i % 5}.test/big/{i}" for i in range(count)]
    frontier = Frontier(redis_client, SITE)
    frontier.scripts.load(redis_client)  # no NOSCRIPT round: each call runs once
    redis_client.config_set("slowlog-log-slower-than", 0)
    redis_client.config_set("slowlog-max-len", 10_000)
    redis_client.slowlog_reset()
    settings = project_settings(DISTCRAWL_PUSH_BATCH_SIZE=1000)
    with Producer.from_url(redis_url, "site", settings) as p:
        # a URL of the first call pushed again in the last: found seen there
        results = p.push_many([*urls, urls[3]])
    sha = frontier.scripts.commit.sha.encode()
    calls = [
        e for e in redis_client.slowlog_get(10_000) if e["command"].startswith(b"EVALSHA " + sha)
    ]
    assert len(calls) == 3
    assert [r.outcome for r in results] == [Outcome.QUEUED] * count + [Outcome.SEEN]
    assert [r.url for r in results] == [*urls, urls[3]]
    assert redis_client.zcard(SITE.queue) == count


def test_push_many_after_a_script_flush_and_a_lost_reply(redis_proxy, redis_client):
    """push_many packs its commits itself (_batch_send._execute): a server that lost the
    scripts (NOSCRIPT) gets them again; a lost reply is a ConnectionError (the client
    retries nothing: producer clients are made as the workers', and a push is retried by
    its caller, the Celery task) after which pushing again is safe and stores nothing twice;
    an error reply belongs to its own command."""
    with Producer.from_url(redis_proxy.url, "site", project_settings()) as producer:
        assert producer.push("http://a.test/1").outcome is Outcome.QUEUED
        redis_client.script_flush()
        results = producer.push_many([f"http://a.test/{i}" for i in range(3)])
        assert [r.outcome for r in results] == [Outcome.QUEUED, Outcome.SEEN, Outcome.QUEUED]

        redis_proxy.drop_reply_once(lambda args: args[0].upper() == b"EVALSHA")
        with pytest.raises(redis.ConnectionError):
            producer.push_many(["http://a.test/lost", "http://a.test/0"])
        again = producer.push_many(["http://a.test/lost", "http://a.test/0"])
        assert [r.outcome for r in again] == [Outcome.SEEN, Outcome.SEEN]
        assert redis_client.zcard(SITE.queue) == 4

        replies = _execute(producer.frontier.client, [("SET", "k", 1.5), ("INCR", "k")])
        assert replies[0] in (True, b"OK") and isinstance(replies[1], redis.ResponseError)
        assert _execute(producer.frontier.client, [("GET", "k")]) == [b"1.5"]


def test_results_for_tasks_and_logs_hide_a_password_in_the_url(producer):
    result = producer.push("http://user:s3cret-pw@a.test/private")
    assert result.outcome is Outcome.QUEUED
    shown = result.as_dict()
    assert "s3cret-pw" not in str(shown) and shown["outcome"] == "queued"
    assert shown["url"].startswith("http://user:")


def test_bloom_seen_set(redis_url, redis_client):
    with Producer.from_url(redis_url, "site", project_settings(DISTCRAWL_SEEN="bloom")) as p:
        first = p.push_many([f"http://a.test/{i}" for i in range(50)])
        again = p.push_many([f"http://a.test/{i}" for i in range(60)])
    assert {r.outcome for r in first} == {Outcome.QUEUED}
    assert Counter(r.outcome for r in again) == {Outcome.SEEN: 50, Outcome.QUEUED: 10}
    assert redis_client.zcard(SITE.queue) == 60


def test_a_frontier_laid_out_otherwise_is_refused(producer, redis_client):
    redis_client.hset(SITE.meta, mapping={"serializer": "json", "seen": "set"})
    with pytest.raises(ProducerError) as caught:
        producer.push("http://a.test/")
    assert "DISTCRAWL_SERIALIZER: this worker 'msgpack', the frontier 'json'" in str(caught.value)
    assert redis_client.zcard(SITE.queue) == 0


def test_an_unknown_spider_needs_the_start_urls_target(redis_url, redis_client):
    with pytest.raises(ProducerError, match="'nosuch' is not in SPIDER_MODULES"):
        Producer.from_url(redis_url, "nosuch", project_settings())
    with Producer.from_url(redis_url, "nosuch", project_settings(), target="start_urls") as p:
        results = p.push_many(["http://a.test/", "mailto:x@a.test", "http://a.test/"])
        assert p.push("http://a.test/c", callback="parse").outcome is Outcome.REFUSED
    assert [r.outcome for r in results] == [Outcome.ACCEPTED, Outcome.REFUSED, Outcome.ACCEPTED]
    # the workers drop the duplicate: the producer cannot know it without the seen check
    assert redis_client.lrange("nosuch:start_urls", 0, -1) == [b"http://a.test/"] * 2


def test_status_dead_letters_and_redrive(producer, redis_client):
    producer.push("http://a.test/")
    redis_client.lpush(SITE.dead, dead_letter("bad", raw=b"http://b.test/", source="start_urls"))
    redis_client.lpush(SITE.dead, b"not a record")
    status = producer.status()
    assert (status["namespace"], status["queue"], status["dead"]) == ("site", 1, 2)
    assert status["workers"] == []
    letters = producer.dead_letters()
    assert letters[0]["raw"] == "not a record" and letters[1]["url"] is None
    assert producer.dead_letters(limit=1) == letters[:1]
    assert producer.dead_count() == 2
    assert producer.redrive(source="start_urls") == RedriveResult(1, 0)
    assert redis_client.lrange(SITE.start_urls, 0, -1) == [b"http://b.test/"]
    assert producer.dead_count() == 1
    assert not producer.idle()  # a start URL waits


#: entries a worker dead-letters, under DISTCRAWL_START_URL_MAX_BYTES=300 and
#: DISTCRAWL_START_META_KEYS=download_slot (so that the slot check itself is reached)
BAD_ENTRIES = [
    b"not a url",
    b"example.com/page",
    b"ftp://example.com/file",
    b"javascript:alert(1)",
    b"http://",
    b"http://example.com:99999999/",
    b"   ",
    b"\xff\xfehttp://a.test/",
    b'{"url": "http://a.test/", ',
    b'{"href": "http://a.test/"}',
    b'["http://a.test/"]',
    b'{"url": "http://a.test/", "priority": "high"}',
    b'{"url": "http://a.test/", "headers": "x"}',
    b'{"url": "http://a.test/", "meta": {"proxy": "http://evil.test:3128"}}',
    b'{"url": "http://a.test/", "meta": {"distcrawl_anything": 1}}',
    b'{"url": "http://a.test/", "dont_filter": true}',
    b'{"url": "http://a.test/", "meta": {"download_slot": ""}}',
    b"http://a.test/" + b"x" * 400,
]


def test_redrive_of_a_dead_letter_without_payload_keeps_the_site_scope(producer, redis_client):
    """A dead letter that holds only its URL (its request could not be encoded, or was
    written so) goes back to the queue as the spider makes a request of that URL: through
    its make_request_from_data, so that the site spider scopes it (site_scope, the URL's
    host) instead of following, after a redirect, the links of whatever site it lands on."""
    redis_client.lpush(
        SITE.dead,
        dead_letter("gave up: 503", url="http://blog.a.test/x", source="retry", priority=4),
        dead_letter("gave up: 503", url="http://b.test/y", source="retry"),
    )
    assert producer.redrive(error="503") == RedriveResult(2, 0)
    by_url = {d["u"]: d for d in queued(redis_client)}
    assert by_url["http://blog.a.test/x"]["M"] == {"site_scope": "blog.a.test"}
    assert by_url["http://blog.a.test/x"]["p"] == 4
    assert by_url["http://b.test/y"]["M"] == {"site_scope": "b.test"}
    assert redis_client.llen(SITE.dead) == 0


def test_a_request_too_large_for_its_dead_letter_keeps_its_scope_and_callback(
    producer, redis_client
):
    """A dead letter keeps at most 64 KB of a request: what fits (URL, callback, priority,
    site_scope) stays in its payload and re-drives as it was; what did not (the largest
    meta value, the body) is named in ``payload_dropped``."""
    request = Request(
        "http://blog.a.test/big",
        method="POST",
        body=b"b" * 30_000,
        callback=producer._spider_objects().spider.parse,
        priority=2,
        meta={"site_scope": "a.test", "blob": "x" * 100_000, "small": 1},
    )
    codec = RequestCodec("msgpack", producer._spider_objects().spider)
    payload = base64.b64encode(codec.encode(request)).decode("ascii")
    record = dead_letter("gave up: 503", url=request.url, source="retry", payload=payload)
    assert len(record) < 100_000
    letter = json.loads(record)
    assert letter["payload_dropped"] == ["meta.blob"]
    assert letter["payload_length"] == len(payload)
    redis_client.lpush(SITE.dead, record)
    assert producer.redrive() == RedriveResult(1, 0)
    [stored] = queued(redis_client)
    assert stored["M"] == {"site_scope": "a.test", "small": 1}
    assert (stored["cb"], stored["p"], stored["m"], len(stored["b"])) == (
        "parse",
        2,
        "POST",
        30_000,
    )


def test_bad_entries_get_the_verdicts_a_worker_gives(redis_url, redis_client, workers):
    """The same table through a worker's start_urls boundary (a real `scrapy crawl site`,
    reasons read from its dead letters) and through Producer.push_many: same verdicts."""
    limits = {"DISTCRAWL_START_URL_MAX_BYTES": 300, "DISTCRAWL_START_META_KEYS": "download_slot"}
    redis_client.lpush(SITE.start_urls, *BAD_ENTRIES)
    worker = workers(1, DISTCRAWL_IDLE_TIMEOUT=1, **limits)
    assert worker.wait(90) == 0, worker.log()[-3000:]
    records = Producer.from_url(redis_url, "site", project_settings()).dead_letters(limit=0)
    by_worker = {r["raw_sha1"]: r["reason"] for r in records}
    assert len(by_worker) == len(BAD_ENTRIES)

    with Producer.from_url(redis_url, "site", project_settings(**limits)) as p:
        results = p.push_many(BAD_ENTRIES)
    by_producer = {
        hashlib.sha1(raw).hexdigest(): r.reason for raw, r in zip(BAD_ENTRIES, results, strict=True)
    }
    assert {r.outcome for r in results} == {Outcome.REFUSED}
    for raw in BAD_ENTRIES:
        sha = hashlib.sha1(raw).hexdigest()
        print(f"{raw[:60]!r:64} {by_producer[sha]}")
        assert by_producer[sha] == by_worker[sha], raw
    assert redis_client.zcard(SITE.queue) == 0


def test_a_dont_filter_request_is_fetched_per_push_and_a_push_sent_again_is_not(
    redis_url, redis_client
):
    """What a Scrapy user expects of ``dont_filter``: it bypasses the duplicate filter, so
    pushing a URL with it twice is two requests (a page fetched again on purpose, as when a
    spider yields it twice). Sending the same push again (a Celery task retried after its
    reply was lost, or re-delivered; a push_many re-run after a RedisError) is one push:
    with a ``push_id`` (the Celery tasks pass their task id) the second sending stores
    nothing and reports SEEN. Without one nothing tells the two apart, and Scrapy's meaning
    wins: stored again."""
    settings = project_settings(DISTCRAWL_START_META_KEYS="dont_filter")
    with Producer.from_url(redis_url, "site", settings) as p:
        assert p.push("http://a.test/x").outcome is Outcome.QUEUED
        # bypasses the seen-set, each time: two requests
        assert p.push("http://a.test/x", dont_filter=True).outcome is Outcome.QUEUED
        assert p.push("http://a.test/x", dont_filter=True).outcome is Outcome.QUEUED
        assert redis_client.zcard(SITE.queue) == 3

        # one push sent twice: stored once
        first = p.push("http://a.test/x", dont_filter=True, push_id="task-1")
        again = p.push("http://a.test/x", dont_filter=True, push_id="task-1")
        assert (first.outcome, again.outcome) == (Outcome.QUEUED, Outcome.SEEN)
        assert redis_client.zcard(SITE.queue) == 4
        # another push of the same request is another request
        assert p.push("http://a.test/x", dont_filter=True, push_id="task-2").ok
        assert redis_client.zcard(SITE.queue) == 5

        # push_many re-run under the same id: every entry once, dont_filter ones included
        entries: list[Any] = [
            {"url": "http://a.test/x", "dont_filter": True},
            {"url": "http://a.test/x", "dont_filter": True},  # twice in one push: two requests
            "http://a.test/new",
        ]
        sent = p.push_many(entries, push_id="batch-1")
        assert [r.outcome for r in sent] == [Outcome.QUEUED] * 3
        resent = p.push_many(entries, push_id="batch-1")
        assert [r.outcome for r in resent] == [Outcome.SEEN] * 3
        assert redis_client.zcard(SITE.queue) == 8
    stored = [d for d in queued(redis_client) if d["u"] == "http://a.test/x"]
    assert sum(bool(d.get("d")) for d in stored) == 6  # all but the first are dont_filter


#: URLs whose canonical form differs from what was pushed in every way w3lib knows
URLS = [
    "http://a.test/",
    "http://a.test",
    "HTTP://A.Test:8080/P?b=2&a=1&a=0#frag",
    "https://a.test/r\u00e9sum\u00e9?q=caf\u00e9&x=%e9",
    "https://b\u00fccher.test/%7euser/./a/../b;p=1?q=a+b&q=",
    "http://user:pw@a.test:80/x?",
    "http://[::0:1]:8000/a%2fb",
    "http://a.test/\u2603?\u2603=\u2603",
    "http://a.test/pa th?q=a b",
]


@pytest.mark.parametrize("url", URLS)
def test_the_producers_fingerprint_and_slot_are_the_workers(url):
    """get_fingerprint and slot_for (the producer's) against what a worker computes with
    Scrapy's fingerprinter and slot_of: the seen-set and the slots must not depend on who
    made the entry."""
    request = Request(url)
    assert get_fingerprint(request.url) == scrapy_fingerprint(request)
    assert slot_for(request.url, request.meta) == slot_of(request)
    request = Request(url, meta={"download_slot": "x"})
    assert slot_for(request.url, request.meta) == slot_of(request) == "x"


def entry_makers(**overrides: Any) -> tuple[EntryMaker, EntryMaker]:
    """The site spider's EntryMaker (Scrapy's fingerprinter: the fast path for plain GETs)
    and the same with that path off (every fingerprint from the fingerprinter)."""
    settings = project_settings(**overrides)
    spidercls = get_spider_loader(settings).load("site")
    settings = settings.copy()
    spidercls.update_settings(settings)
    config = DistcrawlConfig.from_settings(settings)
    fast = EntryMaker(spidercls, settings, config)
    general = EntryMaker(spidercls, settings, config)
    general.url_only = False
    assert fast.url_only
    return fast, general


def made_or_refused(maker: EntryMaker, item: Any) -> Any:
    try:
        made = maker.make(*entry_bytes(item))
    except Refused as exc:
        return ("refused", str(exc))
    return (made.url, made.entry._replace(request=None))


def test_the_fast_path_and_the_general_path_give_the_same_verdicts():
    """A mixed list of good and bad entries, through the plain-GET fast path and through the
    fingerprinter: the same refusals with the same reasons, and field for field the same
    queue entries (fingerprint, priority, payload, slot)."""
    mixed: list[Any] = [
        *BAD_ENTRIES,
        *URLS,
        "  http://a.test/padded  ",
        b"http://a.test/bytes",
        {"url": "http://a.test/j", "priority": 5, "meta": {"k": [1, 2]}},
        {"url": "http://a.test/post", "method": "POST", "body": "a=1"},
        {"url": "http://a.test/head", "method": "HEAD"},
        {"url": "http://a.test/h", "headers": {"X-A": "1"}},
        {"url": "http://a.test/v", "meta": {"verbatim_url": True}},
        {"url": "http://a.test/df", "dont_filter": True},
        {"url": "http://a.test/cb", "callback": "parse"},
        {"url": "http://a.test/cb", "callback": "page_item"},
        {"url": "http://a.test/s", "meta": {"download_slot": "shared"}},
        {"url": "http://a.test/bad", "method": "GET\n"},
        "http://a.test/\ud800",
    ]
    for overrides in ({}, {"DISTCRAWL_START_META_KEYS": "download_slot,verbatim_url,dont_filter"}):
        fast, general = entry_makers(DISTCRAWL_START_URL_MAX_BYTES=300, **overrides)
        verdicts = [made_or_refused(fast, item) for item in mixed]
        assert verdicts == [made_or_refused(general, item) for item in mixed]
        refused = sum(v[0] == "refused" for v in verdicts)
        assert 0 < refused < len(mixed), verdicts  # both kinds were compared


def test_async_producer_in_a_running_asyncio_app(redis_url, demo_site, workers):
    """Pushes, then waits for the crawl while the event loop keeps running: wait_until_idle
    times out while the crawl runs and returns after it."""
    site = demo_site(pages=40, links=3, delay=0.05)
    pages = [site.url_for(f"/page/{n}") for n in range(40)]
    report: dict[str, Any] = {}

    async def app() -> None:
        producer = AsyncProducer.from_url(redis_url, "site", project_settings())
        async with producer:
            results = await producer.push_many(pages)
            report["outcomes"] = Counter(r.outcome for r in results)
            ticks = 0
            stop = asyncio.Event()

            async def ticker() -> None:
                nonlocal ticks
                while not stop.is_set():
                    ticks += 1
                    await asyncio.sleep(0.01)

            task = asyncio.create_task(ticker())
            workers(1, DISTCRAWL_DOMAIN_CONCURRENCY=2)
            started = time.monotonic()
            try:
                await producer.wait_until_idle(timeout=1.0)
            except TimeoutError as exc:
                report["timeout"] = str(exc)
            await producer.wait_until_idle(timeout=90)
            report["waited"] = time.monotonic() - started
            stop.set()
            await task
            report["ticks"] = ticks
            report["status"] = await producer.status()

    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(app())
        except BaseException as exc:  # handed to the test's thread
            failure.append(exc)

    # its own thread: the test process's asyncio loop belongs to the Twisted reactor
    thread = threading.Thread(target=run)
    thread.start()
    thread.join(150)
    assert not thread.is_alive() and not failure, failure
    assert report["outcomes"] == {Outcome.QUEUED: 40}
    assert "not idle after 1.0s" in report["timeout"]
    fetched = page_fetches(site)
    assert {f"/page/{n}" for n in range(40)} <= set(fetched) and max(fetched.values()) == 1
    status = report["status"]
    assert (status["queue"], status["leased"], status["start_urls"]) == (0, 0, 0)
    # the loop ran all along: a tick every ~10 ms, not one per blocking call
    print(f"waited {report['waited']:.1f}s, {report['ticks']} ticks")
    assert report["ticks"] >= report["waited"] / 0.01 * 0.5


def test_close_lets_go_of_the_connection_and_the_sending_thread(redis_url, redis_client):
    """What docs/producers.md ("Closing a producer") promises, for both producers."""

    def connections() -> int:
        return len(redis_client.client_list())

    def senders() -> int:
        return sum(t.name.startswith("distcrawl-push") for t in threading.enumerate())

    idle = connections()
    with Producer.from_url(redis_url, "site", project_settings()) as producer:
        assert producer.push("http://a.example/").outcome is Outcome.QUEUED
        assert connections() == idle + 1
    # the server notices a closed socket a moment later
    assert wait_until(lambda: connections() == idle, timeout=5)
    assert senders() == 0

    seen: dict[str, Any] = {}

    async def pushed_then_closed() -> None:
        async with AsyncProducer.from_url(redis_url, "site", project_settings()) as producer:
            seen["outcome"] = (await producer.push("http://b.example/")).outcome
            seen["open"] = connections()
        seen["closed"] = wait_until(lambda: connections() == idle, timeout=5)

    # in a thread of its own: the test process's asyncio loop belongs to the Twisted reactor
    thread = threading.Thread(target=asyncio.run, args=(pushed_then_closed(),))
    thread.start()
    thread.join(30)
    assert seen == {"outcome": Outcome.QUEUED, "open": idle + 1, "closed": True}
    assert senders() == 0
