"""Bounded work per script call: a commit of more than COMMIT_CALL_MAX entries and
acknowledgements (a start-URL batch of thousands, a page of thousands of links) is sent as
several commit.lua calls of at most that many, entries first, each recognised as a replay
on its own, against a real redis-server."""

from __future__ import annotations

import redis

from distcrawl.codec.serialize import RequestCodec
from distcrawl.engine._batch_types import Batch, Commit
from distcrawl.engine.batch import Runner
from distcrawl.model.connection import make_redis
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import LeaseRef
from distcrawl.model.records import Entry, EntryKind, Feedback
from distcrawl.model.shards import COMMIT_CALL_MAX, CommitPart, bounded

LEASE = {"lease_ms": 60_000, "worker_timeout_ms": 10_000}
#: a commit of two calls and a half
BIG = 2 * COMMIT_CALL_MAX + COMMIT_CALL_MAX // 2


def _start_entries(client: redis.Redis, runner: Runner, count: int) -> list[Entry]:
    """``count`` start URLs pushed and claimed by the runner's worker, made into entries."""
    urls = [f"http://h{i % 7}.test/{i}".encode() for i in range(count)]
    client.rpush("t:start_urls", *urls)
    claimed = runner.run(Batch(peek=count)).peeked
    assert len(claimed) == count
    return [
        Entry(
            EntryKind.START_REQUEST, b"fp%d" % i, 0, b"req" + raw, raw, raw.split(b"/")[2].decode()
        )
        for i, raw in enumerate(claimed)
    ]


def _leased(frontier: Frontier) -> LeaseRef:
    frontier.commit([], [Entry(EntryKind.REQUEST, b"parent", 0, b"parent", b"", "p.test")])
    (item,) = frontier.lease(1, 60_000).items
    return item.ref


def _commit_calls(client: redis.Redis, sha: str) -> list[int]:
    """The argument count of every commit.lua call in SLOWLOG (logging every command)."""
    counts = []
    for e in reversed(client.slowlog_get(10_000)):
        words = e["command"].split(b" ")
        if words[:2] != [b"EVALSHA", sha.encode()]:
            continue
        # SLOWLOG keeps 32 arguments, the last saying how many more there were
        more = int(words[-3].lstrip(b"(")) if words[-1] == b"arguments)" else 0
        counts.append(32 - 1 + more if more else len(words))
    return counts


def test_a_huge_commit_is_sent_as_bounded_calls_entries_first(redis_client):
    runner = Runner(Frontier(redis_client, FrontierKeys("t")), RequestCodec(), **LEASE)
    frontier = runner.frontier
    parent = _leased(frontier)
    entries = _start_entries(redis_client, runner, BIG)
    feedback = [Feedback("p.test", 1, 10, 0, 0)]
    redis_client.config_set("slowlog-log-slower-than", 0)
    redis_client.config_set("slowlog-max-len", 10_000)
    redis_client.slowlog_reset()
    res = runner.run(Batch(commits=[Commit([parent], entries, feedback)]))
    assert res.error is None and res.commit_error is None and res.commits_done == 1
    assert res.committed is not None and res.committed.enqueued == BIG
    # every entry stored once, the claim list emptied, the parent acknowledged
    assert redis_client.zcard("t:queue") == BIG
    assert redis_client.llen(f"t:claims:{frontier.tag}") == 0
    assert redis_client.zcard("t:leases") == 0
    # three calls: two of COMMIT_CALL_MAX entries, then the rest with the acknowledgement
    # and the feedback (KEYS, then 7 arguments, 2 per ack, 1 + 6 per entry, 1 + 5 per record)
    keys = len(frontier.keys.script_keys("commit", frontier.tag))
    fixed = 3 + keys + 7 + 1 + 1
    last = BIG - 2 * COMMIT_CALL_MAX
    expected = [fixed + 6 * COMMIT_CALL_MAX] * 2 + [fixed + 2 + 6 * last + 5]
    assert _commit_calls(redis_client, frontier.scripts.commit.sha) == expected


def test_a_commit_within_the_bound_is_one_call(redis_client):
    runner = Runner(Frontier(redis_client, FrontierKeys("t")), RequestCodec(), **LEASE)
    entries = _start_entries(redis_client, runner, COMMIT_CALL_MAX)
    redis_client.config_set("slowlog-log-slower-than", 0)
    redis_client.slowlog_reset()
    res = runner.run(Batch(commits=[Commit([], entries, [])]))
    assert res.committed is not None and res.committed.enqueued == COMMIT_CALL_MAX
    assert len(_commit_calls(redis_client, runner.frontier.scripts.commit.sha)) == 1


def test_a_reply_lost_between_pieces_leaves_the_ack_unsent_and_the_retry_stores_each_once(
    redis_proxy, redis_client
):
    client = make_redis(redis_proxy.url)
    runner = Runner(Frontier(client, FrontierKeys("t")), RequestCodec(), **LEASE)
    frontier = runner.frontier
    parent = _leased(frontier)
    entries = _start_entries(redis_client, runner, BIG)
    sha = frontier.scripts.commit.sha.encode()
    seen = []

    def second_commit_call(args: list[bytes]) -> bool:
        if args[:2] == [b"EVALSHA", sha]:
            seen.append(1)
        return len(seen) == 2

    redis_proxy.drop_reply_once(second_commit_call)
    commit = Commit([parent], entries, [])
    res = runner.run(Batch(commits=[commit]))
    assert isinstance(res.commit_error, redis.ConnectionError) and res.commits_done == 0
    # two pieces ran (the second's reply was lost); the parent is still leased
    assert redis_client.zcard("t:queue") == 2 * COMMIT_CALL_MAX
    assert redis_client.zcard("t:leases") == 1
    again = runner.run(Batch(commits=[commit]))
    assert again.commit_error is None and again.commits_done == 1
    assert again.committed is not None and again.committed.replayed == 1  # the lost piece
    assert redis_client.zcard("t:queue") == BIG  # nothing stored twice, nothing lost
    assert redis_client.zcard("t:leases") == 0 and redis_client.hlen("t:requests") == 0
    assert redis_client.llen(f"t:claims:{frontier.tag}") == 0
    client.close()


def _entry(i: int) -> Entry:
    return Entry(EntryKind.REQUEST, b"%d" % i, 0, b"p", b"", "s.test")


def test_bounded_cuts_parts_into_pieces_that_end_with_the_phase():
    acks = [LeaseRef(f"{i:012x}", b"t" * 8, 0) for i in range(COMMIT_CALL_MAX + 3)]
    fb = [Feedback("s.test", 1, 1, 0, 0)]
    big = CommitPart(0, "c:0", acks, [_entry(i) for i in range(150)], fb, list(range(150)))
    small = CommitPart(1, "c:1", acks[:2], [_entry(0)], [], [7])
    phases = bounded([[big, small]])
    assert [[(p.shard, p.id) for p in phase] for phase in phases] == [
        [(0, "c:0:p0")],
        [(0, "c:0:p1")],
        [(0, "c:0:p2")],
        [(0, "c:0"), (1, "c:1")],
    ]
    pieces = [phase[0] for phase in phases]
    # entries first, in order with their positions, then acknowledgements; feedback last
    assert [len(p.entries) for p in pieces] == [100, 50, 0, 0]
    assert [len(p.acks) for p in pieces] == [0, 0, 100, 3]
    assert [p.positions[:1] for p in pieces] == [[0], [100], [], []]
    assert [p.feedback for p in pieces] == [[], [], [], fb]
    assert all(len(p.entries) + len(p.acks) <= COMMIT_CALL_MAX for p in pieces)
    assert [e for p in pieces for e in p.entries] == big.entries
    assert [a for p in pieces for a in p.acks] == acks
    # a part that fits is left as it is
    assert bounded([[small]]) == [[small]]
