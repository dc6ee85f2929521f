"""The frontier's scripts against a real redis-server."""

import hashlib
import itertools
import json
import time

import pytest
import redis

from distcrawl.model.deadrecord import DEAD_RAW_BYTES, dead_letter
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import LeaseRef, make_entry
from distcrawl.model.records import Entry, EntryKind, Redrive, RedriveKind
from tests.support import server_ms

#: the frontier's scripts, on Valkey too
pytestmark = pytest.mark.valkey


@pytest.fixture
def frontier(redis_client):
    return Frontier(redis_client, FrontierKeys("t"))


def push(frontier, *items, acks=()):
    entries = [
        Entry(EntryKind.REQUEST, fp, prio, payload, b"", "t.test") for fp, prio, payload in items
    ]
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
    assert frontier.admin.sizes()["leased"] == 1
    assert redis_client.hexists("t:requests", item.id)
    frontier.commit([item.ref], [])
    assert frontier.admin.sizes()["leased"] == 0
    assert not redis_client.hexists("t:requests", item.id)


def test_expired_lease_returns_to_the_queue_at_its_priority(frontier):
    push(frontier, (b"a", 3, b"a"), (b"b", 1, b"b"))
    leased, _ = frontier.lease(1, 100)[:2]  # takes "a" with a 0.1 s lease
    assert leased[0].payload == b"a"
    assert frontier.requeue_expired().requeued == 0
    time.sleep(0.25)
    assert frontier.requeue_expired().requeued == 1
    again, _ = frontier.lease(5, 10_000)[:2]
    assert [x.payload for x in again] == [b"a", b"b"]  # priority kept


def test_renew_keeps_a_lease_alive(frontier):
    push(frontier, (b"a", 0, b"a"))
    (item,), _ = frontier.lease(1, 300)[:2]
    for _ in range(3):
        time.sleep(0.15)
        assert frontier.renew([item.ref], 300) == 1
    assert frontier.requeue_expired().requeued == 0
    time.sleep(0.4)
    assert frontier.requeue_expired().requeued == 1
    assert frontier.renew([item.ref], 300) == 0  # requeued: no longer ours to renew


def test_renewals_past_one_call_of_arguments_all_count(frontier, redis_client):
    """renew.lua moves every deadline in calls of at most 1,000 arguments (call_many)."""
    push(frontier, *[(str(i).encode(), 0, b"p") for i in range(1_200)])
    # a slot's concurrency bounds a lease: give the test slot room for all of them
    redis_client.hset("t:limits", "t.test", ":2000")
    held = frontier.lease(1_200, 60_000).items
    assert len(held) == 1_200
    assert frontier.renew([x.ref for x in held], 120_000) == 1_200
    assert frontier.renew([x.ref for x in held[:3]], 1_000) == 0  # never shortened


def test_one_commit_acknowledges_a_slots_leases_together(frontier, redis_client):
    """Acknowledgements are read and retired with one call each for the whole commit: each
    outcome is still the one a request on its own would have had."""
    push(frontier, *[(str(i).encode(), 0, str(i).encode()) for i in range(4)])
    held = frontier.lease(4, 60_000).items
    assert redis_client.hget("t:inflight", "t.test") == b"4"
    # one place already given back when its response left the downloader (places.lua)
    assert frontier.places([held[0].ref]).freed == 1
    assert redis_client.hget("t:inflight", "t.test") == b"3"
    stranger = LeaseRef(held[3].id, b"\x01" * 8)
    result = frontier.commit([held[0].ref, held[1].ref, held[1].ref, stranger, held[2].ref], [])
    assert (result.stale, result.missing, result.late) == (1, 1, 0)
    # three acknowledged: held[0] gave its place back before, so two more places are freed
    assert redis_client.hget("t:inflight", "t.test") == b"1"
    assert redis_client.zcard("t:leases") == 1 and redis_client.scard("t:placeless") == 0
    assert not any(redis_client.hexists("t:requests", x.id) for x in held[:3])
    assert frontier.commit([held[3].ref], []).missing == 0
    assert not redis_client.hexists("t:inflight", "t.test")


def test_a_commits_new_requests_are_checked_and_queued_in_order(frontier, redis_client):
    """One SMISMEMBER and one SADD for a commit's fingerprints, ids in entry order: the same
    fingerprint twice in one commit is queued once, and one seen before not at all."""
    push(frontier, (b"old", 0, b"old"))
    result = push(
        frontier, (b"n1", 0, b"n1"), (b"old", 0, b"x"), (b"n2", 0, b"n2"), (b"n1", 0, b"y")
    )
    assert (result.enqueued, result.duplicates) == (2, 2)
    assert redis_client.scard("t:seen") == 3
    leased = frontier.lease(10, 60_000).items
    assert [x.payload for x in leased] == [b"old", b"n1", b"n2"]
    ids = [int(x.id, 16) for x in leased]
    assert ids == sorted(ids) and int(redis_client.get("t:seq")) == ids[-1]


def test_ack_after_requeue_removes_it_from_the_queue(frontier):
    push(frontier, (b"a", 0, b"a"))
    (item,), _ = frontier.lease(1, 50)[:2]
    time.sleep(0.1)
    frontier.requeue_expired()
    frontier.commit([item.ref], [])  # the slow worker finished after all
    assert frontier.admin.sizes()["queue"] == 0


def test_release_gives_back_unstarted_requests(frontier):
    push(frontier, (b"a", 0, b"a"), (b"b", 0, b"b"))
    leased, _ = frontier.lease(2, 60_000)[:2]
    assert frontier.release([x.ref for x in leased]) == 2
    assert frontier.admin.sizes() == {
        "queue": 2,
        "leased": 0,
        "delayed": 0,
        "revisits": 0,
        "seen": 2,
        "start_urls": 0,
        "dead": 0,
    }


def test_start_entry_is_taken_once(frontier, redis_client):
    redis_client.lpush("t:start_urls", b"http://a.test/", b"http://b.test/")
    assert frontier.claim_start_urls(1) == [b"http://a.test/"]
    assert redis_client.lrange("t:start_urls", 0, -1) == [b"http://b.test/"]
    # the same entry committed twice (say, read again): only the first commit takes it
    first = frontier.commit(
        [], [Entry(EntryKind.START_REQUEST, b"fa", 0, b"A", b"http://a.test/", "a.test")]
    )
    second = frontier.commit(
        [], [Entry(EntryKind.START_REQUEST, b"fa2", 0, b"A", b"http://a.test/", "a.test")]
    )
    assert (first.enqueued, second.enqueued, second.skipped) == (1, 0, 1)
    assert redis_client.lrange("t:start_urls", 0, -1) == [b"http://b.test/"]
    assert redis_client.exists(f"t:claims:{frontier.tag}", "t:claimants") == 0


def test_bad_start_entry_moves_to_dead_letters(frontier, redis_client):
    redis_client.lpush("t:start_urls", b"not a url")
    assert frontier.claim_start_urls(10) == [b"not a url"]
    record = dead_letter("not a URL", raw=b"not a url", source="start_urls")
    result = frontier.commit([], [Entry(EntryKind.BAD_START, b"", 0, record, b"not a url")])
    assert result.dead == 1
    assert redis_client.llen("t:start_urls") == 0
    assert redis_client.llen(f"t:claims:{frontier.tag}") == 0
    stored = json.loads(redis_client.lindex("t:dead", 0))
    assert stored["reason"] == "not a URL" and stored["raw"] == "not a url"
    assert stored["source"] == "start_urls" and stored["worker"]


def test_clear_removes_only_this_namespace(frontier, redis_client):
    push(frontier, (b"a", 0, b"a"))
    redis_client.set("other:queue", b"keep")
    frontier.admin.clear()
    assert redis_client.keys("t:*") == []
    assert redis_client.get("other:queue") == b"keep"


def test_delayed_retry_waits_then_joins_the_queue_at_its_priority(frontier):
    push(frontier, (b"a", 0, b"a0"))
    frontier.commit(
        [], [Entry(EntryKind.RETRY, b"", 7, b"retry", b"300", "t.test")]
    )  # due in 0.3 s
    first = frontier.lease(10, 10_000)
    assert [x.payload for x in first.items] == [b"a0"]
    assert (first.delayed, first.released) == (1, 0)
    assert 0.2 < first.wait <= 0.3  # an idle worker asks again when the retry is due
    time.sleep(0.4)
    second = frontier.lease(10, 10_000)
    assert [x.payload for x in second.items] == [b"retry"]
    assert second.items[0].priority == 7
    assert (second.delayed, second.released) == (0, 1)


def test_delayed_retry_is_not_filtered_by_the_seen_set(frontier):
    push(frontier, (b"fp", 0, b"x"))
    result = frontier.commit([], [Entry(EntryKind.RETRY, b"", 0, b"x-again", b"0", "t.test")])
    assert result.enqueued == 1


def test_redrive_moves_each_record_once(frontier, redis_client):
    redis_client.lpush("t:dead", b"rec-1", b"rec-2")
    moves = [
        Redrive(b"rec-1", RedriveKind.QUEUE, "a.test", 3, b"payload-1"),
        Redrive(b"rec-2", RedriveKind.START_URLS, "", 0, b"http://a.test/"),
    ]
    assert frontier.redrive(moves) == 2
    # the request queued wakes one parked worker (a start URL wakes its BLMOVE itself)
    assert redis_client.lrange("t:wake", 0, -1) == [b"1"]
    assert 0 < redis_client.pttl("t:wake") <= 1000
    assert frontier.redrive(moves) == 0  # already taken: nothing twice
    assert redis_client.llen("t:wake") == 1
    assert redis_client.llen("t:dead") == 0
    assert redis_client.lrange("t:start_urls", 0, -1) == [b"http://a.test/"]
    (item,) = frontier.lease(5, 10_000).items
    assert (item.payload, item.priority, item.slot) == (b"payload-1", 3, "a.test")


def test_redrive_takes_records_by_their_index_from_the_oldest_end(frontier, redis_client):
    redis_client.lpush("t:dead", *(f"rec-{i}".encode() for i in range(6)))  # rec-5 newest
    # read: rec-0 at -1, rec-1 at -2, rec-3 at -4; then a worker pushes a new dead letter
    # (the indices from the oldest end stay) and someone else takes rec-3 by value
    redis_client.lpush("t:dead", b"rec-new")
    redis_client.lrem("t:dead", 1, b"rec-3")  # rec-4 and newer shift to the oldest end
    back = RedriveKind.START_URLS
    moves = [
        Redrive(b"rec-0", back, "", 0, b"http://a.test/0", at=-1),
        Redrive(b"rec-1", back, "", 0, b"http://a.test/1", at=-2),
        Redrive(b"rec-3", back, "", 0, b"http://a.test/3", at=-4),  # gone: skipped
        Redrive(b"rec-4", back, "", 0, b"http://a.test/4", at=-5),  # moved: found by value
    ]
    assert frontier.redrive(moves) == 3
    assert redis_client.lrange("t:dead", 0, -1) == [b"rec-new", b"rec-5", b"rec-2"]
    assert sorted(redis_client.lrange("t:start_urls", 0, -1)) == [
        b"http://a.test/0",
        b"http://a.test/1",
        b"http://a.test/4",
    ]


def test_a_redrive_with_an_impossible_index_changes_nothing(frontier, redis_client):
    redis_client.lpush("t:dead", b"rec-0")
    with pytest.raises(redis.ResponseError, match="invalid redrive record 1"):
        frontier.redrive(
            [Redrive(b"rec-0", RedriveKind.START_URLS, "", 0, b"http://a.test/", at=3)]
        )
    assert redis_client.lrange("t:dead", 0, -1) == [b"rec-0"]


# ---------------------------------------------------------------- politeness in the scripts


def polite(redis_client, **options):
    from distcrawl.model.records import Politeness

    return Frontier(redis_client, FrontierKeys("t"), Politeness(**options))


def test_a_slot_past_its_pending_cap_drops_its_new_requests_only(redis_client):
    frontier = polite(redis_client, max_pending_per_slot=3, keep_priority=100)
    entries = [
        Entry(EntryKind.REQUEST, f"a-{i}".encode(), 0, b"a", b"", "trap.test") for i in range(5)
    ]
    entries += [Entry(EntryKind.REQUEST, b"b-0", 0, b"b", b"", "b.test")]
    entries += [
        Entry(EntryKind.REQUEST, b"a-urgent", 100, b"a!", b"", "trap.test")
    ]  # kept past the cap
    result = frontier.commit([], entries, positions=True)
    assert (result.enqueued, result.slot_dropped, result.dropped) == (5, 2, 0)
    assert sorted(result.not_stored) == [-5, -4]  # entries 3 and 4: for request_dropped
    assert redis_client.zlexcount("t:queue", "[trap.test\0", "(trap.test\1") == 4
    # a later commit counts what is queued: the slot is still full, the other is not
    more = [
        Entry(EntryKind.REQUEST, b"a-9", 0, b"a", b"", "trap.test"),
        Entry(EntryKind.REQUEST, b"b-1", 0, b"b", b"", "b.test"),
    ]
    result = frontier.commit([], more)
    assert (result.enqueued, result.slot_dropped) == (1, 1)
    # and a slot drained below its cap takes new requests again
    for item in frontier.lease(10, 10_000).items:
        frontier.commit([item.ref], [])
    assert (
        frontier.commit([], [Entry(EntryKind.REQUEST, b"a-10", 0, b"a", b"", "trap.test")]).enqueued
        == 1
    )


def push_slot(frontier, slot, count):
    entries = [
        Entry(EntryKind.REQUEST, f"{slot}-{i}".encode(), 0, f"{slot}-{i}".encode(), b"", slot)
        for i in range(count)
    ]
    return frontier.commit([], entries)


def lease_split(frontier, slot, queued, want, reserve):
    """``queued`` requests of ``slot`` pushed, then one lease of ``want`` with up to
    ``reserve`` reserves: the leases that hold places, and the reserves."""
    push_slot(frontier, slot, queued)
    got = frontier.lease(want, 10_000, reserve=reserve).items
    return [x for x in got if not x.reserve], [x for x in got if x.reserve]


def test_a_slot_with_a_delay_gives_one_request_per_turn_and_says_when(redis_client):
    frontier = polite(redis_client, delay_ms=300)
    push_slot(frontier, "a.test", 3)
    push_slot(frontier, "b.test", 3)
    first = frontier.lease(10, 10_000)
    assert sorted(x.slot for x in first.items) == ["a.test", "b.test"]
    assert all(x.paced for x in first.items)  # to be sent first: their turns began now
    again = frontier.lease(10, 10_000)
    assert again.items == [] and 0.2 < again.wait <= 0.3
    time.sleep(again.wait + 0.02)
    assert len(frontier.lease(10, 10_000).items) == 2


def test_a_request_sent_late_moves_its_slots_next_turn_back_by_the_lag(redis_client):
    frontier = polite(redis_client, delay_ms=300)
    push_slot(frontier, "a.test", 3)
    first = frontier.lease(10, 10_000)
    (item,) = first.items
    assert item.paced and first.leased_at > 0
    time.sleep(0.2)  # the worker was busy: it sends the request only now
    assert frontier.sent([("a.test", first.leased_at)]) == 1
    again = frontier.lease(10, 10_000)
    # the next turn is a whole delay after the send, not after the lease
    assert again.items == [] and 0.25 < again.wait <= 0.3
    assert frontier.sent([("gone.test", first.leased_at)]) == 0  # no turn kept: nothing to move


def test_concurrency_counts_until_acknowledged_and_a_contended_slot_is_shared(redis_client):
    a, b = polite(redis_client, concurrency=2), polite(redis_client, concurrency=2)
    push_slot(a, "s.test", 10)
    held_a = a.lease(10, 10_000).items
    assert len(held_a) == 2  # the slot's two places
    assert not any(x.paced for x in held_a)  # no delay: no turn to keep
    time.sleep(0.3)  # a full slot is looked at again after 250 ms
    assert b.lease(10, 10_000, held={}).items == []  # full: b waits, and says so
    a.commit([held_a[0].ref], [])  # one place free; a asks again at once, holding one
    assert a.lease(10, 10_000, held={"s.test": 1}).items == []  # a has its share
    (got,) = b.lease(10, 10_000, held={}).items  # the free place went to the waiting worker
    assert got.slot == "s.test"
    assert redis_client.hget("t:inflight", "s.test") == b"2"


def test_a_contended_slot_is_divided_among_the_live_workers_not_in_halves(redis_client):
    # four live workers on one slot of eight places: two that hold half each must not keep
    # the other two out (they did, for a whole Scrapyd crawl, while the share was a half)
    now_ms = server_ms(redis_client)
    workers = [polite(redis_client, concurrency=8) for _ in range(4)]
    redis_client.zadd("t:alive", {w.tag: now_ms for w in workers})
    redis_client.zadd("t:alive", {"0badbeef": now_ms - 60_000})  # lapsed: not counted
    a, b, c, d = workers
    push_slot(a, "s.test", 20)
    held_a, held_b = a.lease(4, 10_000).items, b.lease(4, 10_000, held={}).items
    assert len(held_a) == len(held_b) == 4
    time.sleep(0.3)  # a full slot is looked at again after 250 ms
    assert c.lease(4, 10_000, held={}).items == []  # full: c waits, and says so
    a.commit([held_a[0].ref], [])
    # a holds three: more than its quarter, so the free place is not a's
    assert a.lease(4, 10_000, held={"s.test": 3}).items == []
    (got,) = c.lease(4, 10_000, held={}).items
    assert got.slot == "s.test"
    b.commit([x.ref for x in held_b[:2]], [])
    assert b.lease(4, 10_000, held={"s.test": 2}).items == []  # b has its quarter
    assert len(d.lease(4, 10_000, held={}).items) == 2  # and the waiting d gets the rest


def test_a_worker_waiting_on_a_parked_full_slot_gets_its_share(redis_client):
    # the worker whose response frees a place leases again in the same step and parks the
    # slot anew: the waiting worker must still be seen waiting, or it never gets a place
    a, b = polite(redis_client, concurrency=8), polite(redis_client, concurrency=8)
    redis_client.zadd("t:alive", {w.tag: server_ms(redis_client) for w in (a, b)})
    push_slot(a, "s.test", 40)
    held = a.lease(16, 10_000).items
    assert len(held) == 8
    assert b.lease(16, 10_000, held={}).items == []  # parked at its limit: b asks at once
    assert b.lease(16, 10_000, held={}).wait == 0.05  # and is told to ask again soon
    assert a.places([held[0].ref]) == (1, 0)
    # a holds seven, more than its half: the place it freed is left for b
    assert a.lease(16, 10_000, held={"s.test": 7}).items == []
    assert len(b.lease(16, 10_000, held={}).items) == 1


def test_requeue_and_release_give_the_place_back(redis_client):
    frontier = polite(redis_client, concurrency=1)
    push_slot(frontier, "s.test", 2)
    (item,) = frontier.lease(10, 50).items
    assert frontier.lease(10, 50).items == []
    time.sleep(0.1)
    assert frontier.requeue_expired().requeued == 1
    assert redis_client.hget("t:inflight", "s.test") is None
    (again,) = frontier.lease(10, 10_000).items
    assert again.id == item.id  # back at the head of its slot
    assert frontier.release([again.ref]) == 1
    assert len(frontier.lease(10, 10_000).items) == 1


def test_a_response_gives_the_place_back_once_before_the_ack(redis_client):
    frontier = polite(redis_client, concurrency=1)
    push_slot(frontier, "s.test", 3)
    (first,) = frontier.lease(10, 10_000).items
    assert frontier.lease(10, 10_000).items == []  # full
    assert frontier.places([first.ref]) == (1, 0)  # its response arrived: the place is free
    assert frontier.places([first.ref]) == (0, 0)  # and only once
    assert redis_client.hget("t:inflight", "s.test") is None
    (second,) = frontier.lease(10, 10_000).items  # while the first is still leased
    assert redis_client.zscore("t:leases", first.id) is not None
    frontier.commit([first.ref], [])  # its ack does not give the place back again
    assert redis_client.hget("t:inflight", "s.test") == b"1"
    assert frontier.lease(10, 10_000).items == []  # the second holds the one place
    assert redis_client.smembers("t:placeless") == set()
    frontier.commit([second.ref], [])
    assert redis_client.hget("t:inflight", "s.test") is None
    assert len(frontier.lease(10, 10_000).items) == 1


def test_a_fetched_request_requeued_or_given_back_frees_no_second_place(redis_client):
    frontier = polite(redis_client, concurrency=2)
    push_slot(frontier, "s.test", 4)
    a, b = frontier.lease(2, 50).items
    stranger = a.ref._replace(token=b"\x01" * 8)
    assert frontier.places([stranger]) == (0, 0)  # another lease's token frees nothing
    assert frontier.places([a.ref, b.ref]) == (2, 0)
    c, _ = frontier.lease(2, 10_000).items  # the two places, taken again
    time.sleep(0.1)
    assert frontier.requeue_expired().requeued == 2  # a and b expire: back in the queue
    assert redis_client.hget("t:inflight", "s.test") == b"2"  # c and d, not fewer
    assert frontier.places([a.ref]) == (0, 0)  # no longer leased: nothing to free
    assert frontier.places([c.ref]) == (1, 0)
    assert frontier.release([c.ref]) == 1  # given back after its response: no second place
    assert redis_client.hget("t:inflight", "s.test") == b"1"
    assert redis_client.smembers("t:placeless") == set()


def test_reserves_hold_no_place_until_they_take_one_freed_by_their_slot(redis_client):
    frontier = polite(redis_client, concurrency=2)
    push_slot(frontier, "s.test", 10)
    got = frontier.lease(6, 10_000, reserve=3).items
    p0, p1 = (x for x in got if not x.reserve)
    r0, r1 = (x for x in got if x.reserve)  # as many reserves as places held, at most 3
    assert len(got) == 4
    assert redis_client.hget("t:inflight", "s.test") == b"2"
    assert redis_client.smembers("t:placeless") == {r0.id.encode(), r1.id.encode()}
    # p0 left the downloader and r0 went out in its place
    assert frontier.places([p0.ref], [r0.ref]) == (1, 1)
    assert redis_client.hget("t:inflight", "s.test") == b"2"  # never above the limit
    assert frontier.places([p0.ref], [r0.ref]) == (0, 0)  # once
    frontier.commit([p0.ref], [])  # its ack frees nothing more
    assert redis_client.hget("t:inflight", "s.test") == b"2"
    # p1 left with no reserve to replace it: its place is free, and the next lease takes it
    # with one more reserve (two places held, one reserve held, at most 3)
    assert frontier.places([p1.ref]) == (1, 0)
    more = frontier.lease(6, 10_000, held={"s.test": 1}, reserve=3, reserved={"s.test": 1})
    assert [x.reserve for x in more.items] == [False, True]
    assert redis_client.hget("t:inflight", "s.test") == b"2"
    # a reserve given back, or acknowledged, frees no place it never had
    assert frontier.release([r1.ref]) == 1
    frontier.commit([more.items[1].ref], [])
    assert redis_client.hget("t:inflight", "s.test") == b"2"
    frontier.commit([p1.ref, r0.ref, more.items[0].ref], [])
    assert redis_client.hget("t:inflight", "s.test") is None
    assert redis_client.smembers("t:placeless") == set()


def test_reserves_per_place_follow_the_answers_a_place_gives_between_two_batches(redis_client):
    """Politeness.reserves_per_place (DistcrawlConfig.pages_per_place: 2 at the default 0.2 s
    interval): a worker holding two places may hold twice as many reserves, so that each
    answer until its next batch has one to send in its place; never beyond the cap per slot,
    and the count given to the script is its floor of one (an older worker sends none)."""
    for per_place, cap, expected in ((1, 8, 2), (2, 8, 4), (3, 5, 5), (0, 8, 2)):
        redis_client.flushdb()
        frontier = polite(redis_client, concurrency=2, reserves_per_place=per_place)
        push_slot(frontier, "s.test", 12)
        got = frontier.lease(12, 10_000, reserve=cap).items
        assert sorted(x.reserve for x in got) == [False] * 2 + [True] * expected, per_place
        assert redis_client.hget("t:inflight", "s.test") == b"2"  # places: never more
        assert redis_client.scard("t:placeless") == expected


def test_a_reserve_reported_taken_and_freed_at_once_stays_counted_until_acknowledged(
    redis_client,
):
    """Why a worker reports neither for a reserve that took a place and left it between two
    batches (Leases.left): places.lua reads the freed ids before the taken ones, so the
    reserve, placeless when its freed id is read, is then counted at the site, and the
    slot's place stays taken until the reserve's acknowledgement."""
    frontier = polite(redis_client, concurrency=2)
    push_slot(frontier, "s.test", 10)
    got = frontier.lease(4, 10_000, reserve=2).items
    p0 = next(x for x in got if not x.reserve)
    r0 = next(x for x in got if x.reserve)
    # p0 left, r0 went out in its place and left too: both reported
    frontier.places([p0.ref, r0.ref], [r0.ref])
    assert redis_client.hget("t:inflight", "s.test") == b"2"  # the other place and r0: one too many
    frontier.commit([r0.ref], [])
    assert redis_client.hget("t:inflight", "s.test") == b"1"
    # reported as the worker does, the place is free at once
    redis_client.flushdb()
    frontier = polite(redis_client, concurrency=2)
    push_slot(frontier, "s.test", 10)
    got = frontier.lease(4, 10_000, reserve=2).items
    p0 = next(x for x in got if not x.reserve)
    frontier.places([p0.ref])
    assert redis_client.hget("t:inflight", "s.test") == b"1"  # the other place alone
    assert len(frontier.lease(4, 10_000, held={"s.test": 1}).items) == 1


def test_a_swap_changes_no_count_and_costs_no_write_to_the_slot(redis_client):
    """A reserve sent in the place of a request of its slot that left the downloader (the
    usual report of a worker with reserves) leaves the slot's count as it was: the report
    nets the two, and neither writes the count nor arms the slot again. A report that frees
    more places than it takes still gives them back, and arms the slot."""
    frontier = polite(redis_client, concurrency=3)
    placed, reserves = lease_split(frontier, "w.test", 10, 6, 3)
    assert (len(placed), len(reserves)) == (3, 3)
    before = redis_client.info("commandstats")
    assert frontier.places([placed[0].ref, placed[1].ref], [reserves[0].ref, reserves[1].ref]) == (
        2,
        2,
    )
    after = redis_client.info("commandstats")

    def calls(command):
        key = f"cmdstat_{command}"
        return after.get(key, {}).get("calls", 0) - before.get(key, {}).get("calls", 0)

    assert (calls("hincrby"), calls("time"), calls("zadd")) == (0, 0, 0)
    assert redis_client.hget("t:inflight", "w.test") == b"3"
    assert redis_client.smembers("t:placeless") == {
        placed[0].id.encode(),
        placed[1].id.encode(),
        reserves[2].id.encode(),
    }
    # two more left, one reserve went out: one place freed, the slot armed for it
    assert frontier.places([placed[2].ref, reserves[0].ref], [reserves[2].ref]) == (2, 1)
    assert redis_client.hget("t:inflight", "w.test") == b"2"
    assert redis_client.zscore("t:ready", "w.test") is not None


def test_place_reports_left_to_the_acknowledgements_leave_redis_as_the_reports_would(
    redis_client,
):
    """A batch drops the place reports of the requests it acknowledges (BatchBuilder.
    _fold_into_acks): an acknowledgement gives back the place of a request that holds one and
    takes a reserve out of 'placeless', so the slot's count and the set end as they would with
    every report sent first. Here: p0 left and r0 went out in its place, p1 left with no
    reserve to take its place, p2 left and r1 went out in its place and left too; p0, p1 and
    r1 are acknowledged, p2 and r0 later."""
    from distcrawl.model.records import Politeness

    def crawl(prefix, fold):
        frontier = Frontier(redis_client, FrontierKeys(prefix), Politeness(concurrency=3))
        push_slot(frontier, "f.test", 10)
        got = frontier.lease(6, 10_000, reserve=3).items
        p = [x.ref for x in got if not x.reserve]
        r = [x.ref for x in got if x.reserve]
        assert (len(p), len(r)) == (3, 3)
        acks = [p[0], p[1], r[1]]
        freed, taken = [p[0], p[1], p[2], r[1]], [r[0], r[1]]
        if fold:
            freed = [ref for ref in freed if ref not in acks]
            taken = [ref for ref in taken if ref not in acks]
            assert (freed, taken) == ([p[2]], [r[0]])
        frontier.places(freed, taken)
        frontier.commit(acks, [])
        keys = FrontierKeys(prefix)
        state = (
            redis_client.hget(keys.inflight, "f.test"),
            redis_client.smembers(keys.placeless),
            redis_client.zrange(keys.leases, 0, -1),
        )
        frontier.commit([p[2], r[0]], [])
        end = (redis_client.hget(keys.inflight, "f.test"), redis_client.scard(keys.placeless))
        return state, end

    reported, folded = crawl("t", fold=False), crawl("u", fold=True)
    assert reported == folded
    (inflight, placeless, leases), end = folded
    assert inflight == b"1" and len(placeless) == 2 and len(leases) == 3  # r0 holds the place
    assert end == (None, 1)  # all places given back; r2, a reserve never sent, holds none


def test_acknowledging_requests_that_hold_no_place_arms_no_slot(redis_client):
    """A place goes back when its request leaves the downloader (places.lua), which arms the
    slot; the acknowledgement that follows frees nothing, so it leaves 'ready' alone (at 100 ms
    a page, an HMGET and a ZADD a commit). One that gives a place back arms the slot."""
    frontier = polite(redis_client, concurrency=2)
    push_slot(frontier, "a.test", 5)
    held = frontier.lease(2, 10_000).items
    assert frontier.places([held[0].ref]).freed == 1
    far = 10**13
    redis_client.zadd("t:ready", {"a.test": far})  # an arm (ZADD LT) would move it earlier
    before = redis_client.info("commandstats")
    assert frontier.commit([held[0].ref], []).missing == 0
    after = redis_client.info("commandstats")
    assert after["cmdstat_zadd"]["calls"] == before["cmdstat_zadd"]["calls"]
    assert redis_client.zscore("t:ready", "a.test") == far
    frontier.commit([held[1].ref], [])  # held its place until now: given back, slot armed
    assert redis_client.zscore("t:ready", "a.test") < far
    assert redis_client.hget("t:inflight", "a.test") is None


def test_an_acknowledgement_arms_its_full_slot_so_the_next_lease_refills_the_reserves(
    redis_client,
):
    """A full slot is parked (RECHECK_FULL_MS) and gives nobody anything until then; the
    usual batch at 100 ms a page, a reserve reported sent in the place of a request that the
    same batch acknowledges (BatchBuilder._fold_into_acks), changes no count, but the
    acknowledgement gives a place back and arms the slot, so the lease that follows in the
    batch refills this worker's reserves at once. A change that netted the two to nothing
    and left the slot parked cost one worker an eighth of its pages a second (benchmarks/
    README.md, "The place report inside the commit")."""
    frontier = polite(redis_client, concurrency=2)
    placed, reserves = lease_split(frontier, "f.test", 12, 8, 2)
    assert (len(placed), len(reserves)) == (2, 2)

    assert redis_client.zscore("t:ready", "f.test") > server_ms(redis_client)  # parked: full
    # p0 left the downloader, r0 went out in its place; one batch reports and acknowledges
    assert frontier.places([], [reserves[0].ref]) == (0, 1)
    frontier.commit([placed[0].ref], [])
    assert redis_client.hget("t:inflight", "f.test") == b"2"
    assert redis_client.zscore("t:ready", "f.test") <= server_ms(redis_client)  # armed again
    more = frontier.lease(8, 10_000, held={"f.test": 2}, reserve=2, reserved={"f.test": 1}).items
    assert [x.reserve for x in more] == [True]  # the reserve used, refilled at once


def test_a_lease_reads_no_per_slot_limits_or_throttle_while_none_is_set(redis_client):
    """Operator limits, adaptive delays and adaptive caps are unset in a healthy crawl: a lease
    learns that with one EXISTS a call instead of three HGETs for each slot it visits, and
    reads them per slot again (and obeys them) once one is set."""
    frontier = polite(redis_client, concurrency=4)
    push_slot(frontier, "p.test", 10)
    frontier.lease(1, 10_000)  # the script loaded

    def reads():
        stats = redis_client.info("commandstats")
        return tuple(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("hget", "exists"))

    def lease_reads(count):
        before = reads()
        got = frontier.lease(count, 10_000).items
        after = reads()
        return len(got), after[0] - before[0], after[1] - before[1]

    # two EXISTS a call: this one, and the retries' and revisits' (the next test)
    taken, plain_hgets, exists = lease_reads(1)
    assert (taken, exists) == (1, 2)
    redis_client.hset("t:limits", "p.test", ":1")  # `distcrawl limit p.test --concurrency 1`
    taken, hgets, exists = lease_reads(4)
    assert (hgets, exists) == (plain_hgets + 3, 2)
    assert taken == 0  # two in flight already: the limit of 1 holds


def test_a_lease_reads_the_retries_and_revisits_only_while_one_waits(redis_client):
    """Most leases find no retry waiting and no revisit: one EXISTS says so, where the two
    promotions and the revisits' queue read three keys. A retry waiting brings those reads
    back, and one coming due is promoted and leased as before."""
    frontier = polite(redis_client, concurrency=4)
    frontier.lease(1, 10_000)  # the script loaded

    def commands():
        stats = redis_client.info("commandstats")
        return sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_"))

    def lease_commands():
        before = commands()
        got = frontier.lease(4, 10_000).items
        return commands() - before - 2, got  # the INFO calls and the EVALSHA itself

    nothing, got = lease_commands()
    assert got == []
    now_ms = server_ms(redis_client)
    frontier.commit([], [Entry(EntryKind.RETRY, b"", 0, b"later", b"400", "r.test")])
    waiting, got = lease_commands()
    # the EXISTS kept, and: ZRANGE of the retries and the revisits, ZCARD of the revisits'
    # queue and of the retries
    assert got == [] and waiting == nothing + 4
    time.sleep(max(0.0, now_ms + 450 - server_ms(redis_client)) / 1000)
    waiting, got = lease_commands()
    assert [x.payload for x in got] == [b"later"]


def test_reserves_only_for_a_worker_within_its_share_of_the_live_workers(redis_client):
    a, b = polite(redis_client, concurrency=8), polite(redis_client, concurrency=8)
    redis_client.zadd("t:alive", {w.tag: server_ms(redis_client) for w in (a, b)})
    push_slot(a, "s.test", 30)
    # alone on the slot so far, a takes five places: more than its half, so no reserves,
    # which would keep those places from b as they free up
    assert [x.reserve for x in a.lease(5, 10_000, reserve=4).items] == [False] * 5
    # b, with three places (within its half), gets reserves beside them
    got = b.lease(6, 10_000, held={}, reserve=4).items
    assert sorted(x.reserve for x in got) == [False] * 3 + [True] * 3


def test_no_reserves_on_a_slot_with_a_delay_or_a_contended_one(redis_client):
    slow = polite(redis_client, concurrency=4, delay_ms=1000)
    push_slot(slow, "d.test", 5)
    assert [x.reserve for x in slow.lease(6, 10_000, reserve=3).items] == [False]
    a, b = polite(redis_client, concurrency=2), polite(redis_client, concurrency=2)
    redis_client.zadd("t:alive", {w.tag: server_ms(redis_client) for w in (a, b)})
    push_slot(a, "s.test", 10)
    assert len(a.lease(2, 10_000).items) == 2
    assert b.lease(2, 10_000, held={}, reserve=3).items == []  # full: b waits, and says so
    # contended, a over its share (one place each) and 8 queued, short of a place and three
    # reserves for each live worker: a gets no reserves, which would keep requests from b
    assert a.lease(2, 10_000, held={"s.test": 2}, reserve=3).items == []


def test_a_deep_contended_slot_gives_reserves_to_a_worker_within_its_share(redis_client):
    """On a contended slot, a worker within its share also gets reserves while requests are
    queued beyond the turn for a place and a whole set of reserves per live worker: it sends
    them in its own places as they free, and refills its share once a batch, not on every
    place the batch reports. With fewer queued, reserves would keep requests from a worker
    short of them, and none are given."""
    a, b = polite(redis_client, concurrency=4), polite(redis_client, concurrency=4)
    redis_client.zadd("t:alive", {w.tag: server_ms(redis_client) for w in (a, b)})
    push_slot(a, "s.test", 18)
    a0, _, _ = a.lease(3, 10_000, held={}).items  # alone so far: three of the four places
    assert len(b.lease(2, 10_000, held={}).items) == 1
    assert b.lease(1, 10_000, held={"s.test": 1}).items == []  # below its share of 2: contended
    # a0 left the downloader; a holds its share (2): its free place is b's, but 14 are
    # queued, 0 + 2 x (4 places + 3 reserves): reserves, as many as its places
    assert a.places([a0.ref]) == (1, 0)
    got = a.lease(4, 10_000, held={"s.test": 2}, reserve=3).items
    assert [x.reserve for x in got] == [True, True]
    # b takes the free place; 12 queued, short of 1 + 2 x 7: no reserves for it
    assert [x.reserve for x in b.lease(4, 10_000, held={"s.test": 1}, reserve=3).items] == [False]
    assert redis_client.hget("t:inflight", "s.test") == b"4"  # never above the limit


def test_robots_probe_gives_one_request_until_the_crawl_delay_is_recorded(redis_client):
    frontier = polite(redis_client, robots="60000:30000")
    push_slot(frontier, "r.test", 5)
    assert len(frontier.lease(10, 10_000).items) == 1  # the probe
    assert frontier.lease(10, 10_000).items == []  # everyone waits for robots.txt
    wait = frontier.record_crawl_delay("r.test", 200, fetched=True)
    assert 0.15 < wait <= 0.2  # the robots.txt download took a turn; the probe gets the next
    assert frontier.lease(10, 10_000).items == []
    time.sleep(wait + 0.25)  # the probe's turn, then one more delay
    assert len(frontier.lease(10, 10_000).items) == 1
    assert redis_client.hget("t:robots", "r.test") == b"200"


def test_a_probe_that_ends_without_robots_txt_lets_the_next_one_try(redis_client):
    frontier = polite(redis_client, robots="60000:30000")
    push_slot(frontier, "r.test", 3)
    (probe,) = frontier.lease(10, 10_000).items
    frontier.commit([probe.ref], [])  # e.g. dead-lettered before any download
    assert len(frontier.lease(10, 10_000).items) == 1


def test_429_feedback_holds_the_slot_back_for_retry_after(redis_client):
    from distcrawl.model.records import Feedback

    frontier = polite(redis_client)
    push_slot(frontier, "t.test", 3)
    frontier.commit([], [], [Feedback("t.test", 0, 0, 1, 1500)])
    leased = frontier.lease(10, 10_000)
    assert leased.items == [] and 1.3 < leased.wait <= 1.5
    assert int(redis_client.hget("t:throttle", "t.test")) == 1500
    # good answers bring the adaptive delay down by a quarter each
    frontier.commit([], [], [Feedback("t.test", 2, 20, 0, 0)])
    assert int(redis_client.hget("t:throttle", "t.test")) == int(1500 * 0.75**2)


def test_a_burst_of_503s_raises_the_delay_once_per_delay(redis_client):
    from distcrawl.model.records import Feedback

    frontier = polite(redis_client, throttle="200:60000:0:30:0.3")
    push_slot(frontier, "b.test", 3)
    # ten workers' batches, each with a 503: one answer after another, but the share of
    # 503s among the slot's last ~30 answers is still under 0.3: nothing changes
    for _ in range(10):
        frontier.commit([], [], [Feedback("b.test", 0, 0, 1, 0)])
    assert redis_client.hget("t:throttle", "b.test") is None
    assert redis_client.hget("t:throttle:state", "b.test").startswith(b"0.000:0.28")
    # ten more: the share passes 0.3, the concurrency is cut to 1 (nothing was in flight),
    # then the delay is raised, once, not 200 * 2**8
    for _ in range(10):
        frontier.commit([], [], [Feedback("b.test", 0, 0, 1, 0)])
    assert int(redis_client.hget("t:throttle", "b.test")) == 200
    assert redis_client.hget("t:throttle:state", "b.test").startswith(b"1.000:")
    time.sleep(0.25)  # a whole delay later, a 503 is news: it doubles
    frontier.commit([], [], [Feedback("b.test", 0, 0, 1, 0)])
    assert int(redis_client.hget("t:throttle", "b.test")) == 400
    frontier.commit([], [], [Feedback("b.test", 0, 0, 1, 5000)])
    assert int(redis_client.hget("t:throttle", "b.test")) == 5000  # Retry-After still counts


def answer(frontier, items, throttled):
    """Acknowledge ``items`` with one feedback record: ``throttled`` of them answered 503
    (no Retry-After), the others 200 in 20 ms."""
    from distcrawl.model.records import Feedback

    good = len(items) - throttled
    slot = items[0].slot
    feedback = Feedback(slot, good, 20 * good, throttled, 0)
    return frontier.commit([x.ref for x in items], [], [feedback])


def test_sporadic_503s_keep_the_slot_at_full_speed(redis_client):
    """One answer in six is a 503 (a tenth of the pages failing twice before they work):
    the slot keeps its whole concurrency and gets no delay."""
    frontier = polite(redis_client, concurrency=8)
    push_slot(frontier, "s.test", 400)
    leased = []
    for n in range(40):
        items = frontier.lease(100, 10_000).items
        leased.append(len(items))
        # 503s bunched at the worst moment too: three in one batch of eight
        answer(frontier, items, 3 if n == 5 else (1 if n % 3 else 2))
    assert leased == [8] * 40
    assert redis_client.hget("t:throttle", "s.test") is None
    cap, share, _ = redis_client.hget("t:throttle:state", "s.test").split(b":")
    assert float(cap) == 0 and 0.1 < float(share) < 0.3


def test_a_site_answering_503_to_most_requests_slows_every_worker(redis_client):
    a, b = polite(redis_client, concurrency=8), polite(redis_client, concurrency=8)
    push_slot(a, "o.test", 400)
    leased = []
    for _ in range(30):
        items = a.lease(100, 10_000).items
        if not items:
            break
        leased.append(len(items))
        answer(a, items, len(items) - len(items) // 4)  # three in four, or all, are 503s
    # concurrency first, halved while the 503s go on, then one at a time and a delay
    print("leased per round:", leased)
    assert leased[:2] == [8, 8] and 4 in leased and 2 in leased and leased[-1] == 1
    assert all(x >= y for x, y in itertools.pairwise(leased))
    assert int(redis_client.hget("t:throttle", "o.test")) == 1000  # START_DELAY
    # the slot is held back for every worker, not only the one that got the answers
    for frontier in (a, b):
        held = frontier.lease(100, 10_000)
        assert held.items == [] and 0.8 < held.wait <= 1.0
    time.sleep(1.05)
    (one,) = b.lease(100, 10_000).items  # one at a time, a jittered delay apart
    assert one.paced
    wait = a.lease(100, 10_000).wait
    assert 0.45 <= wait <= 1.5
    next_turn = time.monotonic() + wait
    answer(b, [one], 0)
    # good answers: the delay goes first (a quarter off each), then the cap grows back
    from distcrawl.model.records import Feedback

    for _ in range(60):
        a.commit([], [], [Feedback("o.test", 4, 80, 0, 0)])
    assert redis_client.hget("t:throttle", "o.test") is None
    assert redis_client.hget("t:throttle:state", "o.test") is None  # cap and share forgotten
    time.sleep(max(0.0, next_turn - time.monotonic()) + 0.05)
    assert len(b.lease(100, 10_000).items) == 8


def test_fine_answers_of_a_slot_without_throttle_state_write_nothing(frontier, redis_client):
    """The feedback of a slot whose answers are all fine, and that has no adaptive state,
    stores nothing and deletes nothing: a commit on every batch of a healthy crawl carries
    such feedback, and each command in a script costs Redis CPU."""
    from distcrawl.model.records import Feedback

    frontier.commit([], [], [Feedback("f.test", 4, 80, 0, 0)])  # the script loaded
    before = redis_client.info("commandstats")
    for _ in range(5):
        frontier.commit([], [], [Feedback("f.test", 4, 80, 0, 0)])
    after = redis_client.info("commandstats")

    def calls(stats, command):
        return stats.get(f"cmdstat_{command}", {}).get("calls", 0)

    for command in ("hdel", "hset", "del"):
        assert calls(after, command) - calls(before, command) == 0, command
    assert redis_client.hget("t:throttle:state", "f.test") is None
    # nor reads either hash: one EXISTS a commit says both are empty (as many HGETs as
    # commits without feedback send)
    start = redis_client.info("commandstats")
    for _ in range(5):
        frontier.commit([], [])
    bare = redis_client.info("commandstats")
    with_feedback = calls(after, "hget") - calls(before, "hget")
    assert with_feedback == calls(bare, "hget") - calls(start, "hget")
    assert calls(after, "exists") - calls(before, "exists") == 5


def test_throttle_parameters_are_checked(redis_client):
    frontier = polite(redis_client, throttle="1000:60000:0")
    with pytest.raises(redis.ResponseError, match="distcrawl: invalid commit: parameters"):
        frontier.commit([], [])


def test_pending_cap_drops_new_requests_but_keeps_high_priority_and_start_urls(redis_client):
    frontier = polite(redis_client, max_pending=3, keep_priority=10)
    result = push_slot(frontier, "c.test", 5)
    assert (result.enqueued, result.dropped) == (3, 2)
    assert redis_client.scard("t:seen") == 3  # dropped ones can be discovered again later
    urgent = Entry(EntryKind.REQUEST, b"urgent", 10, b"urgent", b"", "c.test")
    assert frontier.commit([], [urgent]).enqueued == 1  # kept past the cap
    redis_client.lpush("t:start_urls", b"http://c.test/x")
    assert frontier.claim_start_urls(10) == [b"http://c.test/x"]
    entry = Entry(EntryKind.START_REQUEST, b"fp-s", 0, b"s", b"http://c.test/x", "c.test")
    assert frontier.commit([], [entry]).held == 1
    # still claimed, not lost: handed out again at the next claim, given back on close
    assert frontier.claim_start_urls(10) == [b"http://c.test/x"]
    assert frontier.unclaim() == 1
    assert redis_client.lrange("t:start_urls", 0, -1) == [b"http://c.test/x"]


# ------------------------------------------------------------ owned leases, rollbacks, poison


def entry(fp, payload, slot="t.test", kind=EntryKind.REQUEST, raw=b""):
    return Entry(kind, fp, 0, payload, raw, slot)


def test_a_late_ack_from_a_stalled_worker_is_a_counted_no_op(redis_client):
    keys = FrontierKeys("t")
    slow, fast = Frontier(redis_client, keys), Frontier(redis_client, keys)
    slow.commit([], [entry(b"a", b"a")])
    (mine,) = slow.lease(1, 50).items
    time.sleep(0.1)
    assert slow.requeue_expired().requeued == 1
    (theirs,) = fast.lease(1, 60_000).items
    assert theirs.id == mine.id and theirs.token != mine.token
    late = slow.commit([mine.ref], [])
    assert (late.stale, late.late, late.missing) == (1, 0, 0)
    assert redis_client.zscore("t:leases", theirs.id) is not None  # still the fast worker's
    assert slow.renew([mine.ref], 60_000) == 0
    assert slow.release([mine.ref]) == 0
    assert fast.renew([theirs.ref], 60_000) == 1
    done = fast.commit([theirs.ref], [])
    assert (done.stale, done.missing) == (0, 0)
    assert redis_client.hlen("t:requests") == 0 and redis_client.hlen("t:inflight") == 0


def test_ids_reused_after_redis_lost_its_data_never_match(redis_client):
    keys = FrontierKeys("t")
    old, new = Frontier(redis_client, keys), Frontier(redis_client, keys)
    old.commit([], [entry(b"a", b"a")])
    (held,) = old.lease(1, 60_000).items
    redis_client.flushall()  # a restart without persistence, a failover to a lagging replica
    new.commit([], [entry(b"b", b"b"), entry(b"", b"retry", kind=EntryKind.RETRY, raw=b"60000")])
    (fresh,) = new.lease(1, 60_000).items
    assert fresh.id == held.id  # seq went back: the same id names another request
    result = old.commit([held.ref], [])  # the old worker finishes what it held
    assert result.stale == 1
    assert redis_client.zscore("t:leases", fresh.id) is not None
    assert redis_client.zcard("t:delayed") == 1  # the waiting retry is untouched
    retry_id = redis_client.zrange("t:delayed", 0, 0)[0].decode()
    assert old.commit([LeaseRef(retry_id, held.token)], []).stale == 1
    assert redis_client.zcard("t:delayed") == 1


def test_a_reused_id_with_a_record_gets_a_new_one_when_leased(redis_client):
    frontier = Frontier(redis_client, FrontierKeys("t"))
    # a record left under id 1 (e.g. a retry waiting) and a queued entry reusing id 1
    record = b"\0" * 8 + make_entry("t.test", 0, 1, b"retry")
    redis_client.hset("t:requests", "000000000001", record)
    redis_client.zadd("t:delayed", {"000000000001": time.time() * 1000 + 60_000})
    redis_client.zadd("t:queue", {make_entry("t.test", 0, 1, b"new"): 0})
    redis_client.zadd("t:ready", {"t.test": 0})
    redis_client.set("t:seq", 5)
    (item,) = frontier.lease(5, 60_000).items
    assert item.payload == b"new" and item.id != "000000000001"
    assert redis_client.hget("t:requests", "000000000001") == record
    frontier.commit([item.ref], [])
    assert redis_client.hget("t:requests", "000000000001") == record


def test_a_replayed_commit_changes_nothing(redis_client):
    frontier = Frontier(redis_client, FrontierKeys("t"))
    record = dead_letter("gave up", url="http://t.test/x", source="retry")
    entries = [
        entry(b"", b"dont-filter"),
        entry(b"", b"retry", kind=EntryKind.RETRY, raw=b"60000"),
        Entry(EntryKind.DEAD_LETTER, b"", 0, record),
    ]
    first = frontier.commit([], entries, commit_id="c1")
    again = frontier.commit([], entries, commit_id="c1")
    assert (first.enqueued, first.dead, first.replayed) == (2, 1, 0)
    assert (again.enqueued, again.dead, again.replayed) == (0, 0, 1)
    assert redis_client.zcard("t:queue") == 1
    assert redis_client.zcard("t:delayed") == 1
    assert redis_client.llen("t:dead") == 1
    assert frontier.commit([], entries, commit_id="c2").enqueued == 2  # a new commit is new


def test_a_commit_is_checked_before_it_writes_anything(frontier, redis_client):
    redis_client.lpush("t:start_urls", b"http://a.test/")
    frontier.claim_start_urls(1)
    entries = [
        entry(b"a", b"a"),
        entry(b"s", b"s", kind=EntryKind.START_REQUEST, raw=b"http://a.test/", slot="a.test"),
        entry(b"b", b"b", slot="a\0b"),
    ]
    with pytest.raises(redis.ResponseError, match="slot contains NUL"):
        frontier.commit([], entries)
    for bad, reason in (("", "empty slot"), ("x" * 256, "over 255 bytes")):
        with pytest.raises(redis.ResponseError, match=reason):
            frontier.commit([], [entry(b"a", b"a"), entry(b"c", b"c", slot=bad)])
    assert redis_client.zcard("t:queue") == 0
    assert redis_client.scard("t:seen") == 0
    assert redis_client.get("t:seq") is None
    assert redis_client.llen(f"t:claims:{frontier.tag}") == 1


@pytest.mark.parametrize(
    "poison",
    [b"t.test\0\x01\x02", b"no separator at all", b"t.test\0" + b"\x00" * 9],
)
def test_a_malformed_queue_member_is_quarantined_and_the_rest_leased(
    frontier, redis_client, poison
):
    push(frontier, (b"a", 0, b"a"), (b"b", 0, b"b"))
    redis_client.zadd("t:queue", {poison: 0})
    leased, quarantined = [], 0
    for _ in range(3):  # bounded: a member outside every slot's range needs an empty ready
        result = frontier.lease(10, 60_000)
        leased += result.items
        quarantined += result.quarantined
        for item in result.items:
            frontier.commit([item.ref], [])
    assert sorted(x.payload for x in leased) == [b"a", b"b"]
    assert quarantined == 1
    assert redis_client.zcard("t:queue") == 0
    (record,) = [json.loads(r) for r in redis_client.lrange("t:dead", 0, -1)]
    assert record["reason"] == "malformed queue entry" and record["source"] == "queue"
    assert bytes.fromhex(record["raw_hex"]) == poison
    assert record["raw_length"] == len(poison)
    assert record["raw_sha1"] == hashlib.sha1(poison).hexdigest()
    assert redis_client.hget("t:stats", "quarantined") == b"1"
    assert redis_client.hlen("t:inflight") == 0


def test_a_slot_holding_a_nul_gives_nothing_and_its_range_is_quarantined(frontier, redis_client):
    # written to 'ready' by someone else: its range holds members that read as another
    # slot's ("a"), never a request of its own, whatever their length
    member = b"a\0b\0" + b"\0" * 4 + (7).to_bytes(6, "big") + b"payload"
    redis_client.zadd("t:queue", {member: 0})
    redis_client.zadd("t:ready", {b"a\0b": 0})
    result = frontier.lease(10, 60_000)
    assert result.items == [] and result.quarantined == 1
    assert redis_client.zcard("t:queue") == 0 and redis_client.hlen("t:requests") == 0
    (record,) = [json.loads(r) for r in redis_client.lrange("t:dead", 0, -1)]
    assert record["reason"] == "malformed queue entry"
    assert bytes.fromhex(record["raw_hex"]) == member


def test_a_member_whose_slot_is_not_utf8_is_handed_over_to_be_dead_lettered(frontier, redis_client):
    bad = b"\xff\xfe\0" + b"\0" * 4 + (7).to_bytes(6, "big") + b"payload"
    redis_client.zadd("t:queue", {bad: 0})
    redis_client.zadd("t:ready", {b"\xff\xfe": 0})
    result = frontier.lease(10, 60_000)
    assert result.items == [] and len(result.bad) == 1
    assert result.bad[0].reason == "malformed queue entry: slot is not valid UTF-8"
    assert result.bad[0].raw == bad
    # the worker dead-letters it with its acknowledgement: the place it held is freed
    record = dead_letter(result.bad[0].reason, raw=bad, source="queue")
    frontier.commit([result.bad[0].ref], [Entry(EntryKind.DEAD_LETTER, b"", 0, record)])
    assert redis_client.hlen("t:inflight") == 0 and redis_client.hlen("t:requests") == 0
    assert redis_client.llen("t:dead") == 1


def test_a_slot_lost_from_ready_is_armed_again(frontier, redis_client):
    push(frontier, (b"a", 0, b"a"))
    redis_client.delete("t:ready")
    first = frontier.lease(10, 60_000)
    assert first.rearmed == 1
    leased = first.items or frontier.lease(10, 60_000).items
    assert [x.payload for x in leased] == [b"a"]


def test_a_late_ack_takes_its_expired_request_back_out_of_the_queue(redis_client):
    """An expired lease keeps its record with its token marked expired (lib.lua's
    expired_token): the stalled worker's late acknowledgement still takes the request out of
    the queue, so it is not crawled twice, and neither that acknowledgement nor a place report
    counts as a lease still held (commit.lua and places.lua read the record, not the lease)."""
    frontier = Frontier(redis_client, FrontierKeys("t"))
    frontier.commit([], [entry(b"a", b"a")])
    (mine,) = frontier.lease(1, 50).items
    time.sleep(0.1)
    assert frontier.requeue_expired().requeued == 1
    record = redis_client.hget("t:requests", mine.id)
    assert record is not None and record[8:] == redis_client.zrange("t:queue", 0, -1)[0]
    marked = mine.token[:4] + bytes([(mine.token[4] + 128) % 256]) + mine.token[5:]
    assert record[:8] == marked != mine.token
    assert redis_client.hlen("t:inflight") == 0  # the requeue gave the place back
    assert frontier.places([mine.ref]) == (0, 0)  # and the report gives back nothing more
    assert frontier.renew([mine.ref], 60_000) == 0
    assert frontier.release([mine.ref]) == 0  # nor is it given back: it is queued already
    late = frontier.commit([mine.ref], [])
    assert (late.late, late.stale, late.missing) == (1, 0, 0)
    assert redis_client.zcard("t:queue") == 0 and redis_client.hlen("t:requests") == 0
    assert redis_client.hlen("t:inflight") == 0 and redis_client.scard("t:placeless") == 0
    assert frontier.lease(1, 50).items == []


def test_leases_of_a_dead_worker_are_given_back_and_a_live_ones_kept(redis_client):
    keys = FrontierKeys("t")
    dead, alive, reaper = (Frontier(redis_client, keys) for _ in range(3))
    for i in range(4):
        push(dead, (f"{i}".encode(), 0, f"{i}".encode()))
    now_ms = int(time.time() * 1000)
    redis_client.zadd("t:alive", {dead.tag: now_ms - 60_000, alive.tag: now_ms + 60_000})
    held_dead = dead.lease(2, 600_000).items
    held_alive = alive.lease(2, 600_000).items
    result = reaper.requeue_expired(worker_timeout_ms=10_000)
    assert (result.dead_workers, result.released) == (1, 2)
    assert redis_client.zscore("t:alive", dead.tag) is None
    assert redis_client.zscore("t:alive", alive.tag) is not None
    for item in held_alive:
        assert redis_client.zscore("t:leases", item.id) is not None
    again = reaper.lease(10, 600_000).items
    assert sorted(x.payload for x in again) == sorted(x.payload for x in held_dead)
    # the dead worker was only frozen: its acknowledgements are stale now
    assert dead.commit([x.ref for x in held_dead], []).stale == 2


def test_drained_sees_every_kind_of_pending_work(frontier, redis_client):
    assert frontier.drained().idle(1000)
    redis_client.lpush("t:start_urls", b"http://a.test/")
    assert not frontier.drained().idle(1000)
    redis_client.delete("t:start_urls")
    frontier.commit([], [entry(b"", b"retry", kind=EntryKind.RETRY, raw=b"5000")])
    assert not frontier.drained().idle(10_000)  # due within the idle timeout
    assert frontier.drained().idle(1000)  # due later: another worker will take it
    push(frontier, (b"a", 0, b"a"))
    assert not frontier.drained().idle(1000)
    frontier.lease(1, 60_000)
    state = frontier.drained()
    assert (state.queued, state.leased) == (0, 1) and not state.idle(1000)


def test_dead_letter_records_keep_64_kb_of_raw_bytes_with_length_and_hash():
    raw = b"\xe2\x82\xac" * 30_000  # 90,000 bytes of UTF-8, cut inside a character
    record = json.loads(dead_letter("too large", raw=raw, source="start_urls"))
    assert record["raw_length"] == 90_000 and record["truncated"] is True
    assert record["raw_sha1"] == hashlib.sha1(raw).hexdigest()
    assert len(record["raw"].encode()) <= DEAD_RAW_BYTES
    assert raw.startswith(record["raw"].encode())
    small = json.loads(dead_letter("bad", raw=b"\xff\x00x", source="queue"))
    assert small["raw"].encode("latin-1") == b"\xff\x00x" and "truncated" not in small


# ------------------------------------------------------------------ start_urls claims


def start_entry(raw: bytes) -> Entry:
    return Entry(EntryKind.START_REQUEST, b"fp-" + raw, 0, b"req-" + raw, raw, "a.test")


def beat(redis_client, *frontiers, age_ms=0):
    now_ms = int(time.time() * 1000)
    redis_client.zadd("t:alive", {f.tag: now_ms - age_ms for f in frontiers})


def test_two_workers_claim_each_entry_exactly_once(redis_client):
    keys = FrontierKeys("t")
    a, b = Frontier(redis_client, keys), Frontier(redis_client, keys)
    pushed = [f"http://a.test/{i}".encode() for i in range(1000)]
    redis_client.lpush("t:start_urls", *pushed)
    taken: dict[Frontier, list[bytes]] = {a: [], b: []}
    for worker in itertools.cycle((a, b)):
        got = worker.claim_start_urls(37)
        if not got:
            break
        taken[worker] += got
        # each claim is stored before the next (the scheduler's rule)
        assert worker.commit([], [start_entry(raw) for raw in got]).enqueued == len(got)
    both = taken[a] + taken[b]
    assert len(both) == len(set(both)) == 1000 and set(both) == set(pushed)
    assert taken[a] and taken[b]
    # oldest first within each claim: the order producers pushed in
    assert taken[a][:37] == pushed[:37]
    assert redis_client.zcard("t:queue") == 1000
    assert redis_client.exists("t:start_urls", "t:claimants", f"t:claims:{a.tag}") == 0


def test_a_dead_workers_claims_go_back_and_another_worker_takes_them(redis_client):
    keys = FrontierKeys("t")
    dead, alive, reaper = (Frontier(redis_client, keys) for _ in range(3))
    redis_client.lpush("t:start_urls", *[f"http://a.test/{i}".encode() for i in range(10)])
    beat(redis_client, dead, age_ms=60_000)
    beat(redis_client, alive, reaper)
    lost = dead.claim_start_urls(4)
    kept = alive.claim_start_urls(3)
    assert redis_client.smembers("t:claimants") == {dead.tag.encode(), alive.tag.encode()}
    result = reaper.requeue_expired(worker_timeout_ms=10_000)
    assert (result.dead_workers, result.unclaimed) == (1, 4)
    assert redis_client.exists(f"t:claims:{dead.tag}") == 0
    assert redis_client.smembers("t:claimants") == {alive.tag.encode()}
    assert redis_client.lrange(f"t:claims:{alive.tag}", 0, -1) == kept[::-1]
    # given back at the consuming end, oldest taken first, before the entries never claimed
    assert reaper.claim_start_urls(4) == lost
    # the dead worker was only frozen: its late commit finds its claims gone, stores nothing
    late = dead.commit([], [start_entry(raw) for raw in lost])
    assert (late.enqueued, late.skipped) == (0, 4)
    assert reaper.commit([], [start_entry(raw) for raw in lost]).enqueued == 4
    assert reaper.requeue_expired(worker_timeout_ms=10_000).unclaimed == 0


def test_claims_of_a_tag_that_beats_again_are_kept(redis_client):
    """unclaim.lua checks alive itself: a stalled worker that beat again between the reaper's
    two calls stores its claims itself; one whose tag is gone has them given back."""
    keys = FrontierKeys("t")
    stalled, gone, reaper = (Frontier(redis_client, keys) for _ in range(3))
    redis_client.lpush("t:start_urls", b"http://a.test/1", b"http://a.test/2")
    stalled.claim_start_urls(1)
    gone.claim_start_urls(1)
    beat(redis_client, stalled)
    assert reaper.unclaim_orphans([stalled.tag, gone.tag]) == 1
    assert redis_client.llen(f"t:claims:{stalled.tag}") == 1
    assert redis_client.smembers("t:claimants") == {stalled.tag.encode()}


def test_a_commit_takes_claimed_entries_without_scanning_start_urls(redis_client):
    """50,000 entries waiting: the commit removes its entries from the worker's claim list of
    a batch, never from start_urls, whose length and content it leaves as they are."""
    frontier = Frontier(redis_client, FrontierKeys("t"))
    waiting = [f"http://w.test/{i}".encode() for i in range(50_000)]
    for at in range(0, len(waiting), 5000):
        redis_client.lpush("t:start_urls", *waiting[at : at + 5000])
    claimed = frontier.claim_start_urls(100)
    assert claimed == waiting[:100]
    redis_client.lpush("t:start_urls", b"http://w.test/meanwhile")
    # an entry still in start_urls, not claimed: a commit does not take it from there
    stray = start_entry(waiting[100])
    result = frontier.commit([], [start_entry(raw) for raw in claimed] + [stray])
    assert (result.enqueued, result.skipped) == (100, 1)
    assert redis_client.llen("t:start_urls") == 49_901
    assert redis_client.lindex("t:start_urls", 0) == b"http://w.test/meanwhile"
    assert redis_client.lindex("t:start_urls", -1) == waiting[100]
    assert redis_client.exists(f"t:claims:{frontier.tag}", "t:claimants") == 0


def test_unclaim_gives_back_what_is_claimed_to_be_taken_next(frontier, redis_client):
    redis_client.lpush("t:start_urls", b"http://a.test/1", b"http://a.test/2", b"http://a.test/3")
    claimed = frontier.claim_start_urls(2)
    assert claimed == [b"http://a.test/1", b"http://a.test/2"]
    redis_client.lpush("t:start_urls", b"http://a.test/4")
    assert frontier.unclaim() == 2
    assert redis_client.exists(f"t:claims:{frontier.tag}", "t:claimants") == 0
    other = Frontier(redis_client, FrontierKeys("t"))
    assert other.claim_start_urls(10) == [b"http://a.test/%d" % i for i in (1, 2, 3, 4)]


def test_claims_whose_reply_was_lost_are_handed_out_again(frontier, redis_client):
    redis_client.lpush("t:start_urls", b"http://a.test/1", b"http://a.test/2", b"http://a.test/3")
    frontier.claim_start_urls(2)  # the reply never reached the worker
    assert frontier.claim_start_urls(2) == [b"http://a.test/1", b"http://a.test/2"]
    assert frontier.claim_start_urls(3) == [b"http://a.test/%d" % i for i in (1, 2, 3)]
    assert redis_client.llen("t:start_urls") == 0


def test_drained_counts_claimed_entries_as_work(frontier, redis_client):
    redis_client.lpush("t:start_urls", b"http://a.test/")
    (raw,) = frontier.claim_start_urls(10)
    state = frontier.drained()
    assert (state.start_urls, state.claimants) == (0, 1) and not state.idle(1000)
    frontier.commit([], [start_entry(raw)])
    frontier.lease(1, 60_000)
    assert frontier.drained().claimants == 0


def test_clear_removes_the_claim_lists(frontier, redis_client):
    redis_client.lpush("t:start_urls", b"http://a.test/1", b"http://a.test/2")
    frontier.claim_start_urls(1)
    frontier.admin.clear()
    assert redis_client.keys("t:*") == []


# ---------------------------------------------------------------- finished slots are forgotten


def test_the_sweep_forgets_finished_slots_and_keeps_the_others(frontier, redis_client):
    now = frontier.client.time()[0] * 1000
    old, soon = now - 120_000, now + 30_000
    for n in range(6):
        redis_client.hset("t:slots", f"s{n}.test", old)
        redis_client.hset("t:throttle:state", f"s{n}.test", "2:0.5:0")
        redis_client.hset("t:throttle", f"s{n}.test", 2000)
        redis_client.hset("t:robots", f"s{n}.test", 1000)
    redis_client.zadd("t:ready", {"s1.test": now})  # queued work
    redis_client.hset("t:inflight", "s2.test", 1)  # a request at the site
    redis_client.hset("t:slots", "s3.test", soon)  # its turn is still to come
    redis_client.hset("t:robots", "s4.test", -1)  # robots.txt being read
    redis_client.hset("t:limits", "s5.test", "500:")  # an operator's limit stays
    result = frontier.sweep_slots(grace_ms=60_000, count=1000)
    assert result.wrapped and result.looked == 6
    assert result.forgotten == 2  # s0 and s5
    assert sorted(redis_client.hkeys("t:slots")) == [b"s1.test", b"s2.test", b"s3.test", b"s4.test"]
    assert sorted(redis_client.hkeys("t:throttle")) == sorted(redis_client.hkeys("t:slots"))
    assert sorted(redis_client.hkeys("t:throttle:state")) == sorted(redis_client.hkeys("t:slots"))
    # the Crawl-delay stays: a worker that parsed robots.txt does not report it again
    assert redis_client.hlen("t:robots") == 6
    assert redis_client.hget("t:limits", "s5.test") == b"500:"


def test_a_slot_leased_without_a_delay_is_not_finished_until_a_minute_after(frontier, redis_client):
    push(frontier, (b"fp-1", 0, b"one"))
    (item,) = frontier.lease(5, 10_000).items
    frontier.commit([item.ref], [])
    assert redis_client.hexists("t:slots", "t.test")  # stamped by the lease
    assert frontier.sweep_slots(grace_ms=60_000).forgotten == 0
    assert frontier.sweep_slots(grace_ms=0).forgotten == 1


def test_the_sweep_goes_round_a_large_crawl_a_bounded_page_at_a_time(frontier, redis_client):
    old = frontier.client.time()[0] * 1000 - 120_000
    redis_client.hset("t:slots", mapping={f"h{n}.test": old for n in range(3000)})
    rounds, looked = 0, []
    while redis_client.hlen("t:slots") and rounds < 1000:
        result = frontier.sweep_slots(grace_ms=60_000, count=100)
        looked.append(result.looked)
        rounds += 1
    assert redis_client.hlen("t:slots") == 0
    assert max(looked) < 400  # HSCAN's COUNT is a hint: a page, never the whole HASH
    assert 10 <= rounds <= 100


def test_a_slot_swept_and_then_given_work_again_starts_afresh(frontier, redis_client):
    push(frontier, (b"fp-1", 0, b"one"))
    (item,) = frontier.lease(5, 10_000).items
    frontier.commit([item.ref], [])
    assert frontier.sweep_slots(grace_ms=0).forgotten == 1
    push(frontier, (b"fp-2", 0, b"two"))
    (item,) = frontier.lease(5, 10_000).items
    assert item.payload == b"two"


@pytest.mark.parametrize("seen", ["set", "bloom"])
def test_a_request_in_the_legacy_seen_set_is_a_duplicate(redis_client, seen):
    """An imported crawl's legacy seen-set (scrapy-redis fingerprints in ``raw``): a request
    found there is dropped like one in the seen-set; one without a legacy fingerprint
    (``raw`` empty, as every request of a crawl without one) is not looked up there."""
    keys = FrontierKeys("t")
    frontier = Frontier(redis_client, keys, seen=seen, bloom_capacity=1000)
    redis_client.sadd(keys.legacy_seen, b"old-page-fp1")

    def entry(fp, legacy, payload):
        return Entry(EntryKind.REQUEST, fp, 0, payload, legacy, "t.test")

    r = frontier.commit(
        [],
        [
            entry(b"fp-crawled-1", b"old-page-fp1", b"crawled before"),
            entry(b"fp-new-00001", b"new-page-fp1", b"new"),
            entry(b"fp-new-00002", b"", b"no legacy fingerprint"),
            entry(b"", b"old-page-fp1", b"dont_filter"),  # never filtered
        ],
        positions=True,
    )
    assert (r.enqueued, r.duplicates, r.not_stored) == (3, 1, (0,))
    payloads = {x.payload for x in frontier.lease(10, 10_000)[0]}
    assert payloads == {b"new", b"no legacy fingerprint", b"dont_filter"}
    assert redis_client.scard(keys.legacy_seen) == 1  # only read
