"""The scheduler's parts with state of their own (distcrawl/engine/), without Redis or a
crawl: the rules a crawl test would only show through timing, checked one at a time."""

from __future__ import annotations

import math
import time

from scrapy import Request

from distcrawl.config import DistcrawlConfig
from distcrawl.engine._batch_types import Batch, LeasedRequest
from distcrawl.engine.building import reserves_per_slot
from distcrawl.engine.leases import Leases
from distcrawl.engine.outbox import Outbox
from distcrawl.engine.polling import CONTENDED_POLL_MAX, SHORT_LEASE_WAIT, Polling
from distcrawl.model.queue_entry import LeaseRef
from distcrawl.model.records import Entry, EntryKind
from distcrawl.model.replies import LeaseResult


def leased(n: int, slot: str = "a.example", *, reserve: bool = False, paced: bool = False):
    ref = LeaseRef(f"id{n}", b"t")
    request = Request(f"https://{slot}/{n}")
    return LeasedRequest(ref, request, b"", slot, paced, reserve=reserve), ref, request


def entry(n: int) -> Entry:
    return Entry(EntryKind.REQUEST, b"", 0, str(n).encode())


# ---------------------------------------------------------------------- leases


def test_a_reserve_takes_the_place_of_a_request_of_its_slot_that_left_the_downloader():
    leases = Leases()
    first, first_ref, first_request = leased(1)
    reserve, reserve_ref, reserve_request = leased(2, reserve=True)
    leases.add(first, leased_at=0)
    leases.add(reserve, leased_at=0)
    assert (leases.ready, leases.waiting) == (1, 2)
    assert leases.hand_out() is first_request
    assert leases.hand_out() is None  # a reserve is never handed out without a place

    assert leases.left(first_request) is True
    assert leases.hand_out() is reserve_request
    assert leases.unreported == 2  # the place freed, and the reserve sent in it
    batch = Batch()
    leases.report(batch)
    assert (batch.freed, batch.taken) == ([first_ref], [reserve_ref])
    assert not leases.unreported


def test_a_reserve_that_took_a_place_and_left_it_before_the_report_is_in_neither_list():
    """Swapped in and out of the downloader between two batches: the report frees the place
    of the request it replaced and says nothing of the reserve, which Redis still counts,
    rightly, as holding none. Reported as taken and freed, places.lua would read the freed
    first (the reserve holds no place: nothing to free), then the taken, and count it at the
    site until its acknowledgement."""
    leases = Leases()
    first, first_ref, first_request = leased(1)
    reserve, _, reserve_request = leased(2, reserve=True)
    chained, chained_ref, chained_request = leased(3, reserve=True)
    for item in (first, reserve, chained):
        leases.add(item, leased_at=0)
    leases.hand_out()
    assert leases.left(first_request) is True
    assert leases.hand_out() is reserve_request
    assert leases.left(reserve_request) is True  # the next reserve takes the place again
    assert leases.hand_out() is chained_request
    batch = Batch()
    leases.report(batch)
    assert (batch.freed, batch.taken) == ([first_ref], [chained_ref])

    assert leases.left(chained_request) is False  # reported as taken already: freed now
    leases.report(batch)
    assert batch.freed == [first_ref, chained_ref]


def test_a_freed_place_is_reported_at_once_and_a_reserves_swap_rides_with_the_next_batch():
    """A swap leaves Redis' count right (the place stays counted), so its report waits for
    the next batch sent for other work, up to an interval; a place left free by a worker
    short of work (the count is one too high, and a lease in the same batch gives it work) or
    a paced request sent (its slot's next turn) is reported at once."""
    leases = Leases(short=4)
    now = time.monotonic()
    first, first_ref, first_request = leased(1)
    reserve, reserve_ref, _ = leased(2, reserve=True)
    for item in (first, reserve):
        leases.add(item, leased_at=0)
    assert not leases.report_due(now, 0.05)  # nothing to report
    leases.hand_out()
    assert leases.left(first_request) is True  # swapped
    assert not leases.report_due(time.monotonic(), 0.05)
    assert leases.report_due(time.monotonic() + 0.05, 0.05)  # waited a whole interval

    batch = Batch(want=4)  # a lease goes anyway: the swap rides with it
    leases.report(batch)
    assert (batch.freed, batch.taken) == ([first_ref], [reserve_ref])
    leases.report(batch)  # a second look adds nothing and keeps what the batch holds
    assert (batch.freed, batch.taken) == ([first_ref], [reserve_ref])
    assert not leases.report_due(time.monotonic() + 1, 0.05)

    second, _, second_request = leased(3)
    leases.add(second, leased_at=0)
    leases.hand_out()  # the swapped-in reserve
    assert leases.hand_out() is second_request
    assert leases.left(second_request) is False  # its place is free: no reserve left
    assert leases.report_due(time.monotonic(), 0.05)

    paced_leases = Leases()
    paced, _, paced_request = leased(4, slot="slow.example", paced=True)
    paced_leases.add(paced, leased_at=0)
    paced_leases.hand_out()
    assert paced_leases.downloading(paced_request) is True
    assert paced_leases.report_due(time.monotonic(), 0.05)


def test_a_freed_place_waits_for_the_next_batch_while_the_worker_has_work():
    """A place left free is reported at once only by a worker short of work: nothing waiting
    here and fewer than ``short`` (half of CONCURRENT_REQUESTS) of its requests in the engine.
    One with requests ready, or a CPU-bound one whose downloader still holds many (the engine
    pulls every ready request at once), sends its report with its next batch, at most an
    interval later, not in a batch of its own per answer."""
    leases = Leases(short=2)
    items = [leased(n) for n in range(4)]
    for item, _, _ in items:
        leases.add(item, leased_at=0)
    first = leases.hand_out()
    assert first is not None
    assert leases.left(first) is False  # no reserve: its place is free
    assert leases.waiting == 3 and leases.unreported == 1
    assert not leases.starving()
    assert not leases.report_due(time.monotonic(), 0.05)  # three requests still to send
    assert leases.report_due(time.monotonic() + 0.05, 0.05)  # but no longer than an interval

    requests = [leases.hand_out() for _ in range(3)]
    assert leases.waiting == 0 and None not in requests
    assert leases.left(requests[0]) is False
    # nothing waits, but the engine holds 4: its downloader has work until the next turn
    assert not leases.starving()
    assert not leases.report_due(time.monotonic(), 0.05)

    # three of them done: the engine holds one, fewer than half its concurrency
    leases.finished(in_progress={requests[2]})
    assert leases.starving()
    assert leases.left(requests[2]) is False
    assert leases.report_due(time.monotonic(), 0.05)  # short of work: at once


def test_a_worker_may_hold_a_whole_prefetch_of_reserves_of_a_slot():
    assert reserves_per_slot(16) == 16
    assert reserves_per_slot(2) == 2
    assert reserves_per_slot(1) == 0  # DISTCRAWL_PREFETCH = 1 turns reserves off


def test_a_request_without_a_reserve_frees_its_place_and_is_acknowledged_once_done():
    leases = Leases()
    item, ref, request = leased(1)
    leases.add(item, leased_at=0)
    leases.hand_out()
    assert leases.left(Request("https://a.example/other")) is None  # not one of ours
    assert leases.left(request) is False
    assert leases.finished(in_progress={request}) == []
    assert leases.finished(in_progress=set()) == [ref]
    assert leases.unreported == 1 and not leases.active  # only the place report is left


def test_a_request_is_held_from_its_lease_until_the_engine_is_done_with_it():
    """Past the downloader too: while its items wait for the pipeline, its lease counts
    against the room for more (BatchBuilder._lease_room)."""
    leases = Leases()
    items = [leased(n) for n in range(3)] + [leased(3, reserve=True)]
    for item, _, _ in items:
        leases.add(item, leased_at=0)
    assert leases.held == 4
    request = leases.hand_out()
    assert request is not None and leases.left(request) is True  # the reserve took its place
    assert leases.held == 4  # off the site, its items not yet stored
    assert len(leases.finished(in_progress=set())) == 1
    assert leases.held == 3


def test_a_paced_request_goes_first_and_is_reported_when_it_reaches_the_downloader():
    leases = Leases()
    plain, _, plain_request = leased(1)
    paced, _, paced_request = leased(2, slot="slow.example", paced=True)
    leases.add(plain, leased_at=0)
    leases.add(paced, leased_at=1234)
    assert leases.hand_out() is paced_request
    assert leases.downloading(plain_request) is False
    assert leases.downloading(paced_request) is True
    batch = Batch()
    leases.report(batch)
    assert batch.sent == [("slow.example", 1234)]


def test_closing_gives_back_every_lease_and_pausing_only_those_not_in_the_engine():
    leases = Leases()
    items = [leased(n) for n in range(3)] + [leased(3, reserve=True)]
    for item, _, _ in items:
        leases.add(item, leased_at=0)
    leases.hand_out()
    assert sorted(r.id for r in leases.release_waiting()) == ["id1", "id2", "id3"]
    assert leases.active and leases.waiting == 0
    assert [r.id for r in leases.release_all()] == ["id0"]
    assert not leases.busy()


def test_reserves_of_a_slot_with_nothing_left_to_replace_go_back():
    leases = Leases()
    reserve, ref, _ = leased(1, slot="gone.example", reserve=True)
    held_item, _, _ = leased(2, slot="kept.example")
    kept_reserve, _, _ = leased(3, slot="kept.example", reserve=True)
    for item in (reserve, held_item, kept_reserve):
        leases.add(item, leased_at=0)
    release, held = leases.release_idle_reserves(count=True)
    assert release == [ref]
    assert held == {"kept.example": 1}
    assert leases.reserved() == {"kept.example": 1}


# ---------------------------------------------------------------------- outbox


def test_an_acknowledgement_waits_for_the_entries_pushed_before_it():
    outbox = Outbox(DistcrawlConfig(push_batch_size=2))
    for n in range(3):
        outbox.push(entry(n))
    ref = LeaseRef("id1", b"t")
    outbox.ack(ref)
    outbox.push(entry(3))  # pushed after the ack: not waited for

    first = outbox.current()
    assert first is not None and (len(first.entries), first.acks) == (2, [])
    assert outbox.current() is first  # sent again, unchanged, until Redis confirms it
    assert outbox.acked_refs() == [ref]
    outbox.commit = None
    second = outbox.current()
    assert second is not None and (len(second.entries), second.acks) == (2, [ref])
    assert outbox.counts() == (2, 1)


def test_a_commit_waits_for_other_work_until_overdue_full_or_throttled():
    """Entries and acknowledgements ride with the next batch sent for other work; alone
    they go once they waited DISTCRAWL_FLUSH_INTERVAL, fill a commit, or a response asked
    every worker to slow down."""
    from scrapy.http import Response

    config = DistcrawlConfig(push_batch_size=3, flush_interval=0.05)
    outbox = Outbox(config)
    now = time.monotonic()
    assert not outbox.overdue(now)
    outbox.ack(LeaseRef("id1", b"t"))
    assert not outbox.overdue(time.monotonic())
    assert outbox.overdue(time.monotonic() + 0.05)
    assert outbox.current() is not None  # taken: nothing waits any more
    outbox.commit = None
    assert not outbox.overdue(time.monotonic() + 1)

    for n in range(3):
        outbox.push(entry(n))
    assert outbox.overdue(time.monotonic())  # a full commit
    outbox.current()
    outbox.commit = None

    request = Request("https://a.example/1")
    assert outbox.feedback(request, Response(request.url, status=200, request=request)) is False
    assert not outbox.overdue(time.monotonic())  # a response's counts wait
    assert outbox.overdue(time.monotonic() + 0.05)
    assert outbox.feedback(request, Response(request.url, status=429, request=request)) is True
    assert outbox.overdue(time.monotonic())  # every worker must hold back now
    commit = outbox.current()
    assert commit is not None and commit.feedback
    outbox.commit = None
    assert not outbox.overdue(time.monotonic() + 1)


def test_closing_takes_every_commit_left():
    outbox = Outbox(DistcrawlConfig(push_batch_size=2))
    for n in range(5):
        outbox.push(entry(n))
    outbox.ack(LeaseRef("id1", b"t"))
    commits = outbox.take_all()
    assert [len(c.entries) for c in commits] == [2, 2, 1]
    assert [len(c.acks) for c in commits] == [0, 0, 1]
    assert not outbox.pending() and outbox.take_all() == []


# ---------------------------------------------------------------------- polling


def test_an_empty_lease_poll_backs_off_doubling_up_to_the_cap():
    """Up to DISTCRAWL_IDLE_POLL_MAX, and at most CONTENDED_POLL_MAX while this worker's
    own pages are in progress (not idle): they, or another worker's, may queue requests."""
    config = DistcrawlConfig(idle_poll_max=0.2)
    polling = Polling(config)
    now = time.monotonic()
    waits = []
    for _ in range(4):
        polling.back_off(now, LeaseResult([], queue_size=0, delayed=0, released=0), idle=False)
        waits.append(round(polling._next_lease - now, 3))
    assert waits == [0.05, 0.1, 0.2, 0.2]
    polling = Polling(DistcrawlConfig(idle_poll_max=1.0))
    for _ in range(6):
        polling.back_off(now, LeaseResult([], queue_size=0, delayed=0, released=0), idle=False)
    assert polling._next_lease - now == CONTENDED_POLL_MAX
    polling.lease_now(now)
    assert polling.lease_due(now)


def test_a_short_lease_waits_for_a_freed_place_and_nothing_queued_ignores_one():
    """A lease that brought fewer requests than asked found the slots full (or out of
    requests): asking again at once finds nothing, so the next poll waits for a place this
    worker frees, the reply's next turn, or at most SHORT_LEASE_WAIT. With nothing queued
    anywhere a freed place brings no poll either: only a commit that queued requests does."""
    config = DistcrawlConfig(flush_interval=0.01)
    polling = Polling(config)
    now = time.monotonic()
    full = LeaseResult([], queue_size=40, delayed=0, released=0)
    polling.leased(now, full, got=16, asked=16)
    assert polling.lease_due(now)  # all it asked for: more may come at once
    polling.leased(now, full, got=3, asked=16)
    assert not polling.lease_due(now + SHORT_LEASE_WAIT / 2)
    assert polling.lease_due(now + SHORT_LEASE_WAIT)
    polling.place_freed()
    assert polling.lease_due(time.monotonic())  # a place of this worker's is free in Redis
    turn = LeaseResult([], queue_size=40, delayed=0, released=0, wait=0.03)
    polling.leased(now, turn, got=1, asked=16)  # a delayed slot's one request of its turn
    assert not polling.lease_due(now + 0.01) and polling.lease_due(now + 0.03)

    drained = LeaseResult([], queue_size=0, delayed=0, released=0)
    polling.leased(now, drained, got=2, asked=16)
    polling.place_freed()
    assert not polling.lease_due(now + 0.01)  # a free place, but no request to take
    polling.lease_now(now)  # a commit queued requests
    assert polling.lease_due(now)
    polling.back_off(now, drained, idle=False)
    polling.place_freed()
    assert not polling.lease_due(now + 0.01)


def test_requests_waiting_in_full_slots_cap_the_back_off_lower():
    polling = Polling(DistcrawlConfig(idle_poll_max=1.0))
    now = time.monotonic()
    for _ in range(10):
        polling.back_off(now, LeaseResult([], queue_size=5, delayed=0, released=0), idle=True)
    assert polling._next_lease - now == CONTENDED_POLL_MAX


def test_an_idle_worker_parks_until_the_next_due_time():
    polling = Polling(DistcrawlConfig())
    now = time.monotonic()
    empty = LeaseResult([], queue_size=0, delayed=0, released=0)
    assert polling.back_off(now, empty, idle=True) == math.inf  # nothing due: parked
    assert not polling.lease_due(now + 3600)  # no poll while parked
    due = LeaseResult([], queue_size=0, delayed=1, released=0, wait=30.0)
    assert polling.back_off(now, due, idle=True) == 30.0  # a retry due in 30 s
    assert polling.back_off(now, empty, idle=False) is None  # holds work: polls
    assert round(polling._next_lease - now, 3) == 0.05
    polling.lease_now(now)
    assert polling.lease_due(now)


# ---------------------------------------------------------------------- status, parking, builder


class FakeWaits:
    """idle.IdleWaits without its threads: what the parking asks of it."""

    def __init__(self) -> None:
        self.parks: list[bool] = []
        self.claiming = False

    def park(self, *, claims: bool) -> None:
        self.parks.append(claims)

    def unpark(self) -> None:
        pass


def builder_parts(config: DistcrawlConfig | None = None):
    """A batch builder and the parts it reads, wired as Scheduler.__init__ wires them."""
    from types import SimpleNamespace

    from distcrawl.engine.building import BatchBuilder
    from distcrawl.engine.handlers import IdleClock
    from distcrawl.engine.link import Link
    from distcrawl.engine.outage import Outage
    from distcrawl.engine.parking import Parking
    from distcrawl.engine.parts import Parts
    from distcrawl.engine.report import Reporter
    from distcrawl.engine.riders import Riders
    from distcrawl.engine.status import Status

    config = config or DistcrawlConfig()
    leases, outbox, polling = Leases(), Outbox(config), Polling(config)
    report = Reporter(SimpleNamespace(stats=None), config, None)  # type: ignore[arg-type]
    status = Status(config, leases, outbox)
    link = Link(idle_waits=FakeWaits())  # type: ignore[arg-type]
    parking = Parking(config, link, status, polling, report)
    parts = Parts(
        config,
        link=link,
        status=status,
        leases=leases,
        outbox=outbox,
        polling=polling,
        outage=Outage(config, None),
        riders=Riders(),
        report=report,
        parking=parking,
        idle_clock=IdleClock(),
    )
    builder = BatchBuilder(parts)
    return SimpleNamespace(
        builder=builder, parking=parking, status=status, outbox=outbox, link=link
    )


def test_the_status_counts_the_work_known_to_wait_and_the_pending_cap():
    parts = builder_parts(DistcrawlConfig(max_pending=10))
    status = parts.status
    assert (status.waiting(), status.pending(), status.full()) == (0, False, False)
    parts.outbox.push(entry(1))
    status.remote_queue = 10
    assert (status.waiting(), status.pending(), status.full()) == (11, True, True)


def test_a_parked_worker_sends_no_poll_and_looks_for_dead_workers_work_once_an_interval():
    from distcrawl.engine.idle import IDLE_REAP_INTERVAL

    parts = builder_parts()
    builder, parking = parts.builder, parts.parking
    now = time.monotonic()
    parking.park(now, math.inf)
    assert parts.link.idle_waits.parks == [True]  # nothing claimed or paused: BLMOVE too
    batch = builder.build(now)
    assert parking.parked and not (batch.want or batch.peek or batch.idle_reap)
    assert builder.build(now + IDLE_REAP_INTERVAL).idle_reap
    assert not builder.build(now + IDLE_REAP_INTERVAL + 1).idle_reap
    parts.outbox.push(entry(1))  # something to store: back to polling, and a lease with it
    batch = builder.build(now + IDLE_REAP_INTERVAL + 2)
    assert not parking.parked and batch.commits and batch.want and batch.peek


def test_a_last_acknowledgement_riding_with_a_lease_poll_still_looks_for_the_finish():
    """A last page without links has only its acknowledgement to commit: it waits for the
    next batch (a lease poll) and rides with it. That batch must still look at the whole
    crawl (finish.lua), or the finish waits for Scrapy's next idle signal, 5 s later."""
    parts = builder_parts()
    parts.outbox.ack(LeaseRef("id1", b"t"))
    batch = parts.builder.build(time.monotonic())
    assert batch.commits and batch.commits[0].acks and batch.want
    assert batch.drain
    # a worker still holding work does not look: another page's commit will
    parts = builder_parts()
    lease, _, _ = leased(2)
    parts.builder._p.leases.add(lease, 0)
    parts.outbox.ack(LeaseRef("id1", b"t"))
    batch = parts.builder.build(time.monotonic())
    assert batch.commits and not batch.drain


def test_a_wait_that_woke_a_parked_worker_has_its_next_lease_ask_every_shard_once():
    parts = builder_parts()
    builder, parking = parts.builder, parts.parking
    now = time.monotonic()
    parking.park(now, math.inf)
    parking.woke("woken", None, now)
    assert not parking.parked
    assert builder.build(now).woken
    assert not builder.build(now).woken


def test_a_pause_gives_the_claims_back_once_and_ends_a_claim_wait_first():
    parts = builder_parts()
    parts.status.paused = True
    parts.link.idle_waits.claiming = True
    ended: list[bool] = []
    parts.link.idle_waits.end_claims = lambda: ended.append(True)
    assert not parts.builder.build(time.monotonic()).unclaim and ended == [True]
    parts.link.idle_waits.claiming = False
    assert parts.builder.build(time.monotonic()).unclaim
    assert not parts.builder.build(time.monotonic()).unclaim  # in a batch already


# ---------------------------------------------------------------------- intake


def test_a_dead_letter_keeps_what_the_codec_takes_of_a_request_whose_meta_it_refuses():
    """An object in meta (a middleware's) must not cost the rest of the request: the dead
    letter keeps URL, method, body, callback, priority and the other meta, and names what it
    left out, so that a re-drive makes the same request but for that value."""
    import base64
    import json
    from types import SimpleNamespace

    from scrapy import Spider

    from distcrawl.codec.serialize import RequestCodec
    from distcrawl.engine.intake import Intake

    class Blog(Spider):
        name = "blog"

        def parse_post(self, response):
            pass

    spider = Blog()
    codec = RequestCodec("msgpack", spider)
    intake = Intake(DistcrawlConfig(), None, codec, spider, SimpleNamespace(stats=None))
    request = Request(
        "https://blog.example/post",
        method="POST",
        body=b"q=1",
        callback=spider.parse_post,
        priority=7,
        meta={"site_scope": "blog.example", "handle": object(), "depth": 2},
    )
    letter = json.loads(intake.dead_letter(request, "gave up", source="retry").payload)
    assert letter["payload_dropped"] == ["meta.handle"]
    again = codec.decode(base64.b64decode(letter["payload"]))
    assert (again.url, again.method, again.body, again.priority) == (request.url, "POST", b"q=1", 7)
    assert again.callback == spider.parse_post
    assert again.meta == {"site_scope": "blog.example", "depth": 2}


def test_requests_carry_a_scrapy_redis_fingerprint_only_where_the_crawl_has_a_legacy_seen_set():
    """An imported crawl's workers send each filtered request's scrapy-redis fingerprint to
    the commit (``raw``), for the legacy seen-set; every other crawl computes and sends none."""
    from types import SimpleNamespace

    from scrapy import Spider
    from scrapy.utils.request import RequestFingerprinter

    from distcrawl.codec.serialize import RequestCodec
    from distcrawl.dupefilter import RedisDupeFilter, legacy_fingerprint
    from distcrawl.engine.intake import Intake

    spider = Spider(name="site")

    def intake() -> Intake:
        df = RedisDupeFilter(RequestFingerprinter())
        codec = RequestCodec("msgpack", spider)
        return Intake(DistcrawlConfig(), df, codec, spider, SimpleNamespace())

    page = Request("http://a.test/p?b=2&a=1")
    plain = intake().entry(page)
    assert plain is not None and plain.kind is EntryKind.REQUEST and plain.raw == b""

    imported = intake()
    imported.legacy_seen = True
    found = imported.entry(Request("http://a.test/p?a=1&b=2", headers={"X-A": "1"}))
    assert found is not None and found.raw == legacy_fingerprint(page)
    assert found.raw == bytes.fromhex("62bdc495fa932fad277faccf3e113df8016771f0")[:12]
    again = imported.entry(Request("http://a.test/other", dont_filter=True))
    assert again is not None and again.fingerprint == b"" and again.raw == b""  # never filtered


def test_a_batch_leaves_the_place_reports_of_the_requests_it_acknowledges_to_them():
    """A page's acknowledgement often goes in the batch that reports its place: the report
    is then dropped, the acknowledgement gives the place back (test_frontier.py checks that
    Redis ends the same), and the batch costs no place report for it. Reports of requests
    not acknowledged yet still go."""
    parts = builder_parts()
    leases = parts.builder._p.leases
    first, first_ref, first_request = leased(1)
    reserve, reserve_ref, reserve_request = leased(2, reserve=True)
    other, other_ref, other_request = leased(3, slot="b.example")
    for item in (first, reserve, other):
        leases.add(item, leased_at=0)
    assert {leases.hand_out(), leases.hand_out()} == {first_request, other_request}
    assert leases.left(first_request) is True  # the reserve went out in its place
    assert leases.hand_out() is reserve_request
    assert leases.left(other_request) is False  # its place left free
    parts.outbox.ack(first_ref)  # first's page is done, other's not yet
    batch = parts.builder.build(time.monotonic() + 1)
    assert [commit.acks for commit in batch.commits] == [[first_ref]]
    assert (batch.freed, batch.taken) == ([other_ref], [reserve_ref])


def test_a_poll_waiting_for_a_slots_next_turn_names_that_time():
    """Past an interval away, a slot's next turn (the reply's wait) is when the pump asks,
    not its first periodic turn after it (Pump): the slot's gaps stretch by nothing, and no
    worker's periodic beat decides who takes it. Within an interval, or when a back-off or
    a short wait comes sooner, there is no such time."""
    polling = Polling(DistcrawlConfig(flush_interval=0.1))
    now = time.monotonic()

    def reply(wait: float | None) -> LeaseResult:
        return LeaseResult([], queue_size=5, delayed=0, released=0, wait=wait)

    polling.back_off(now, reply(0.6), idle=False)  # the back-off's 50 ms come first
    assert polling.turn_at is None
    for _ in range(3):
        polling.back_off(now, reply(None), idle=False)  # up to CONTENDED_POLL_MAX
    polling.back_off(now, reply(0.15), idle=False)
    assert polling.turn_at == now + 0.15
    assert not polling.lease_due(now + 0.14) and polling.lease_due(now + 0.15)
    polling.back_off(now, reply(0.05), idle=False)  # within an interval: the periodic turn
    assert polling.turn_at is None
    polling.back_off(now, reply(0.15), idle=False)
    polling.lease_now(now)  # work arrived: no turn to wait for
    assert polling.turn_at is None
    polling.leased(now, reply(0.6), got=1, asked=4)  # SHORT_LEASE_WAIT comes first
    assert polling.turn_at is None
    for _ in range(3):
        polling.back_off(now, reply(None), idle=False)
    polling.back_off(now, reply(0.15), idle=False)
    empty = LeaseResult([], queue_size=0, delayed=0, released=0, wait=None)
    assert polling.back_off(now, empty, idle=True) == math.inf  # parked: no turn either
    assert polling.turn_at is None


def test_a_slots_next_turn_is_named_past_a_tenth_of_a_second_at_the_default_interval():
    """At the default 0.2 s interval a slot's turn 0.15 s away is still when the pump asks
    (TURN_FLOOR): left to the periodic turn, a slot with a delay would wait up to 0.2 s more
    each turn, and go to whichever worker's beat came first after it (two of three workers
    never took one of a 1 s slot's turns in a CI run of test_politeness)."""
    polling = Polling(DistcrawlConfig())
    assert polling.config.flush_interval == 0.2
    now = time.monotonic()

    def reply(wait: float | None) -> LeaseResult:
        return LeaseResult([], queue_size=5, delayed=0, released=0, wait=wait)

    for _ in range(4):
        polling.back_off(now, reply(None), idle=False)  # up to CONTENDED_POLL_MAX
    polling.back_off(now, reply(0.15), idle=False)
    assert polling.turn_at == now + 0.15
    assert not polling.lease_due(now + 0.14) and polling.lease_due(now + 0.15)
    polling.back_off(now, reply(0.08), idle=False)  # within TURN_FLOOR: the periodic turn
    assert polling.turn_at is None
    assert not polling.lease_due(now + 0.09) and polling.lease_due(now + 0.1)
