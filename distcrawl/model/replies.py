"""What the frontier's scripts return, as records named as in the scripts' headers, and
the parsers that read their replies (one per script, shared by ``Frontier``'s methods and
the batch runner through ``Op.parse``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from distcrawl.model.queue_entry import (
    Leased,
    LeaseRef,
    QueueEntryError,
    parse_entry,
    raw_id,
    worker_tags,
)


class BadLease(NamedTuple):
    """A leased member that is not a request entry: acknowledged with its dead letter."""

    ref: LeaseRef
    raw: bytes
    reason: str


class LeaseResult(NamedTuple):
    """lease.lua's reply, in the order of its header's "Returns" (the leased entries last)."""

    items: list[Leased]
    #: queue length
    queue_size: int
    #: retries still waiting
    delayed: int
    #: retries released into the queue (due)
    released: int
    #: seconds until some slot's turn comes or a retry is due (None: neither)
    wait: float | None = None
    #: the server's clock at the lease (ms), for ``sent``
    leased_at: int = 0
    #: queue members the script moved to the dead letters (malformed)
    quarantined: int = 0
    #: due retries whose record was gone (Redis lost data, or a bug)
    missing_retries: int = 0
    #: slots that had queued entries but were missing from ``ready``
    rearmed: int = 0
    #: leased members that do not parse, for the worker to dead-letter
    bad: list[BadLease] = []


class Places(NamedTuple):
    """places.lua's reply: places given back for requests that left the downloader, and
    places taken by reserves sent in them (leases no longer held count for neither)."""

    freed: int
    taken: int


class RobotsTxt(NamedTuple):
    """A netloc's shared robots.txt (robots_store.lua stored it)."""

    #: seconds since it was stored, by the clock of the server that stamped it
    age: float
    #: the HTTP status; 0 when the download failed (read as "allowed", like Scrapy)
    status: int
    body: bytes


class SweepResult(NamedTuple):
    forgotten: int
    looked: int
    #: every scan came round to its start: each slot was looked at since the last time
    wrapped: bool


class Runnable(NamedTuple):
    """runnable.lua's reply: the autoscaling signal (docs/operations.md, "Autoscaling")."""

    #: requests the crawl could run now within its politeness (capped)
    requests: int
    #: due slots looked at, and in all (more than looked at: ``requests`` is a lower bound)
    looked: int
    due: int


class RequeueResult(NamedTuple):
    """requeue.lua's reply, in the order of its header's "Returns", then what unclaim.lua
    gave back of the claims it names (``unclaimed``)."""

    requeued: int = 0
    #: leases that had no record (removed)
    orphans: int = 0
    #: workers whose liveness beats had lapsed
    dead_workers: int = 0
    #: leases of those workers given back
    released: int = 0
    #: tags of the workers no longer alive that hold claims (given back by unclaim.lua)
    orphan_claims: tuple[str, ...] = ()
    #: start_urls entries claimed by workers no longer alive, given back to start_urls
    unclaimed: int = 0


class Drained(NamedTuple):
    """Whether the whole crawl ran out of work, read in one transaction."""

    start_urls: int
    queued: int
    leased: int
    #: ms until the next retry or revisit is due (None: none waits)
    next_retry_ms: int | None
    #: workers holding claimed start_urls entries not stored yet (their requests are coming)
    claimants: int = 0
    #: the frontier ever held a request or a dead letter (since its last reset): the crawl
    #: has had work, and an idle worker's clock runs (DISTCRAWL_IDLE_TIMEOUT)
    worked: bool = False

    def idle(self, within_ms: int) -> bool:
        """Nothing to do now, and no retry due within ``within_ms``."""
        soon = self.next_retry_ms is not None and self.next_retry_ms <= within_ms
        return not (self.start_urls or self.claimants or self.queued or self.leased or soon)


@dataclass(frozen=True)
class CommitResult:
    enqueued: int = 0
    duplicates: int = 0
    dead: int = 0
    #: start_urls entries no longer in the worker's claim list (it was taken for dead and
    #: they went back to start_urls): not stored by this commit
    skipped: int = 0
    queue_size: int = 0
    #: new requests dropped because the queue was at DISTCRAWL_MAX_PENDING
    dropped: int = 0
    #: start_urls entries left in the worker's claim list for the same reason
    held: int = 0
    #: 1 when this commit had already run (its reply was lost): nothing was changed
    replayed: int = 0
    #: acknowledgements of requests whose lease had expired and that were still queued
    late: int = 0
    #: acknowledgements whose token no longer matched (leased again): no-ops
    stale: int = 0
    #: acknowledgements of requests with no record (already done, or lost by Redis): no-ops
    missing: int = 0
    #: new requests dropped because their slot had DISTCRAWL_MAX_PENDING_PER_SLOT queued
    slot_dropped: int = 0
    #: positions of the entries not stored (duplicates, dropped), when asked for
    not_stored: tuple[int, ...] = ()

    def __add__(self, other: CommitResult) -> CommitResult:
        """Two commits run one after the other on one queue (a batch's commits, the pieces of
        a split one): their counts summed, and ``other``'s queue size, the later reading of
        the same queue. ``not_stored`` is not combined."""
        total = CommitResult.of([a + b for a, b in zip(self.counts(), other.counts(), strict=True)])
        return dataclasses.replace(total, queue_size=other.queue_size)

    @classmethod
    def of(cls, counts: Sequence[int], not_stored: Sequence[int] = ()) -> CommitResult:
        """From the counts in the order of ``counts()`` (commit.lua's reply)."""
        return cls(*counts, not_stored=tuple(not_stored))  # type: ignore[arg-type,misc]

    def counts(self) -> tuple[int, ...]:
        return (
            self.enqueued,
            self.duplicates,
            self.dead,
            self.skipped,
            self.queue_size,
            self.dropped,
            self.held,
            self.replayed,
            self.late,
            self.stale,
            self.missing,
            self.slot_dropped,
        )


def parse_commit(res: Any) -> CommitResult:
    return CommitResult.of([int(x) for x in res[:-1]], [int(x) for x in res[-1]])


#: how lease.lua marks a leased request of a slot with a delay, and a reserve
PACED, RESERVE = 1, 2


def parse_lease(res: Any) -> LeaseResult:
    items: list[Leased] = []
    bad: list[BadLease] = []
    for i in range(8, len(res), 3):
        kind, token, raw = int(res[i]), res[i + 1], res[i + 2]
        try:
            leased = parse_entry(raw)
            items.append(leased._replace(paced=kind == PACED, token=token, reserve=kind == RESERVE))
        except QueueEntryError as exc:
            bad.append(BadLease(LeaseRef(raw_id(raw), token), raw, str(exc)))
    wait = None if int(res[3]) < 0 else int(res[3]) / 1000
    queue, delayed, released, _, now, quarantined, missing, rearmed = (int(x) for x in res[:8])
    return LeaseResult(
        items, queue, delayed, released, wait, now, quarantined, missing, rearmed, bad
    )


def parse_places(res: Any) -> Places:
    return Places(int(res[0]), int(res[1]))


def parse_sweep(res: Any) -> SweepResult:
    return SweepResult(int(res[0]), int(res[1]), bool(res[2]))


class Finished(NamedTuple):
    """finish.lua's reply when the call finished the crawl: its completion event."""

    event: str
    run: int


def parse_finish(res: Any) -> Finished | None:
    if int(res[0]) != 1:
        return None
    event = res[1].decode() if isinstance(res[1], bytes) else str(res[1])
    return Finished(event, int(res[2]))


def parse_runnable(res: Any) -> Runnable:
    return Runnable(int(res[0]), int(res[1]), int(res[2]))


def sum_runnable(parts: list[Runnable]) -> Runnable:
    return Runnable(*(sum(values) for values in zip(*parts, strict=True)))


def parse_requeue(res: Any) -> RequeueResult:
    requeued, orphans, dead, released = (int(x) for x in res[:4])
    lapsed = tuple(worker_tags(res[4])) if len(res) > 4 else ()
    return RequeueResult(requeued, orphans, dead, released, lapsed)


def first_int(res: Any) -> int:
    return int(res[0])


def is_not_none(reply: Any) -> bool:
    return reply is not None


def throttle_state(raw: bytes | None) -> tuple[int | None, float]:
    """(adaptive concurrency cap or None, throttled share) from a ``throttle_state`` value
    (``<cap>:<share>:<hold>``, see commit.lua)."""
    try:
        cap, share, _ = (raw or b"0:0:0").split(b":")
        return (int(float(cap)) if float(cap) >= 1 else None), float(share)
    except ValueError:
        return None, 0.0
