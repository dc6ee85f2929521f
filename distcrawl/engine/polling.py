"""When the pump's periodic Redis steps are next due: lease polls, start-URL claims,
lease renewals and the reclaim of expired leases.

An idle worker must cost Redis little and a busy one must never wait for work it could
have: a lease poll that finds nothing backs off (doubling from 50 ms up to CONTENDED_POLL_MAX,
or DISTCRAWL_IDLE_POLL_MAX if lower), and anything that
means work is there (a request left the downloader while requests are queued, a commit
queued requests, start URLs were claimed) brings the next poll forward to now. A poll that
brought fewer requests than asked is not repeated at once: the slots gave all they had room
for, and a poll before one of those events finds nothing (half the lease calls of two
workers at 100 ms a page did, each a Redis script call). A poll that finds nothing queued anywhere,
by a worker that holds nothing, polls no more: the worker parks (idle.py) until a blocking
read brings work or the lease reply's next due time (a retry, a revisit) comes. Kept apart
from what goes in a batch, so the timing can change without touching the batch's contents.
Nothing here touches Redis.
"""

from __future__ import annotations

import math
import time

from distcrawl.config import DistcrawlConfig
from distcrawl.model.replies import LeaseResult

#: seconds between two claims of start URLs while this worker has requests in hand
BUSY_PEEK_INTERVAL = 1.0
#: longest lease back-off of a worker that is not parked: requests wait in slots other
#: workers fill, or its own pages (and others') may queue some; an idle worker with nothing
#: queued anywhere parks instead (idle.py)
CONTENDED_POLL_MAX = 0.25
#: longest wait after a lease that brought fewer requests than asked (see Polling.leased)
SHORT_LEASE_WAIT = 0.05
#: a lease poll for a slot's next turn (its delay) comes no sooner than this, or than
#: DISTCRAWL_FLUSH_INTERVAL if shorter: the interval's 0.2 s would leave a slot's turn up to
#: 0.2 s late and give it to whichever worker's periodic turn comes first after it
TURN_FLOOR = 0.1


class Polling:
    """The monotonic times at which each periodic step is next due."""

    def __init__(self, config: DistcrawlConfig) -> None:
        self.config = config
        now = time.monotonic()
        self._next_lease = self._next_peek = self._next_reclaim = now
        self._next_renew = now + config.lease.timeout / 3
        self._idle_delay = 0.0
        #: the last lease reply found nothing queued anywhere: a place freed here is no
        #: work, only a commit (this worker's, or another's found by the next poll) is
        self._nothing_queued = False
        #: when the next lease poll waits for the reply's next turn of a slot (or retry, or
        #: revisit) more than TURN_FLOOR away: that time (monotonic), for the pump to ask
        #: then rather than at its first periodic turn after it (Pump); None otherwise
        self.turn_at: float | None = None

    # -- what is due -------------------------------------------------------------------

    def lease_due(self, now: float) -> bool:
        return now >= self._next_lease

    def peek_due(self, now: float) -> bool:
        return now >= self._next_peek

    def renew_due(self, now: float) -> bool:
        """Whether the held leases are renewed in this batch (then due again in a third
        of the lease timeout)."""
        if now >= self._next_renew:
            self._next_renew = now + self.config.lease.timeout / 3
            return True
        return False

    def reclaim_due(self, now: float, *, work: bool) -> bool:
        """Whether expired leases are reclaimed in this batch: when due and the batch
        has work to ride with, or alone once a whole interval late."""
        if now >= self._next_reclaim and (
            work or now >= self._next_reclaim + self.config.lease.reclaim_interval
        ):
            self._next_reclaim = now + self.config.lease.reclaim_interval
            return True
        return False

    # -- what changes it ---------------------------------------------------------------

    def lease_now(self, now: float) -> None:
        """Work is there: the next lease poll is due now, without back-off."""
        self._idle_delay = 0.0
        self._nothing_queued = False
        self._next_lease = now
        self.turn_at = None

    def leased(self, now: float, lease: LeaseResult, *, got: int, asked: int) -> None:
        """A lease poll brought ``got`` of the ``asked`` requests. All of them: the next
        poll may bring more at once. Fewer: the slots gave all they had room for (full,
        a delay's one request a turn, or the queue ran out), and a poll before a place
        frees here (place_freed), a commit queues requests or the reply's next turn comes
        would find nothing: it waits for the first of those, at most SHORT_LEASE_WAIT (the
        reserves a worker uses up meanwhile are refilled by then)."""
        if got >= asked:
            self.lease_now(now)
            return
        self._idle_delay = 0.0
        self._nothing_queued = not lease.queue_size
        self._wait(now, SHORT_LEASE_WAIT, lease)

    def back_off(self, now: float, lease: LeaseResult, *, idle: bool) -> float | None:
        """A lease poll found nothing this worker could take. Returns, when the worker
        may park instead of polling (nothing queued anywhere, ``idle``: nothing here would
        need Redis), the seconds until the reply's next retry or revisit is due (``inf``:
        none waits); None otherwise."""
        if not lease.queue_size and idle:
            # nothing queued anywhere and nothing here: parked, woken by a blocking read
            # as soon as work arrives, or at the next due time
            self._idle_delay = 0.0
            self._next_lease = math.inf
            self.turn_at = None  # parked: the wait ends at the due time instead
            return math.inf if lease.wait is None else lease.wait
        self._nothing_queued = not lease.queue_size
        cap = self.config.idle_poll_max
        if lease.queue_size or not idle:
            # requests wait in slots other workers fill: a place may free any moment; or
            # this worker's own pages may queue requests, and other workers' likewise
            cap = min(cap, CONTENDED_POLL_MAX)
        self._idle_delay = min(max(self._idle_delay * 2, 0.05), cap)
        self._wait(now, self._idle_delay, lease)
        return None

    def _wait(self, now: float, longest: float, lease: LeaseResult) -> None:
        """The next lease poll in ``longest`` seconds, or at the reply's next turn if that
        comes sooner (never within TURN_FLOOR: the periodic turn is about as soon)."""
        wait, self.turn_at = longest, None
        floor = min(self.config.flush_interval, TURN_FLOOR)
        if lease.wait is not None:
            turn = max(lease.wait, floor)
            if turn < longest:
                wait = turn
                if lease.wait > floor:
                    self.turn_at = now + lease.wait
        self._next_lease = now + wait

    def peeked(self, now: float, got: int, asked: int, *, busy: bool) -> None:
        """A claim of start URLs brought ``got`` of the ``asked``; ``busy``: this worker
        has requests in hand."""
        if got:
            # the commit that stores them goes at once: the lease rides with it
            self.lease_now(now)
        if got >= asked:
            self._next_peek = now
        elif not busy:
            self._next_peek = self._next_lease
        else:
            self._next_peek = now + BUSY_PEEK_INTERVAL

    def lease_in(self, now: float, delay: float) -> None:
        """The next lease poll in ``delay`` seconds, without back-off."""
        self._next_lease = now + delay
        self.turn_at = None

    def peek_now(self, now: float) -> None:
        """Start URLs are there (a parked worker's wait took one): claim the rest as soon
        as what was taken is stored."""
        self._next_peek = now

    def queue_full(self) -> None:
        """The shared queue is at DISTCRAWL_MAX_PENDING: claim no start URLs for a while."""
        self._next_peek = time.monotonic() + BUSY_PEEK_INTERVAL

    def place_freed(self) -> None:
        """A request left the downloader: its place in the slot is free for the next
        request now, and this worker may take it in the next batch, not after the back-off
        of a lease that found the slot full. Not while the last reply found nothing
        queued: a free place is no request (the poll's back-off, or a commit, finds them)."""
        if self._nothing_queued:
            return
        self._idle_delay = 0.0
        self._next_lease = min(self._next_lease, time.monotonic())

    def resume(self) -> None:
        self._next_lease = self._next_peek = time.monotonic()
        self.turn_at = None
