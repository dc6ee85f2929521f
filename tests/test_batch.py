"""The batch runner against a real redis-server: a commit Redis refuses is split to find the
entry it refuses, and the rest is stored once."""

from __future__ import annotations

import json

import pytest
import redis

from distcrawl.batch import Batch, BatchResult, Commit, Runner, refused
from distcrawl.frontier import Entry, Frontier
from distcrawl.keys import FrontierKeys
from distcrawl.serialize import RequestCodec


@pytest.fixture
def runner(redis_client):
    frontier = Frontier(redis_client, FrontierKeys("t"))
    return Runner(frontier, RequestCodec(), lease_ms=60_000, worker_timeout_ms=10_000)


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


def test_a_refused_commit_is_split_and_only_the_bad_entry_dead_lettered(runner, redis_client):
    frontier = runner.frontier
    frontier.commit([], [Entry("r", b"p", 0, b"parent", b"", "t.test")])
    (parent,) = frontier.lease(1, 60_000).items
    entries = [Entry("r", f"{i}".encode(), 0, f"c{i}".encode(), b"", "t.test") for i in range(7)]
    entries.insert(3, Entry("r", b"bad", 0, b"bad", b"", "a\0b"))  # what Lua refuses
    entries.append(Entry("l", b"", 0, b"retry", b"60000", "t.test"))
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
    # sent again (say its reply was lost): the stored pieces are not stored twice
    again = runner.commit(commit, BatchResult())
    assert again.replayed == 1
    assert redis_client.zcard("t:delayed") == 1 and redis_client.llen("t:dead") == 1


def test_renewals_and_leases_go_on_while_a_commit_is_refused(runner, redis_client):
    frontier = runner.frontier
    frontier.commit([], [Entry("r", b"a", 0, b"a", b"", "t.test")])
    (held,) = frontier.lease(1, 60_000).items
    frontier.commit([], [Entry("r", b"b", 0, b"b", b"", "t.test")])
    bad = Commit([], [Entry("r", b"x", 0, b"x", b"", "")], [])
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
    stored = Entry("s", b"fp1", 0, b"req", b"http://a.test/1", "a.test")
    res = runner.run(Batch(commits=[Commit([], [stored], [])], unclaim=True))
    assert (res.commits_done, res.committed.enqueued, res.unclaimed) == (1, 1, 1)
    assert redis_client.lrange("t:start_urls", 0, -1) == [b"http://a.test/3", b"http://a.test/2"]
    assert redis_client.exists(f"t:claims:{runner.frontier.tag}", "t:claimants") == 0
