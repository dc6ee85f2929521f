"""The batch runner against a real redis-server: a commit Redis refuses is split to find the
entry it refuses, and the rest is stored once."""

from __future__ import annotations

import json

import pytest
import redis

from distcrawl.codec.serialize import RequestCodec
from distcrawl.engine._batch_types import Batch, BatchResult, Commit, Rider
from distcrawl.engine.batch import Runner
from distcrawl.model.connection import make_redis
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.ops import Op
from distcrawl.model.queue_entry import LeaseRef
from distcrawl.model.records import Entry, EntryKind
from distcrawl.model.refusals import refused

LEASE = {"lease_ms": 60_000, "worker_timeout_ms": 10_000}


@pytest.fixture
def runner(redis_client):
    frontier = Frontier(redis_client, FrontierKeys("t"))
    return Runner(frontier, RequestCodec(), **LEASE)


def test_replies_that_say_redis_cannot_commit_now_are_not_refusals():
    assert refused(redis.ResponseError("distcrawl: invalid commit: entry 2: slot contains NUL"))
    assert refused(redis.ResponseError("Error running script: attempt to index nil"))
    for transient in ("OOM command not allowed", "BUSY Redis is busy", "LOADING", "READONLY x"):
        assert not refused(redis.ResponseError(transient))
    assert not refused(redis.ConnectionError("gone"))
    wrapped = (
        "Error running script (call to f_0123): @user_script:42: @user_script: 42: NOPERM this "
        "user has no permissions to run the 'hincrby' command"
    )
    assert not refused(redis.ResponseError(wrapped))
    assert not refused(redis.ResponseError("ERR ... -OOM command not allowed when used memory"))
    # as redis-py 8 raises them: the code stripped, a subclass instead (tests/test_redis_full.py
    # has a real server's)
    stripped = (
        "command not allowed when used memory > 'maxmemory'. script: 6fd0, on @user_script:13."
    )
    assert not refused(redis.exceptions.OutOfMemoryError(stripped, status_code="OOM"))
    assert not refused(redis.ResponseError(stripped))
    assert not refused(
        redis.exceptions.ReadOnlyError("You can't write against a read only replica.")
    )


def test_a_refused_commit_is_split_and_only_the_bad_entry_dead_lettered(runner, redis_client):
    frontier = runner.frontier
    frontier.commit([], [Entry(EntryKind.REQUEST, b"p", 0, b"parent", b"", "t.test")])
    (parent,) = frontier.lease(1, 60_000).items
    entries = [
        Entry(EntryKind.REQUEST, f"{i}".encode(), 0, f"c{i}".encode(), b"", "t.test")
        for i in range(7)
    ]
    entries.insert(3, Entry(EntryKind.REQUEST, b"bad", 0, b"bad", b"", "a\0b"))  # what Lua refuses
    entries.append(Entry(EntryKind.RETRY, b"", 0, b"retry", b"60000", "t.test"))
    commit = Commit([parent.ref], entries, [])
    res = BatchResult()
    with pytest.raises(redis.ResponseError):
        runner.commit(commit, res)  # whole: refused, nothing written
    assert redis_client.zcard("t:queue") == 0
    commit.split = True
    total = runner.commit(commit, res)
    assert res.split_dead == 1 and commit.stored == len(entries)
    assert total.enqueued == 8 and total.dead == 1
    assert redis_client.zcard("t:queue") == 7 and redis_client.zcard("t:delayed") == 1
    (record,) = [json.loads(r) for r in redis_client.lrange("t:dead", 0, -1)]
    assert "slot contains NUL" in record["reason"] and record["source"] == "commit"
    assert redis_client.zcard("t:leases") == 0  # the parent, acknowledged last
    # sent again (say its reply was lost: the part is not known stored): the stored pieces
    # are not stored twice
    commit.parts_done.clear()
    again = runner.commit(commit, BatchResult())
    assert again.replayed == 1
    assert redis_client.zcard("t:delayed") == 1 and redis_client.llen("t:dead") == 1


def test_renewals_and_leases_go_on_while_a_commit_is_refused(runner, redis_client):
    frontier = runner.frontier
    frontier.commit([], [Entry(EntryKind.REQUEST, b"a", 0, b"a", b"", "t.test")])
    (held,) = frontier.lease(1, 60_000).items
    frontier.commit([], [Entry(EntryKind.REQUEST, b"b", 0, b"b", b"", "t.test")])
    bad = Commit([], [Entry(EntryKind.REQUEST, b"x", 0, b"x", b"", "")], [])
    res = runner.run(Batch(commits=[bad], renew=[held.ref], want=4))
    assert refused(res.commit_error) and res.commits_done == 0
    assert res.renewed == 1 and [x.request for x in res.leased] == [None]
    assert res.leased[0].error  # "b" is not a request payload: handed over to dead-letter


def test_a_closing_batch_stores_its_start_entries_then_gives_back_the_rest(runner, redis_client):
    """Close: the commit takes the entries it stores from the claim list; what is still
    claimed (here: read, never made into entries) goes back to start_urls, to be taken next."""
    redis_client.lpush("t:start_urls", b"http://a.test/1", b"http://a.test/2", b"http://a.test/3")
    res = runner.run(Batch(peek=2))
    assert res.peeked == [b"http://a.test/1", b"http://a.test/2"]
    stored = Entry(EntryKind.START_REQUEST, b"fp1", 0, b"req", b"http://a.test/1", "a.test")
    res = runner.run(Batch(commits=[Commit([], [stored], [])], unclaim=True))
    assert (res.commits_done, res.committed.enqueued, res.unclaimed) == (1, 1, 1)
    assert redis_client.lrange("t:start_urls", 0, -1) == [b"http://a.test/3", b"http://a.test/2"]
    assert redis_client.exists(f"t:claims:{runner.frontier.tag}", "t:claimants") == 0


def _reads(client: redis.Redis) -> int:
    """Socket reads of the server so far, this INFO's included (a pipeline arrives in one)."""
    return int(client.info("stats")["total_reads_processed"])


def _setup(frontier: Frontier) -> tuple[LeaseRef, LeaseRef]:
    """Two leased requests, and three more queued."""
    entries = [
        Entry(EntryKind.REQUEST, f"{i}".encode(), 0, f"p{i}".encode(), b"", "t.test")
        for i in range(5)
    ]
    frontier.commit([], entries)
    first, second = frontier.lease(2, 60_000).items
    return first.ref, second.ref


def test_a_batch_is_one_round_trip_with_the_results_of_its_steps_one_by_one(redis_client):
    one = Runner(Frontier(redis_client, FrontierKeys("a")), RequestCodec(), **LEASE)
    keys_b = FrontierKeys("b")
    two = Frontier(redis_client, keys_b)
    a1, a2 = _setup(one.frontier)
    b1, b2 = _setup(two)
    child = [Entry(EntryKind.REQUEST, b"c", 0, b"child", b"", "t.test")]
    commit = Commit([a1], child, [])
    one.frontier.scripts.load(redis_client)  # as after a first batch: no NOSCRIPT
    before = _reads(redis_client)
    res = one.run(Batch(commits=[commit], freed=[a1], renew=[a2], want=2, peek=3))
    assert _reads(redis_client) - before - 1 == 1  # less the second INFO
    assert res.error is None and res.commit_error is None and res.commits_done == 1
    # the same steps, one call each, on the same data in another namespace
    freed = two.places([b1])
    committed = two.commit([b1], child, commit_id="x", positions=True)
    renewed = two.renew([b2], 60_000)
    lease = two.lease(2, 60_000)
    assert (res.freed, res.taken) == freed
    assert res.committed == committed and res.renewed == renewed == 1
    assert res.lease is not None
    assert [i.payload for i in res.lease.items] == [i.payload for i in lease.items]
    assert res.lease.queue_size == lease.queue_size and res.peeked == []


def test_noscript_after_a_flush_is_recovered_in_the_same_batch(runner, redis_client):
    frontier = runner.frontier
    held, _ = _setup(frontier)
    redis_client.script_flush()
    entries = [Entry(EntryKind.REQUEST, b"n", 0, b"new", b"", "t.test")]
    commit = Commit([held], entries, [])
    res = runner.run(Batch(commits=[commit], renew=[held], want=1, reclaim=True))
    assert res.error is None and res.commit_error is None and res.commits_done == 1
    assert res.committed is not None and res.committed.enqueued == 1
    assert res.committed.replayed == 0  # run once: a second run would be a replay
    assert res.renewed == 0  # acknowledged by the commit before it
    assert res.lease is not None and len(res.lease.items) == 1
    assert res.requeue is not None
    # 5 + 1 stored, 2 leased (1 of them acknowledged), then 1 more leased: once
    assert redis_client.zcard("t:queue") == 3 and redis_client.zcard("t:leases") == 2


def test_a_reply_lost_mid_batch_is_a_connection_error_and_the_commit_replays(
    redis_proxy, redis_client
):
    client = make_redis(redis_proxy.url)
    runner = Runner(Frontier(client, FrontierKeys("t")), RequestCodec(), **LEASE)
    held, other = _setup(runner.frontier)
    lease_sha = runner.frontier.scripts.lease.sha.encode()
    redis_proxy.drop_reply_once(lambda args: args[:2] == [b"EVALSHA", lease_sha])
    commit = Commit([held], [Entry(EntryKind.REQUEST, b"n", 0, b"new", b"", "t.test")], [])
    res = runner.run(Batch(commits=[commit], renew=[other], want=1))
    assert isinstance(res.commit_error, redis.ConnectionError) and res.commits_done == 0
    assert isinstance(res.error, redis.ConnectionError)
    assert res.lease is None and res.committed is None
    # the commit ran: sent again as the scheduler does, it is recognised and changes nothing
    again = runner.run(Batch(commits=[commit]))
    assert again.committed is not None and again.committed.replayed == 1
    assert redis_client.zcard("t:queue") == 3  # 5 + 1, 2 leased before, 1 by the lost lease
    client.close()


def test_a_beat_and_riders_go_with_the_batch(runner, redis_client):
    got: list[list[object]] = []
    rider = Rider([Op("", [], ["ZCARD", "t:queue"], int)], got.append)
    res = runner.run(Batch(want=1, riders=[rider]))
    assert res.riders == [[0]] and res.error is None
    bad = Rider([Op("", [], ["INCR", "t:queue"], int)], got.append)
    redis_client.zadd("t:queue", {"x": 1})
    res = runner.run(Batch(riders=[bad]))
    assert isinstance(res.riders[0][0], redis.ResponseError)
    assert res.error is None  # a rider's failure is its own


def test_a_reclaim_sweeps_finished_slots_in_the_same_round_trip(runner, redis_client):
    old = redis_client.time()[0] * 1000 - 120_000
    redis_client.hset("t:slots", mapping={"done.test": old, "busy.test": old})
    redis_client.hset("t:inflight", "busy.test", 1)
    runner.run(Batch(renew=[LeaseRef("x", b"0" * 8)]))  # the scripts are loaded
    reads = _reads(redis_client)
    res = runner.run(Batch(reclaim=True))
    # the election's round trip (SET <ns>:reaper NX PX), the reaper's, and this INFO
    assert _reads(redis_client) - reads == 3
    assert res.error is None and res.requeue is not None
    assert res.swept is not None and res.swept.forgotten == 1
    assert redis_client.hkeys("t:slots") == [b"busy.test"]


def test_a_commit_that_queues_requests_pushes_wake_up_tokens(runner, redis_client):
    """The wake-up list: a commit pushes one token per request it queues (at most 16, kept
    about a second), duplicates and retries none; a parked worker waits on it (BLPOP,
    tests/test_idle.py)."""
    frontier = runner.frontier
    frontier.commit(
        [], [Entry(EntryKind.REQUEST, f"{i}".encode(), 0, b"x", b"", "t.test") for i in range(3)]
    )
    assert redis_client.llen("t:wake") == 3
    assert 0 < redis_client.pttl("t:wake") <= 1000
    frontier.commit([], [Entry(EntryKind.REQUEST, b"0", 0, b"x", b"", "t.test")])  # a duplicate
    frontier.commit([], [Entry(EntryKind.RETRY, b"", 0, b"retry", b"60000", "t.test")])  # a retry
    assert redis_client.llen("t:wake") == 3
    many = [Entry(EntryKind.REQUEST, f"m{i}".encode(), 0, b"x", b"", "t.test") for i in range(40)]
    frontier.commit([], many)
    assert redis_client.llen("t:wake") == 16
    redis_client.delete("t:wake", "t:queue")
