"""A batch's per-shard plumbing: how a step sent to several shards is read back as one, and
how a worker leases across shards (``DISTCRAWL_SHARDS``; batch.py runs the batch, with one
shard or many).

Each step goes to the shards it concerns: a lease, a renewal or an acknowledgement to the
shard its request came from, a slot's report to the slot's shard, a new request to its site's
shard, claims and the idle wait to the crawl's own keys. With one shard every step has one
part, and its reply is read as it comes: nothing here costs a single-shard crawl anything.

Workers lease across shards by each shard's next-due hint: a shard that had nothing is asked
again when its earliest slot turn or retry is due, at the latest after ``RECHECK_EMPTY``, or
at once when a wake-up token or this worker's own commit says work arrived there; the shards
asked share the batch's count in turns, so none starves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from distcrawl.engine._batch_types import Batch, Commit
from distcrawl.model.frontier import Frontier
from distcrawl.model.ops import Op
from distcrawl.model.records import START_KINDS
from distcrawl.model.replies import (
    BadLease,
    CommitResult,
    LeaseResult,
    Places,
    RequeueResult,
    SweepResult,
)
from distcrawl.model.shards import Fan, Shards

#: a shard that had nothing to lease is asked again after at most this long (s)
RECHECK_EMPTY = 1.0

T = TypeVar("T")


def one_or(merge: Callable[[list[Any]], T]) -> Callable[[list[Any]], T]:
    """``merge`` for the replies of several shards; one reply is the answer as it is."""

    def merged(values: list[Any]) -> T:
        return values[0] if len(values) == 1 else merge(values)

    return merged


def _places(values: list[Places]) -> Places:
    return Places(sum(v.freed for v in values), sum(v.taken for v in values))


def _ints(values: list[Any]) -> int:
    return sum(int(v) for v in values)


def _requeues(values: list[RequeueResult]) -> RequeueResult:
    claims: list[str] = []
    for v in values:
        claims += [t for t in v.orphan_claims if t not in claims]
    return RequeueResult(
        sum(v.requeued for v in values),
        sum(v.orphans for v in values),
        max((v.dead_workers for v in values), default=0),
        sum(v.released for v in values),
        orphan_claims=tuple(claims),
    )


def _sweeps(values: list[SweepResult]) -> SweepResult:
    return SweepResult(
        sum(v.forgotten for v in values),
        sum(v.looked for v in values),
        all(v.wrapped for v in values),
    )


sum_places = one_or(_places)
sum_ints = one_or(_ints)
sum_requeue = one_or(_requeues)
sum_sweeps = one_or(_sweeps)


def _of_shard(shard: int) -> Callable[[LeaseResult], LeaseResult]:
    """Marks a shard's leased requests with the shard they must be acknowledged in."""

    def mark(lease: LeaseResult) -> LeaseResult:
        items = [item._replace(shard=shard) for item in lease.items]
        bad = [BadLease(b.ref._replace(shard=shard), b.raw, b.reason) for b in lease.bad]
        return lease._replace(items=items, bad=bad)

    return mark


def _compose(first: Callable[[Any], Any], then: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def both(reply: Any) -> Any:
        return then(first(reply))

    return both


class ShardLeases:
    """Which shards a worker's next lease asks, and how many requests each: one per worker,
    on the Redis thread. With one shard, always that shard for the whole count."""

    def __init__(self, shards: Shards, lease_ms: int, worker_timeout_ms: int) -> None:
        self.shards = shards
        self.lease_ms = lease_ms
        self.worker_timeout_ms = worker_timeout_ms
        #: monotonic time from which each shard may have something to lease
        self._due = [0.0] * shards.count
        #: monotonic time of each shard's next slot turn or retry, as its last lease said
        self._hint: list[float | None] = [None] * shards.count
        #: each shard's queue length, as its last lease or commit said
        self.queued = [0] * shards.count
        self._turn = 0

    def arrived(self, shards: Sequence[int] | None = None) -> None:
        """Work arrived in these shards (every shard: None): ask them at the next lease."""
        for shard in range(self.shards.count) if shards is None else shards:
            self._due[shard] = 0.0

    def plan(self, want: int, now: float) -> list[tuple[int, int]]:
        """(shard, count) pairs: the shards due now share ``want`` in turns; when none is
        due, the one due first is asked."""
        n = self.shards.count
        due = [i for i in range(n) if self._due[i] <= now]
        if not due:
            due = [min(range(n), key=lambda i: self._due[i])]
        self._turn = (self._turn + 1) % n
        due.sort(key=lambda i: (i - self._turn) % n)
        base, extra = divmod(want, len(due))
        plan = [(s, base + (1 if k < extra else 0)) for k, s in enumerate(due)]
        return [(s, c) for s, c in plan if c > 0]

    def _op(self, frontier: Frontier, count: int, batch: Batch) -> Op[LeaseResult]:
        return frontier.lease_op(
            count,
            self.lease_ms,
            held=batch.held,
            worker_timeout_ms=self.worker_timeout_ms,
            reserve=batch.reserve,
            reserved=batch.reserved,
        )

    def fan(self, batch: Batch) -> Fan[LeaseResult]:
        """The batch's lease: one op per shard asked, read back as one lease."""
        if not self.shards.sharded:
            return Fan([self._op(self.shards.crawl, batch.want, batch)], _first_lease)
        plan = self.plan(batch.want, time.monotonic())
        ops: list[Op[Any]] = []
        for shard, count in plan:
            op = self._op(self.shards.parts[shard], count, batch)
            ops.append(Op(op.script, op.keys, op.args, _compose(op.parse, _of_shard(shard))))

        def merge(values: list[LeaseResult]) -> LeaseResult:
            later = time.monotonic()
            for (shard, count), lease in zip(plan, values, strict=True):
                self._hint[shard] = None if lease.wait is None else later + lease.wait
                self.queued[shard] = lease.queue_size
                if len(lease.items) + len(lease.bad) < count:
                    wait = RECHECK_EMPTY if lease.wait is None else min(lease.wait, RECHECK_EMPTY)
                    self._due[shard] = later + wait
                else:
                    self._due[shard] = later
            # when some shard's slot turn or retry comes: only the shards' own hints, so that
            # a crawl with nothing queued anywhere waits for a wake-up token (batch.py)
            hints = [h - later for h in self._hint if h is not None]
            for lease in values:
                for item in lease.items:
                    self.shards.learn(item.slot, item.shard)
            first = values[0]
            return LeaseResult(
                [item for lease in values for item in lease.items],
                sum(self.queued),
                sum(lease.delayed for lease in values),
                sum(lease.released for lease in values),
                max(0.0, min(hints)) if hints else None,
                first.leased_at,
                sum(lease.quarantined for lease in values),
                sum(lease.missing_retries for lease in values),
                sum(lease.rearmed for lease in values),
                [bad for lease in values for bad in lease.bad],
            )

        return Fan(ops, merge)


def _first_lease(values: list[LeaseResult]) -> LeaseResult:
    return values[0]


def stored_start_entries(commit: Commit, result: CommitResult) -> list[bytes]:
    """The raw start_urls entries of ``commit`` that are stored (or dead-lettered, or found
    duplicates): all but those held back at the pending cap, which stay claimed."""
    held = {-p - 1 for p in result.not_stored if p < 0}
    return [
        e.raw
        for at, e in enumerate(commit.entries)
        if e.kind in START_KINDS and e.raw and at not in held
    ]
