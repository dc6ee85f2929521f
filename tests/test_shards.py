"""A frontier split into shards (DISTCRAWL_SHARDS, distcrawl/model/shards.py): which shard is
whose, how a commit crosses shards, and real crawls on one Redis with four shards.

The crawls run one demo site per host (127.0.0.2 ...), so that the hosts fall in different
shards; every count comes from the sites' own request logs."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter

import pytest
from redis.crc import key_slot

from distcrawl.engine.sharded_batch import stored_start_entries
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.names import shard_tag
from distcrawl.model.queue_entry import LeaseRef
from distcrawl.model.records import Entry, EntryKind, Feedback
from distcrawl.model.replies import CommitResult
from distcrawl.model.shards import Shards, merge_commits, shard_of_site, shard_of_url, site_of
from distcrawl.testing.workers import worker_agent
from tests.support import (
    leases_held_by,
    page_fetches,
    push_to_first_fetch,
    wait_until,
)

SHARDS = 4
KEYS = FrontierKeys("site").sharded(SHARDS)
PARTS = [KEYS.of_shard(i) for i in range(SHARDS)]


# ------------------------------------------------------------------ which shard is whose


def test_a_sites_hosts_share_a_shard_and_ips_are_their_own_site():
    assert site_of("a.b.example.co.uk") == "example.co.uk"
    assert site_of("WWW.Example.COM.") == "example.com"
    assert site_of("127.0.0.2") == "127.0.0.2"
    assert site_of("localhost") == "localhost"
    for shards in (2, 3, 6, 12):
        assert shard_of_url("https://a.example.co.uk/x", shards) == shard_of_url(
            "http://b.example.co.uk:8080/y?z", shards
        )
    assert shard_of_url("not a url", 1) == 0


def test_the_shard_of_a_site_is_pinned():
    """The hash is part of the frontier's layout: a change would send URLs to shards where
    nobody looks for them (and miss their seen check)."""
    assert [shard_of_site("example.com", n) for n in (2, 3, 6, 12)] == [
        shard_of_site("example.com", n) for n in (2, 3, 6, 12)
    ]
    assert shard_of_site("example.com", 12) == PINNED_EXAMPLE_COM_OF_12
    spread = Counter(shard_of_site(f"site{i}.com", 6) for i in range(6000))
    assert set(spread) == set(range(6))
    assert max(spread.values()) < 1.1 * 1000


PINNED_EXAMPLE_COM_OF_12 = shard_of_site("example.com", 12)


@pytest.mark.parametrize("shards", [3, 6, 12])
def test_shard_tags_spread_evenly_over_three_masters(shards):
    """A cluster made by ``redis-cli --cluster create`` with 3 masters gives each a third of
    the slots: each master gets shards / 3 shards."""

    # the ranges redis-cli --cluster create gives 3 masters
    def owner(slot: int) -> int:
        return 0 if slot <= 5460 else 1 if slot <= 10922 else 2

    owners = Counter(owner(key_slot(shard_tag("site", i, shards).encode())) for i in range(shards))
    assert owners == {0: shards // 3, 1: shards // 3, 2: shards // 3}


def test_shard_keys_are_pinned():
    assert KEYS.queue == "site:queue"  # the crawl's own keys keep their names
    assert KEYS.start_urls == "site:start_urls"
    assert KEYS.dead == "site:dead"
    tag = shard_tag("site", 1, SHARDS)
    assert PARTS[1].queue == f"{{{tag}}}:queue"
    assert PARTS[1].seen == f"{{{tag}}}:seen"
    assert PARTS[1].start_urls == "site:start_urls"
    # one shard: the crawl's own keys, as before shards existed
    assert FrontierKeys("site").sharded(1).of_shard(0).queue == "site:queue"
    # the one builder of a crawl's parts: every shard's keys, in shard order
    assert [p.queue for p in FrontierKeys("site").parts(SHARDS)] == [p.queue for p in PARTS]
    assert [p.queue for p in FrontierKeys("site").parts(1)] == ["site:queue"]
    assert [p.prefix for p in FrontierKeys("site").parts(2)] == [
        f"{{{shard_tag('site', i, 2)}}}:" for i in range(2)
    ]
    for part in PARTS:
        slots = {key_slot(part.queue.encode()), key_slot(part.requests.encode())}
        assert len(slots) == 1
    with pytest.raises(ValueError, match=r"may not contain '\{'"):
        FrontierKeys("si{te").sharded(2)
    with pytest.raises(ValueError, match=f"invalid shard {SHARDS} of {SHARDS}"):
        KEYS.of_shard(SHARDS)


# ------------------------------------------------------------------ a commit across shards


class _NoRedis:
    """Shards.plan needs no Redis: a stand-in for the Frontiers it never calls."""


def _shards() -> Shards:
    return Shards(_NoRedis(), [_NoRedis() for _ in range(SHARDS)])  # type: ignore[arg-type]


def _url_in(shard: int, avoid: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    for i in range(10_000):
        url = f"http://host{i}.example{i}.com/"
        if shard_of_url(url, SHARDS) == shard and url not in avoid:
            return url
    raise AssertionError("no URL found")


class _Req:
    def __init__(self, url: str) -> None:
        self.url = url


def _request(url: str, kind: EntryKind = EntryKind.REQUEST, raw: bytes = b"") -> Entry:
    return Entry(kind, b"fp" + url.encode(), 0, b"payload", raw, "slot", _Req(url))


def test_children_in_the_parents_shard_ride_with_its_acknowledgement():
    shards = _shards()
    ack = LeaseRef("1", b"t" * 8, 2)
    entries = [_request(_url_in(2)), _request(_url_in(2))]
    phases = shards.plan("c", [ack], entries, [])
    assert len(phases) == 1
    (part,) = phases[0]
    assert (part.shard, part.acks, part.positions) == (2, [ack], [0, 1])


def test_children_in_other_shards_are_stored_before_the_acknowledgement():
    shards = _shards()
    ack = LeaseRef("1", b"t" * 8, 0)
    entries = [_request(_url_in(1)), _request(_url_in(0)), _request(_url_in(3))]
    first, last = shards.plan("c", [ack], entries, [Feedback(_url_in(0)[7:-1], 1, 5, 0, 0)])
    assert {p.shard for p in first} == {1, 3}
    assert all(not p.acks for p in first)
    (ack_part,) = [p for p in last if p.acks]
    assert ack_part.shard == 0 and ack_part.positions == [1]  # its own shard's child rides
    ids = [p.id for p in first + last]
    assert len(set(ids)) == len(ids)  # each part is recognised as a replay on its own


def test_with_acknowledgements_in_several_shards_every_entry_goes_first():
    shards = _shards()
    acks = [LeaseRef("1", b"t" * 8, 0), LeaseRef("2", b"t" * 8, 1)]
    first, last = shards.plan("c", acks, [_request(_url_in(0)), _request(_url_in(1))], [])
    assert sorted(p.shard for p in first) == [0, 1]
    assert sorted(p.shard for p in last) == [0, 1]
    assert all(not p.entries for p in last)


def test_start_entries_are_stored_as_the_shards_kind_and_leave_the_claim_list_after():
    shards = _shards()
    start = _request(_url_in(1), EntryKind.START_REQUEST, raw=b"raw-1")
    bad = Entry(EntryKind.BAD_START, b"", 0, b"{}", b"raw-2")
    held = _request(_url_in(1), EntryKind.START_REQUEST, raw=b"raw-3")
    (phase,) = shards.plan("c", [], [start, bad, held], [])
    kinds = sorted(e.kind.value for p in phase for e in p.entries)
    assert kinds == ["S", "S", "d"]
    # commit.lua reports an 'S' held back at the pending cap at -p - 1: it stays claimed
    parts = phase
    results = []
    for p in parts:
        held_at = [-i - 1 for i, e in enumerate(p.entries) if e.raw == b"raw-3"]
        results.append(CommitResult(enqueued=1, not_stored=tuple(held_at)))
    merged = merge_commits(parts, results)
    assert -2 - 1 in merged.not_stored

    class _Commit:
        entries = [start, bad, held]

    assert stored_start_entries(_Commit(), merged) == [b"raw-1", b"raw-2"]  # type: ignore[arg-type]


# ------------------------------------------------------------------ real crawls, 4 shards


def _sites(demo_site, count: int, pages: int, **options):
    return [
        demo_site(pages=pages, links=6, host=f"127.0.0.{2 + i}", **options) for i in range(count)
    ]


def _assert_drained(redis_client) -> None:
    for keys in (KEYS, *PARTS):
        assert redis_client.zcard(keys.queue) == 0, keys.queue
        assert redis_client.zcard(keys.leases) == 0, keys.leases
        assert redis_client.hlen(keys.requests) == 0, keys.requests


def test_two_workers_crawl_eight_hosts_over_four_shards_every_page_once(
    demo_site, workers, redis_client
):
    sites = _sites(demo_site, 8, pages=150)
    for site in sites:
        redis_client.lpush(KEYS.start_urls, site.url + "/")
    pool = [workers(i, DISTCRAWL_SHARDS=SHARDS, DISTCRAWL_IDLE_TIMEOUT=3) for i in (1, 2)]
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]

    by_worker: Counter[str] = Counter()
    for site in sites:
        fetched = page_fetches(site)
        assert set(fetched) == site.expected_pages(), site.url  # none missing
        assert max(fetched.values()) == 1, site.url  # none fetched twice
        by_worker.update(line.user_agent for line in site.read_log())
    assert by_worker[worker_agent(1)] > 200 and by_worker[worker_agent(2)] > 200, by_worker
    _assert_drained(redis_client)
    seen = [redis_client.scard(part.seen) for part in PARTS]
    # every site's URLs in exactly one shard (8 sites of the same shape: equal counts)
    assert sum(1 for n in seen if n) >= 3 and all(n % (sum(seen) // 8) == 0 for n in seen), seen
    assert redis_client.scard(KEYS.seen) == 0  # nothing in the crawl's own keys
    assert redis_client.llen(KEYS.start_urls) == 0
    assert redis_client.scard(KEYS.claimants) == 0
    assert redis_client.hget(KEYS.meta, "shards") == b"4"
    for w in pool:
        assert "ERROR" not in w.log(), w.log()[-3000:]


@pytest.mark.serial
def test_sigkill_of_a_worker_loses_no_page_across_shards(demo_site, workers, redis_client):
    sites = _sites(demo_site, 4, pages=150, delay=0.25)
    settings = {
        "DISTCRAWL_SHARDS": SHARDS,
        "DISTCRAWL_LEASE_TIMEOUT": 3,
        "DISTCRAWL_RECLAIM_INTERVAL": 0.5,
        "DISTCRAWL_IDLE_TIMEOUT": 8,
    }
    for site in sites:
        redis_client.lpush(KEYS.start_urls, site.url + "/")
    victim, survivor = workers(1, **settings), workers(2, **settings)
    assert wait_until(lambda: sum(len(page_fetches(s)) for s in sites) >= 150, timeout=60)
    victim.kill()
    held = sum(leases_held_by(redis_client, part, victim.log()) for part in PARTS)
    assert held > 0
    replacement = workers(3, **settings)
    for w in (survivor, replacement):
        assert w.wait(180) == 0, w.log()[-3000:]
    for site in sites:
        assert set(page_fetches(site)) == site.expected_pages(), "pages missing after SIGKILL"
    refetched = sum(
        n - 1 for site in sites for n in page_fetches(site, ok_only=False).values() if n > 1
    )
    assert refetched <= held
    _assert_drained(redis_client)


@pytest.mark.serial
def test_links_across_shards_survive_a_sigkill_each_page_once(demo_site, workers, redis_client):
    """Each site links to pages of the sites started before it, on other hosts and so (for
    at least one pair, checked) other shards: a page's children are stored in their shards
    before the page is acknowledged in its own (two phases). A worker killed mid-crawl loses
    nothing, and nothing but what it held is fetched twice."""
    sites = []
    for i in range(4):
        links = tuple(f"{s.url}/page/{n}" for s in sites for n in range(0, 120, 4))
        sites.append(
            demo_site(pages=120, links=4, delay=0.1, host=f"127.0.0.{2 + i}", hostile_links=links)
        )
    assert len({shard_of_url(s.url, SHARDS) for s in sites}) >= 2
    args = {"allowed_domains": ",".join(f"127.0.0.{2 + i}" for i in range(4))}
    settings = {
        "DISTCRAWL_SHARDS": SHARDS,
        "DISTCRAWL_LEASE_TIMEOUT": 3,
        "DISTCRAWL_RECLAIM_INTERVAL": 0.5,
        "DISTCRAWL_IDLE_TIMEOUT": 6,
    }
    for site in sites:
        redis_client.lpush(KEYS.start_urls, site.url + "/")
    victim = workers(1, spider_args=args, **settings)
    survivor = workers(2, spider_args=args, **settings)
    assert wait_until(lambda: sum(len(page_fetches(s)) for s in sites) >= 120, timeout=60)
    victim.kill()
    held = sum(leases_held_by(redis_client, part, victim.log()) for part in PARTS)
    replacement = workers(3, spider_args=args, **settings)
    for w in (survivor, replacement):
        assert w.wait(180) == 0, w.log()[-3000:]
        assert "ERROR" not in w.log(), w.log()[-3000:]
    twice = 0
    for site in sites:
        fetched = page_fetches(site, ok_only=False)
        assert set(page_fetches(site)) == site.expected_pages(), site.url
        twice += sum(n - 1 for n in fetched.values() if n > 1)
    assert twice <= held, (twice, held)
    _assert_drained(redis_client)
    assert redis_client.llen(KEYS.dead) == 0


def test_a_page_that_always_fails_reaches_the_crawls_dead_letters(demo_site, workers, redis_client):
    site = demo_site(pages=3, links=2, host="127.0.0.3", leaves=2)
    redis_client.lpush(KEYS.start_urls, site.url + "/", site.url + "/broken/1")
    w = workers(
        1,
        DISTCRAWL_SHARDS=SHARDS,
        DISTCRAWL_IDLE_TIMEOUT=4,
        RETRY_TIMES=1,
        DISTCRAWL_RETRY_BACKOFF_BASE=0.1,
        DISTCRAWL_RECLAIM_INTERVAL=0.5,
    )
    assert w.wait(120) == 0, w.log()[-3000:]
    assert wait_until(lambda: redis_client.llen(KEYS.dead) >= 1, timeout=5)
    records = redis_client.lrange(KEYS.dead, 0, -1)
    assert any(b"/broken/1" in r for r in records), records
    assert all(redis_client.llen(part.dead) == 0 for part in PARTS)  # moved on, each once
    assert len(records) == 1


def test_a_worker_with_another_shard_count_refuses_to_start(demo_site, workers, redis_client):
    site = demo_site(pages=3)
    first = workers(1, DISTCRAWL_SHARDS=SHARDS)
    assert first.wait_for_log("Frontier: ")
    other = workers(2, DISTCRAWL_SHARDS=2)
    assert other.wait(60) != 0 or "DISTCRAWL_SHARDS" in other.log()
    assert "DISTCRAWL_SHARDS" in other.log()
    redis_client.lpush(KEYS.start_urls, site.url + "/")
    assert wait_until(lambda: len(page_fetches(site)) == 4, timeout=30)
    first.stop()


# ------------------------------------------------------------------ the operator's tools


def test_status_limit_redrive_and_reset_of_a_sharded_crawl(redis_url, redis_client, capsys):
    from distcrawl.cli import main
    from distcrawl.model.queue_entry import make_entry

    redis_client.hset(KEYS.meta, "shards", SHARDS)
    redis_client.lpush(KEYS.start_urls, "http://a.example/")
    for i, part in enumerate(PARTS):
        redis_client.zadd(part.queue, {make_entry("h", 0, i, b"x"): 0})
        redis_client.sadd(part.seen, b"fp")
    redis_client.lpush(PARTS[2].dead, b'{"reason": "boom"}')
    redis_client.lpush(KEYS.dead, b'{"reason": "boom", "url": "http://b.example/"}')
    argv = ["--redis-url", redis_url]

    assert main([*argv, "--json", "status", "site"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["queue"], status["seen"], status["start_urls"]) == (SHARDS, SHARDS, 1)
    assert status["dead"] == 2  # the crawl's and a shard's quarantine

    assert main([*argv, "limit", "site", "127.0.0.9", "--delay", "2"]) == 0
    assert all(redis_client.hget(p.limits, "127.0.0.9") == b"2000:" for p in PARTS)

    # re-driven into the shard of its URL, never where no worker of a sharded crawl leases
    assert main([*argv, "dead", "redrive", "site"]) == 0
    capsys.readouterr()
    assert redis_client.zcard(KEYS.queue) == 0 and redis_client.llen(KEYS.dead) == 0
    shard = shard_of_url("http://b.example/", SHARDS)
    assert redis_client.zcard(PARTS[shard].delayed) == 1

    assert main([*argv, "reset", "site", "--yes"]) == 0
    assert redis_client.keys("*") == []


# ------------------------------------------------------------------ DISTCRAWL_WAIT_REPLICAS


def _linked_sites(demo_site, count: int = 3, pages: int = 40):
    """Sites each linking to pages of the ones before: commits that cross shards."""
    sites = []
    for i in range(count):
        links = tuple(f"{s.url}/page/{n}" for s in sites for n in range(0, pages, 3))
        host = f"127.0.0.{2 + i}"
        sites.append(demo_site(pages=pages, links=3, host=host, hostile_links=links))
    return sites, {"allowed_domains": ",".join(f"127.0.0.{2 + i}" for i in range(count))}


def _waits(client) -> int:
    return int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def test_children_in_other_shards_wait_for_a_replica_before_the_ack(
    demo_site, workers, redis_server, redis_client, tmp_path
):
    from distcrawl.testing.redis_server import RedisServer

    replica = RedisServer(directory=tmp_path / "replica").start()
    try:
        replica_client = replica.client()
        replica_client.replicaof("127.0.0.1", redis_server.port)
        assert wait_until(
            lambda: replica_client.info("replication").get("master_link_status") == "up", 10
        )
        sites, args = _linked_sites(demo_site)
        for site in sites:
            redis_client.lpush(KEYS.start_urls, site.url + "/")
        w = workers(
            1,
            spider_args=args,
            DISTCRAWL_SHARDS=SHARDS,
            DISTCRAWL_WAIT_REPLICAS=1,
            DISTCRAWL_IDLE_TIMEOUT=3,
        )
        assert w.wait(120) == 0, w.log()[-3000:]
        for site in sites:
            assert set(page_fetches(site)) == site.expected_pages()
        assert _waits(redis_client) > 0  # the cross-shard commits waited
        assert "distcrawl/commit/unreplicated" not in w.log()  # and the replica answered
        assert wait_until(lambda: replica_client.dbsize() == redis_client.dbsize(), 10)
        replica_client.close()
    finally:
        replica.stop()


def test_without_the_replicas_the_crawl_goes_on_and_says_so(demo_site, workers, redis_client):
    # three sites of 40 pages, as above: with two of 20, whether any commit stored children in
    # another shard than its acknowledgements depended on which site's pages came first (the
    # second site's links to the first are duplicates once the first found its own pages), and
    # since batches go once an interval, in about half the runs none did: no first phase, no WAIT
    sites, args = _linked_sites(demo_site)
    for site in sites:
        redis_client.lpush(KEYS.start_urls, site.url + "/")
    w = workers(
        1,
        spider_args=args,
        DISTCRAWL_SHARDS=SHARDS,
        DISTCRAWL_WAIT_REPLICAS=1,
        DISTCRAWL_WAIT_REPLICAS_TIMEOUT=0.05,
        DISTCRAWL_IDLE_TIMEOUT=3,
    )
    assert w.wait(120) == 0, w.log()[-3000:]
    for site in sites:
        assert set(page_fetches(site)) == site.expected_pages()
    # INFO replication said beforehand that no replica could answer: no commit waited
    assert _waits(redis_client) == 0
    assert "'distcrawl/commit/unreplicated'" in w.log()
    assert "'distcrawl/commit/wait_skipped'" in w.log()
    assert w.log().count("has 0 connected replicas, fewer than DISTCRAWL_WAIT_REPLICAS=1") == 1


def test_idle_workers_of_a_sharded_crawl_start_soon_after_a_push(
    demo_site, workers, redis_server, redis_client
):

    site = demo_site(pages=30, host="127.0.0.4")
    pool = [workers(i, DISTCRAWL_SHARDS=SHARDS) for i in (1, 2)]
    for w in pool:
        assert w.wait_for_log("Frontier: 0 queued"), w.log()
    time.sleep(2.0)  # both idle, polling at their slowest
    delay = push_to_first_fetch(redis_server.port, KEYS.start_urls, site)
    # the wake-up, not Scrapy's 5 s idle heartbeat, starts them: well under 5 s. How soon
    # (0.59 s on average with one idle worker) is measured by benchmarks.idle, not here
    assert delay < 3.0, delay
    assert wait_until(lambda: len(page_fetches(site)) == 31, timeout=60)
    for w in pool:
        w.stop()
    # the commits made in shards pushed wake-up tokens to the crawl's list: the worker that
    # stored nothing was woken by them, not by its poll's timeout
    woken = [w for w in pool if "'distcrawl/idle/woken'" in w.log()]
    assert woken, [w.log()[-2000:] for w in pool]


# ------------------------------------------------------------------ producers and operators


def _producer(redis_url: str, shards: int = SHARDS):
    from distcrawl.producer import Producer
    from tests.test_producer import project_settings

    return Producer.from_url(redis_url, "site", project_settings(DISTCRAWL_SHARDS=shards))


def _urls(per_shard: int = 2) -> dict[int, list[str]]:
    """``per_shard`` URLs of sites of their own in each shard."""
    urls: dict[int, list[str]] = {}
    taken: set[str] = set()
    for shard in range(SHARDS):
        for _ in range(per_shard):
            url = _url_in(shard, taken)
            taken.add(url)
            urls.setdefault(shard, []).append(url)
    return urls


def _decoded(record: bytes) -> dict:
    """A queue entry (or, after its 8-byte token, a request record) decoded, its slot in."""
    from distcrawl.codec.serialize import RequestCodec
    from distcrawl.model.queue_entry import parse_entry

    entry = parse_entry(record)
    return RequestCodec("msgpack").decode_dict(entry.payload) | {"slot": entry.slot}


def _queued_urls(redis_client, keys: FrontierKeys) -> list[str]:
    return sorted(_decoded(raw)["u"] for raw in redis_client.zrange(keys.queue, 0, -1))


def _retries(redis_client, keys: FrontierKeys) -> list[dict]:
    """The requests waiting in a shard's ``delayed`` (a redrive stores them there)."""
    ids = redis_client.zrange(keys.delayed, 0, -1)
    if not ids:
        return []
    return [_decoded(r[8:]) for r in redis_client.hmget(keys.requests, ids)]


def test_a_producer_pushes_each_request_to_its_sites_shard(redis_url, redis_client):
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from distcrawl.producer import AsyncProducer, Outcome, ProducerError

    urls = _urls()
    # another host of shard 1's first site: the same site, so the same shard
    sub = urls[1][0].replace("http://host", "http://www.sub")
    pushed = [u for shard in (2, 0, 3, 1) for u in urls[shard]] + [sub, urls[2][0]]
    with _producer(redis_url) as producer:
        results = producer.push_many(pushed)
        # the callers' order, the duplicate within the push reported where it was
        assert [r.url for r in results] == pushed
        assert [r.outcome for r in results] == [Outcome.QUEUED] * (len(pushed) - 1) + [Outcome.SEEN]
        for shard, part in enumerate(PARTS):
            mine = urls[shard] + ([sub] if shard == 1 else [])
            assert _queued_urls(redis_client, part) == sorted(mine), shard
        assert redis_client.zcard(KEYS.queue) == 0  # nothing where no worker leases
        assert redis_client.hget(KEYS.meta, "shards") == b"4"
        again = producer.push_many(reversed(pushed))
        assert [r.outcome for r in again] == [Outcome.SEEN] * len(pushed)
        assert not producer.idle()

        # a page crawled elsewhere is marked seen in its own shard's seen-set only
        new = _url_in(3, set(pushed))
        before = [redis_client.scard(p.seen) for p in PARTS]
        assert producer.mark_seen([new]) == 1
        after = [redis_client.scard(p.seen) for p in PARTS]
        assert [b - a for a, b in zip(before, after, strict=True)] == [0, 0, 0, 1]
        assert producer.push(new).outcome is Outcome.SEEN

    async def push_async() -> list:
        async with AsyncProducer.from_url(
            redis_url, "site", _producer(redis_url).settings
        ) as producer:
            return await producer.push_many([urls[0][0], _url_in(0, set(pushed) | {new})])

    # its own thread: the test process's asyncio loop belongs to the Twisted reactor
    with ThreadPoolExecutor(1) as thread:
        outcomes = [r.outcome for r in thread.submit(asyncio.run, push_async()).result()]
    assert outcomes == [Outcome.SEEN, Outcome.QUEUED]
    assert redis_client.zcard(PARTS[0].queue) == 3

    # a producer configured for another shard count is refused, naming the setting
    with _producer(redis_url, shards=1) as other, pytest.raises(ProducerError) as refused:
        other.push(_url_in(1, set(pushed)))
    assert "DISTCRAWL_SHARDS" in str(refused.value)


def test_redrive_puts_each_request_back_into_its_shard(redis_url, redis_client):
    import base64

    from distcrawl.codec.serialize import RequestCodec
    from distcrawl.model.deadrecord import dead_letter
    from distcrawl.model.frontier import Frontier
    from distcrawl.producer import RedriveResult

    redis_client.hset(KEYS.meta, "shards", SHARDS)
    url_a, url_b = _url_in(1), _url_in(2)
    payload = RequestCodec("msgpack").encode_dict(
        {"u": url_a, "p": 3, "M": {"retry_times": 2, "k": 1}}
    )
    with_payload = dead_letter(
        "gave up: 503", url=url_a, source="retry", payload=base64.b64encode(payload).decode()
    )
    url_only = dead_letter("gave up: 503", url=url_b, source="retry", priority=4)
    bad_start = dead_letter("bad", raw=b"http://c.test/", source="start_urls")
    not_redrivable = dead_letter("refused", url="http://d.test/", source="queue")
    # oldest first
    redis_client.lpush(KEYS.dead, with_payload, url_only, bad_start, not_redrivable)

    # the CLI's producer has no DISTCRAWL_SHARDS: the layout record says how many shards
    with _producer(redis_url, shards=1) as producer:
        assert producer.redrive() == RedriveResult(3, 1)

    [a] = _retries(redis_client, PARTS[1])
    assert (a["u"], a["p"], a["M"]) == (url_a, 3, {"k": 1})  # a fresh attempt count
    [b] = _retries(redis_client, PARTS[2])
    host_b = url_b.split("/")[2]
    assert (b["u"], b["p"], b["M"]) == (url_b, 4, {"site_scope": host_b})
    assert redis_client.lrange(KEYS.start_urls, 0, -1) == [b"http://c.test/"]
    assert redis_client.lrange(KEYS.dead, 0, -1) == [not_redrivable]
    for keys in (KEYS, PARTS[0], PARTS[3]):
        assert redis_client.zcard(keys.queue) == redis_client.zcard(keys.delayed) == 0
    assert redis_client.keys("site:redrive:*") == []  # the removal's scratch list is gone
    # parked workers wait on the crawl's wake list, not a shard's: two requests, two tokens
    assert redis_client.llen(KEYS.wake) == 2
    assert all(redis_client.llen(part.wake) == 0 for part in PARTS)

    # the workers' next lease in that shard takes it: due at once, never filtered
    leased = Frontier(redis_client, PARTS[2]).lease(10, 60_000)
    assert [item.slot for item in leased.items] == [host_b]


def test_a_redrive_interrupted_between_its_steps_loses_nothing(
    redis_url, redis_client, monkeypatch
):
    """Stored in the shard, then taken out of the dead letters: a crash in between leaves
    the record, which a redrive again stores a second time (at least once)."""
    from distcrawl.codec import deadletter
    from distcrawl.model.deadrecord import dead_letter
    from distcrawl.producer import RedriveResult

    redis_client.hset(KEYS.meta, "shards", SHARDS)
    url = _url_in(3)
    redis_client.lpush(KEYS.dead, dead_letter("gave up: 503", url=url, source="retry"))

    def crash(*args: object) -> int:
        raise ConnectionError("lost between the steps")

    with _producer(redis_url, shards=1) as producer:
        monkeypatch.setattr(deadletter, "_forget", crash)
        with pytest.raises(ConnectionError):
            producer.redrive()
        assert [r["u"] for r in _retries(redis_client, PARTS[3])] == [url]
        assert redis_client.llen(KEYS.dead) == 1  # not lost
        monkeypatch.undo()
        assert producer.redrive() == RedriveResult(1, 0)
    assert [r["u"] for r in _retries(redis_client, PARTS[3])] == [url, url]
    assert redis_client.llen(KEYS.dead) == 0


def test_redrive_of_a_long_sharded_list_goes_page_by_page_and_keeps_the_rest_in_order(
    redis_url, redis_client, capsys
):
    from distcrawl.cli import main
    from distcrawl.codec import deadletter
    from distcrawl.model.deadrecord import dead_letter

    redis_client.hset(KEYS.meta, "shards", SHARDS)
    letters = []
    for i in range(2 * deadletter.PAGE + 100):
        if i % 10 == 3:  # a bad start URL among them, matching too
            letters.append(dead_letter("bad: 501", raw=f"http://s.test/{i}", source="start_urls"))
        else:
            url = f"http://h{i % 7}.example{i % 7}.com/{i}"
            letters.append(dead_letter(f"gave up: {500 + i % 2}", url=url, source="retry"))
    redis_client.lpush(KEYS.dead, *letters)  # the last is the newest
    matching = [r for r in map(json.loads, letters) if "501" in r["reason"]]
    main(["--redis-url", redis_url, "dead", "redrive", "site", "--error", "501"])
    assert f"re-drove {len(matching)} dead letters" in capsys.readouterr().out
    kept = [x for x in letters if "501" not in json.loads(x)["reason"]]
    assert redis_client.lrange(KEYS.dead, 0, -1) == kept[::-1]
    for shard, part in enumerate(PARTS):
        wanted = sorted(
            r["url"]
            for r in matching
            if r["source"] == "retry" and shard_of_url(r["url"], SHARDS) == shard
        )
        assert sorted(r["u"] for r in _retries(redis_client, part)) == wanted
    starts = [r["raw"].encode() for r in matching if r["source"] == "start_urls"]
    assert redis_client.lrange(KEYS.start_urls, 0, -1) == starts[::-1]  # oldest taken first


def test_domains_lists_the_slots_of_every_shard(redis_url, redis_client, capsys):
    from distcrawl.cli import main
    from distcrawl.model.queue_entry import make_entry

    redis_client.hset(KEYS.meta, "shards", SHARDS)
    for shard, part in enumerate(PARTS):
        host = f"host{shard}.test"
        for seq in range(shard + 1):
            redis_client.zadd(part.queue, {make_entry(host, 0, seq, b"x"): 0})
        redis_client.zadd(part.ready, {host: 0})
    # a slot that is no host name is coordinated in each shard its requests are in
    for part in (PARTS[1], PARTS[3]):
        redis_client.zadd(part.queue, {make_entry("10.0.0.1", 0, 9, b"x"): 0})
        redis_client.zadd(part.ready, {"10.0.0.1": 0})
    redis_client.hset(PARTS[3].inflight, "10.0.0.1", 1)
    argv = ["--redis-url", redis_url, "--json"]
    assert main([*argv, "limit", "site", "host2.test", "--concurrency", "3"]) == 0
    capsys.readouterr()

    assert main([*argv, "domains", "site"]) == 0
    rows = {r["slot"]: r for r in json.loads(capsys.readouterr().out)}
    assert {s: (r["queued"], r["in_flight"], r["shards"]) for s, r in rows.items()} == {
        "host0.test": (1, 0, [0]),
        "host1.test": (2, 0, [1]),
        "host2.test": (3, 0, [2]),
        "host3.test": (4, 0, [3]),
        "10.0.0.1": (2, 1, [1, 3]),
    }
    assert rows["host2.test"]["override"] == ":3"
    assert main([*argv, "domains", "site", "--limit", "1"]) == 0
    assert [r["slot"] for r in json.loads(capsys.readouterr().out)] == ["host3.test"]
    from distcrawl.model.frontier_admin import FrontierAdmin

    admin = FrontierAdmin(redis_client, FrontierKeys("site"))
    assert admin.slot_count() == 7  # 6 ready, 1 inflight


def test_doctor_examines_every_shard(redis_url, redis_client, capsys):
    from distcrawl.cli import main
    from distcrawl.model.queue_entry import make_entry

    redis_client.hset(KEYS.meta, "shards", SHARDS)
    redis_client.zadd(PARTS[0].queue, {make_entry("fine.test", 0, 1, b"x"): 0})
    redis_client.zadd(PARTS[0].ready, {"fine.test": 0})
    argv = ["--redis-url", redis_url, "--json", "doctor", "site"]
    assert main(argv) == 0  # a sharded crawl in order has no problem
    report = json.loads(capsys.readouterr().out)
    assert report["clean"] and report["scanned"]["queue"] == 1

    redis_client.zadd(PARTS[1].queue, {b"garbage": 0})
    redis_client.zadd(PARTS[2].queue, {make_entry("lost.test", 0, 1, b"x"): 0})
    assert main(argv) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert problems["unparsable"]["found"] == 1
    assert problems["unparsable"]["samples"][0]["shard"] == 1
    assert problems["slot_not_ready"]["samples"] == [{"slot": "lost.test", "queued": 1, "shard": 2}]

    assert main([*argv, "--repair"]) == 0
    capsys.readouterr()
    assert redis_client.zscore(PARTS[2].ready, "lost.test") is not None
    assert redis_client.llen(PARTS[1].dead) == 1  # the shard's quarantine: moved on by workers
    assert main(argv) == 0
    capsys.readouterr()


def test_import_of_a_scrapy_redis_queue_into_a_sharded_crawl(
    redis_url, redis_client, capsys, monkeypatch
):
    pytest.importorskip("scrapy_redis")
    from scrapy import Request
    from scrapy.utils.request import fingerprint

    from distcrawl.cli import main
    from distcrawl.dupefilter import FINGERPRINT_BYTES
    from tests.test_import import DUPEFILTER, PROJECT, SPIDER_NAME, seed

    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "distcrawl.settings")
    urls = _urls(per_shard=1)
    queued = [Request(urls[s][0]) for s in range(SHARDS)]
    seed(redis_client, queued)
    crawled = [Request(_url_in(s, {u for us in urls.values() for u in us})) for s in (0, 2)]
    # a scrapy-redis patched to use Scrapy's fingerprints: the queued ones are in it too
    redis_client.sadd(DUPEFILTER, *(fingerprint(r).hex() for r in queued + crawled))
    keys = FrontierKeys("mig").sharded(SHARDS)
    redis_client.hset(keys.meta, "shards", SHARDS)
    argv = ["--redis-url", redis_url, "--json", "import", "scrapy-redis", SPIDER_NAME, *PROJECT]
    argv += ["--namespace", "mig", "--trust-pickle"]

    # the project's settings must say how many shards: they route the requests
    assert main(argv) != 0
    assert "DISTCRAWL_SHARDS" in capsys.readouterr().err
    assert main([*argv, "-s", f"DISTCRAWL_SHARDS={SHARDS}"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["queued"] == SHARDS
    for shard in range(SHARDS):
        assert _queued_urls(redis_client, keys.of_shard(shard)) == urls[shard]
    assert redis_client.zcard(keys.queue) == 0
    # the dupefilter's fingerprints tell no URL: copied into every shard
    assert report["fingerprints"] == "crawl" and report["converted"] == len(crawled)
    assert any("DISTCRAWL_SHARDS" in note for note in report["notes"])
    fps = [fingerprint(r)[:FINGERPRINT_BYTES] for r in crawled]
    for shard in range(SHARDS):
        assert all(redis_client.smismember(keys.of_shard(shard).seen, fps))


def test_commit_lua_holds_a_shards_start_request_back_at_the_cap_and_says_where(redis_client):
    """Kind 'S' at the pending cap: not stored, counted held, and reported at -p - 1, so that
    the worker leaves its entry claimed (sharded_batch.stored_start_entries)."""
    from distcrawl.model.frontier import Frontier
    from distcrawl.model.records import Politeness

    part = Frontier(redis_client, PARTS[1], Politeness(max_pending=1))
    first = Entry(EntryKind.REQUEST, b"f1", 0, b"p1", b"", "h")
    assert part.commit([], [first]).enqueued == 1
    held = Entry(EntryKind.SHARD_START, b"f2", 0, b"p2", b"raw", "h")
    kept = Entry(EntryKind.SHARD_START, b"f3", 5, b"p3", b"raw3", "h")
    result = Frontier(redis_client, PARTS[1], Politeness(max_pending=1, keep_priority=5)).commit(
        [], [held, kept], positions=True
    )
    assert (result.held, result.enqueued, result.not_stored) == (1, 1, (-1,))
    # no claim list of the shard was touched: the claim is the crawl's
    assert redis_client.keys(f"{PARTS[1].prefix}claims*") == []


def test_a_merged_commit_counts_each_shards_queue_once_at_its_last_reading():
    shards = _shards()
    a, b = _request(_url_in(0), EntryKind.REQUEST), _request(_url_in(1), EntryKind.REQUEST)
    (phase,) = shards.plan("c", [], [a, b], [])
    first, second = sorted(phase, key=lambda p: p.shard)
    later = dataclasses.replace(first, id="c:later")
    results = [
        CommitResult(enqueued=1, queue_size=10),
        CommitResult(enqueued=1, queue_size=20),
        CommitResult(queue_size=11),  # shard 0 again, read after its first part
    ]
    merged = merge_commits([first, second, later], results)
    assert (merged.enqueued, merged.queue_size) == (2, 31)
