"""The frontier's scripts against a real redis-server."""

import json
import time

import pytest

from distcrawl.frontier import Entry, Frontier, dead_letter
from distcrawl.keys import FrontierKeys


@pytest.fixture
def frontier(redis_client):
    return Frontier(redis_client, FrontierKeys("t"))


def push(frontier, *items, acks=()):
    entries = [Entry("r", fp, prio, payload) for fp, prio, payload in items]
    return frontier.commit(list(acks), entries)


def test_priority_then_fifo(frontier):
    push(
        frontier,
        (b"a", 0, b"a0"),
        (b"b", 5, b"b5"),
        (b"c", 0, b"c0"),
        (b"d", 5, b"d5"),
        (b"e", -1, b"e-1"),
        (b"f", 0, b"f0"),
    )
    leased, remaining = frontier.lease(10, 10_000)[:2]
    assert [x.payload for x in leased] == [b"b5", b"d5", b"a0", b"c0", b"f0", b"e-1"]
    assert [x.priority for x in leased] == [5, 5, 0, 0, 0, -1]
    assert remaining == 0


def test_fifo_holds_across_many_equal_priorities(frontier):
    push(frontier, *[(str(i).encode(), 0, str(i).encode()) for i in range(300)])
    leased, _ = frontier.lease(300, 10_000)[:2]
    assert [int(x.payload) for x in leased] == list(range(300))


def test_seen_set_deduplicates_and_dont_filter_bypasses(frontier, redis_client):
    r1 = push(frontier, (b"fp", 0, b"x"), (b"fp", 0, b"x"), (b"", 0, b"y"), (b"", 0, b"y"))
    assert (r1.enqueued, r1.duplicates) == (3, 1)
    r2 = push(frontier, (b"fp", 0, b"x"))
    assert (r2.enqueued, r2.duplicates) == (0, 1)
    assert redis_client.scard("t:seen") == 1


def test_lease_is_not_a_delete_and_ack_is(frontier, redis_client):
    push(frontier, (b"a", 0, b"a"))
    (item,), _ = frontier.lease(5, 10_000)[:2]
    assert frontier.sizes()["leased"] == 1
    assert redis_client.hexists("t:requests", item.id)
    frontier.commit([item.id], [])
    assert frontier.sizes()["leased"] == 0
    assert not redis_client.hexists("t:requests", item.id)


def test_expired_lease_returns_to_the_queue_at_its_priority(frontier):
    push(frontier, (b"a", 3, b"a"), (b"b", 1, b"b"))
    leased, _ = frontier.lease(1, 100)[:2]  # takes "a" with a 0.1 s lease
    assert leased[0].payload == b"a"
    assert frontier.requeue_expired() == 0
    time.sleep(0.25)
    assert frontier.requeue_expired() == 1
    again, _ = frontier.lease(5, 10_000)[:2]
    assert [x.payload for x in again] == [b"a", b"b"]  # priority kept


def test_renew_keeps_a_lease_alive(frontier):
    push(frontier, (b"a", 0, b"a"))
    (item,), _ = frontier.lease(1, 300)[:2]
    for _ in range(3):
        time.sleep(0.15)
        assert frontier.renew([item.id], 300) == 1
    assert frontier.requeue_expired() == 0
    time.sleep(0.4)
    assert frontier.requeue_expired() == 1
    assert frontier.renew([item.id], 300) == 0  # requeued: no longer ours to renew


def test_ack_after_requeue_removes_it_from_the_queue(frontier):
    push(frontier, (b"a", 0, b"a"))
    (item,), _ = frontier.lease(1, 50)[:2]
    time.sleep(0.1)
    frontier.requeue_expired()
    frontier.commit([item.id], [])  # the slow worker finished after all
    assert frontier.sizes()["queue"] == 0


def test_release_gives_back_unstarted_requests(frontier):
    push(frontier, (b"a", 0, b"a"), (b"b", 0, b"b"))
    leased, _ = frontier.lease(2, 60_000)[:2]
    assert frontier.release([x.id for x in leased]) == 2
    assert frontier.sizes() == {
        "queue": 2,
        "leased": 0,
        "delayed": 0,
        "seen": 2,
        "start_urls": 0,
        "dead": 0,
    }


def test_start_entry_is_taken_once(frontier, redis_client):
    redis_client.lpush("t:start_urls", b"http://a.test/", b"http://b.test/")
    assert frontier.peek_start_urls(10) == [b"http://a.test/", b"http://b.test/"]
    # two workers peeked the same entry: only the first commit takes it
    first = frontier.commit([], [Entry("s", b"fa", 0, b"A", b"http://a.test/")])
    second = frontier.commit([], [Entry("s", b"fa2", 0, b"A", b"http://a.test/")])
    assert (first.enqueued, second.enqueued, second.skipped) == (1, 0, 1)
    assert redis_client.lrange("t:start_urls", 0, -1) == [b"http://b.test/"]


def test_bad_start_entry_moves_to_dead_letters(frontier, redis_client):
    redis_client.lpush("t:start_urls", b"not a url")
    record = dead_letter("not a URL", raw=b"not a url", source="start_urls")
    result = frontier.commit([], [Entry("x", b"", 0, record, b"not a url")])
    assert result.dead == 1
    assert redis_client.llen("t:start_urls") == 0
    stored = json.loads(redis_client.lindex("t:dead", 0))
    assert stored["reason"] == "not a URL" and stored["raw"] == "not a url"
    assert stored["source"] == "start_urls" and stored["worker"]


def test_clear_removes_only_this_namespace(frontier, redis_client):
    push(frontier, (b"a", 0, b"a"))
    redis_client.set("other:queue", b"keep")
    frontier.clear()
    assert redis_client.keys("t:*") == []
    assert redis_client.get("other:queue") == b"keep"


def test_delayed_retry_waits_then_joins_the_queue_at_its_priority(frontier):
    push(frontier, (b"a", 0, b"a0"))
    frontier.commit([], [Entry("l", b"", 7, b"retry", b"300")])  # due in 0.3 s
    first = frontier.lease(10, 10_000)
    assert [x.payload for x in first.items] == [b"a0"]
    assert (first.delayed, first.released) == (1, 0)
    time.sleep(0.4)
    second = frontier.lease(10, 10_000)
    assert [x.payload for x in second.items] == [b"retry"]
    assert second.items[0].priority == 7
    assert (second.delayed, second.released) == (0, 1)


def test_delayed_retry_is_not_filtered_by_the_seen_set(frontier):
    push(frontier, (b"fp", 0, b"x"))
    result = frontier.commit([], [Entry("l", b"", 0, b"x-again", b"0")])
    assert result.enqueued == 1


def test_redrive_moves_each_record_once(frontier, redis_client):
    redis_client.lpush("t:dead", b"rec-1", b"rec-2")
    moves = [(b"rec-1", "q", "a.test", 3, b"payload-1"), (b"rec-2", "u", "", 0, b"http://a.test/")]
    assert frontier.redrive(moves) == 2
    assert frontier.redrive(moves) == 0  # already taken: nothing twice
    assert redis_client.llen("t:dead") == 0
    assert redis_client.lrange("t:start_urls", 0, -1) == [b"http://a.test/"]
    (item,) = frontier.lease(5, 10_000).items
    assert (item.payload, item.priority, item.slot) == (b"payload-1", 3, "a.test")
