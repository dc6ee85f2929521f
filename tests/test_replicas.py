"""DISTCRAWL_WAIT_REPLICAS on a master that lost its replica (a failover's new master, a
replica killed): commits do not wait the whole timeout for a replica that cannot answer,
they are counted as unreplicated, one warning says so, and commits wait again once a
replica is back. Real redis-servers: a master and its replica, killed by PID."""

from __future__ import annotations

import time

import pytest

from distcrawl.codec.serialize import RequestCodec
from distcrawl.engine._batch_types import Batch, Commit
from distcrawl.engine.batch import Runner
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.records import Entry, EntryKind
from distcrawl.model.shards import Shards, shard_of_url
from tests.support import page_fetches, stat, wait_until
from tests.test_shards import _linked_sites

SHARDS = 2
KEYS = FrontierKeys("site").sharded(SHARDS)
CRAWL_KEYS = FrontierKeys("site").sharded(4)


class _Req:
    def __init__(self, url: str) -> None:
        self.url = url


def _url_in(shard: int, start: int = 0) -> str:
    for i in range(start, start + 10_000):
        url = f"http://host{i}.example{i}.com/"
        if shard_of_url(url, SHARDS) == shard:
            return url
    raise AssertionError("no URL found")


def _entry(url: str) -> Entry:
    slot = url.split("/")[2]
    return Entry(EntryKind.REQUEST, b"fp" + url.encode(), 0, b"payload", b"", slot, _Req(url))


def _waits(client) -> int:
    return int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def _connected(client) -> int:
    return int(client.info("replication")["connected_slaves"])


@pytest.fixture
def replicated(redis_server, redis_client, redis_replica):
    replica = redis_replica(redis_server)
    with replica.client() as client:
        assert wait_until(lambda: client.info("replication")["master_link_status"] == "up", 10)
    assert wait_until(lambda: _connected(redis_client) == 1, 10)
    return replica


def test_commits_to_a_master_without_its_replica_do_not_wait(redis_client, replicated):
    parts = [Frontier(redis_client, KEYS.of_shard(i)) for i in range(SHARDS)]
    shards = Shards(Frontier(redis_client, KEYS), parts)
    runner = Runner(
        shards.crawl,
        RequestCodec(),
        shards=shards,
        wait_replicas=1,
        wait_replicas_ms=1500,
        replica_recheck=0.2,
        lease_ms=60_000,
        worker_timeout_ms=10_000,
    )
    rounds = iter(range(1000))

    def commit_across_shards():
        """A page leased in shard 0 whose child goes to shard 1: a first phase, waited."""
        n = next(rounds) * 100
        parts[0].commit([], [_entry(_url_in(0, n))])
        (parent,) = parts[0].lease(1, 60_000).items
        waits = _waits(redis_client)
        began = time.monotonic()
        res = runner.run(Batch(commits=[Commit([parent.ref], [_entry(_url_in(1, n))], [])]))
        took = time.monotonic() - began
        assert res.commit_error is None and res.commits_done == 1, res.commit_error
        return res, _waits(redis_client) - waits, took

    res, waits, _ = commit_across_shards()
    assert (res.replicas, waits, res.wait_skipped, res.replica_changes) == (1, 1, 0, [])
    replicated.kill()  # SIGKILL by PID
    assert wait_until(lambda: _connected(redis_client) == 0, 10)
    time.sleep(0.25)  # a reading is due
    after_kill = [commit_across_shards() for _ in range(4)]
    print(
        "replica killed: per commit (WAITs sent, replicas, seconds):",
        [(w, r.replicas, round(t, 3)) for r, w, t in after_kill],
    )
    (lost,) = after_kill[0][0].replica_changes  # said once
    assert lost.lost and lost.connected == 0 and lost.wanted == 1
    for res, waits, _ in after_kill:
        assert waits == 0 and res.wait_skipped == 1 and res.replicas == 0
    assert all(not res.replica_changes for res, _, _ in after_kill[1:])
    replicated.resume()  # back on its port: it syncs again
    assert wait_until(lambda: _connected(redis_client) == 1, 10)
    time.sleep(0.25)
    res, waits, _ = commit_across_shards()
    (back,) = res.replica_changes
    assert not back.lost and back.connected == 1
    assert waits == 1 and res.wait_skipped == 0 and res.replicas == 1


def test_a_crawl_whose_replica_dies_stops_waiting_warns_once_and_waits_again(
    demo_site, workers, redis_client, replicated
):
    """A real worker, four shards on a master with a replica (the site on 127.0.0.4 links to
    the two in another shard: its commits cross shards and wait); the replica SIGKILLed
    mid-crawl, then started again on its port."""
    sites, args = _linked_sites(demo_site, count=3, pages=60)
    for site in sites:
        redis_client.lpush(CRAWL_KEYS.start_urls, site.url + "/")
    w = workers(
        1,
        spider_args=args,
        DOWNLOAD_DELAY=0.2,
        DISTCRAWL_SHARDS=4,
        DISTCRAWL_WAIT_REPLICAS=1,
        DISTCRAWL_WAIT_REPLICAS_TIMEOUT=1.0,
        DISTCRAWL_IDLE_TIMEOUT=3,
    )
    total = sum(len(s.expected_pages()) for s in sites)

    def fetched() -> int:
        return sum(len(page_fetches(s)) for s in sites)

    assert wait_until(lambda: fetched() >= 10 and _waits(redis_client) > 0, 60), w.log()[-3000:]
    replicated.kill()
    assert wait_until(lambda: _connected(redis_client) == 0, 10)
    killed_at, waits_at_kill = fetched(), _waits(redis_client)
    assert wait_until(lambda: "fewer than DISTCRAWL_WAIT_REPLICAS" in w.log(), 30), w.log()
    time.sleep(2)
    waits_without = _waits(redis_client) - waits_at_kill
    pages_without = fetched() - killed_at
    replicated.resume()
    assert wait_until(lambda: "connected replicas again" in w.log(), 30), w.log()[-3000:]
    waits_back = _waits(redis_client)
    assert w.wait(120) == 0, w.log()[-3000:]
    log = w.log()
    waits_after = _waits(redis_client) - waits_back
    print(
        f"replica killed: {pages_without} pages in the 2 s after the warning, "
        f"{waits_without} WAITs from the kill to then; {waits_after} WAITs after it came back; "
        f"unreplicated {stat(w, 'distcrawl/commit/unreplicated')}, skipped "
        f"{stat(w, 'distcrawl/commit/wait_skipped')}; {fetched()} of {total} pages"
    )
    assert log.count("fewer than DISTCRAWL_WAIT_REPLICAS") == 1
    assert log.count("connected replicas again") == 1
    # the commit in flight at the kill may wait the timeout once, none after it
    assert log.count("reached 0 of 1 replicas") <= 1
    assert waits_without <= 1 and pages_without > 0
    assert waits_after > 0  # waiting again with the replica back
    assert stat(w, "distcrawl/commit/wait_skipped") > 0
    assert stat(w, "distcrawl/commit/unreplicated") >= stat(w, "distcrawl/commit/wait_skipped")
    for site in sites:
        assert set(page_fetches(site)) == site.expected_pages()
