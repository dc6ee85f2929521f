"""What goes in the scheduler's next batch.

Each pump turn (pump.py) asks here for the work due now and what may ride with it, read from
the scheduler's buffers and timers; nothing here touches Redis or the engine, so the rules for
what a batch holds, and when an idle worker may block the Redis thread waiting for work, are
in one place and can change without touching how batches run.
"""

from __future__ import annotations

from distcrawl.engine._batch_types import Batch, Commit
from distcrawl.engine.idle import IDLE_REAP_INTERVAL
from distcrawl.engine.state import SchedulerState
from distcrawl.model.queue_entry import LeaseRef


class BatchBuilding(SchedulerState):
    """The part of ``Scheduler`` that decides a batch's contents (see the module docstring)."""

    def _build_batch(self, now: float) -> Batch:
        """The work due now, and what may ride with it: the reclaim of expired leases, other
        components' commands, a liveness beat. Those run in a batch of their own only once
        late (the beat never: its thread does). A parked worker (idle.py) sends no poll:
        only what its riders need, and one look for dead workers' work an interval."""
        if self._parked and self._park_over(now):
            self._unpark(now)
        batch = self._build_work(now)
        work = not batch.empty()
        if self._parked:
            if now >= self._next_idle_reap:
                # one parked worker an interval looks for dead workers' work (batch.py)
                self._next_idle_reap = now + IDLE_REAP_INTERVAL
                batch.idle_reap = True
        elif self._polling.reclaim_due(now, work=work):
            batch.reclaim = True
        if self._riders.due(now, work=not batch.empty()):
            batch.riders = self._riders.take()
        if not batch.empty() and self._liveness is not None and self._liveness.due():
            batch.beat = True
        return batch

    def _park_over(self, now: float) -> bool:
        """Whether a parked worker goes back to polling: something here needs Redis (a
        request to push, a pause, a close), or the lease reply's next due time came."""
        return not self._idle() or now >= self._park_until

    def _build_work(self, now: float) -> Batch:
        batch = Batch()
        if self._leases.report_due(now, self.config.flush_interval):
            self._leases.report(batch)
        self._work(now, batch)
        if not batch.commits:
            self._commit(now, batch)  # rides with the lease, the claim or the reports
        if not batch.empty():
            # a reserve's swap, which may wait, goes with what is sent (and before the
            # acknowledgement of the request that left, which a commit may carry)
            self._leases.report(batch)
        return batch

    def _work(self, now: float, batch: Batch) -> None:
        if self._polling.renew_due(now):
            batch.renew = self._held_refs()
        if self._drain_wanted:
            batch.drain = True
            self._drain_wanted = False
        commit = self._commit(now, batch)
        if commit is not None and self._outage.writes_refused:
            # Redis takes no write (full, read-only...): what this worker would lease or
            # claim now could not be stored either; the commit alone finds when it does
            return
        if self._paused:
            if self._claims_waiting():
                # a BLMOVE may still move an entry into the claim list: ended first
                assert self._idle_waits is not None
                self._idle_waits.end_claims()
            elif self._start_pending == 0 and not self._unclaimed:
                # every start entry read is stored: what is still claimed goes back
                batch.unclaim = self._unclaimed = True
            batch.release = self._leases.release_waiting()
            return
        prefetch = self.config.prefetch
        lease = self._leases.ready <= prefetch // 2 and self._polling.lease_due(now)
        room = self._lease_room()
        if lease and room <= 0:
            if not self._held_back:
                self._inc("distcrawl/leases/held_back")
            self._held_back, lease = True, False
        else:
            self._held_back = False
        batch.release, held = self._leases.release_idle_reserves(lease)
        self._inc("distcrawl/places/reserves_returned", len(batch.release))
        if self._parked:
            return  # the blocking reads wait for work (idle.py): no poll, no claim
        if lease:
            batch.woken, self._woken = self._woken, False
            batch.want = min(room, max(0, prefetch - self._leases.waiting))
            batch.held = held
            batch.reserve = prefetch // 2
            batch.reserved = self._leases.reserved()
        if (
            self._start_pending == 0
            and self._polling.peek_due(now)
            and not self._full()
            and not self._claims_waiting()
        ):
            batch.peek = self.config.start_urls_batch

    def _commit(self, now: float, batch: Batch) -> Commit | None:
        """The commit of this batch, if one goes now: one being sent again, or entries and
        acknowledgements that ride with other work, or that may not wait for it (overdue,
        a pause or close, acknowledgements holding leases back, or discovered requests for a
        shared queue that is empty: every worker may be waiting for them). Otherwise they
        wait for the next batch, at most DISTCRAWL_FLUSH_INTERVAL: a page's commit sent
        alone is a round trip of its own."""
        outbox = self._outbox
        if outbox.commit is None and not (
            not batch.empty()
            or outbox.overdue(now)
            or self._paused
            or self._closing
            or self._held_back
            or (outbox.entries and self._remote_queue == 0)
        ):
            return None
        commit = outbox.current()
        if commit is not None:
            batch.commits = [commit]
        return commit

    def _claims_waiting(self) -> bool:
        """Whether a parked worker's BLMOVE may still move a start URL into this worker's
        claim list (idle.py): claim.lua, which hands out what the list holds, and the give
        back of the list wait until it returned, or the entry would be handed out twice."""
        return self._idle_waits is not None and self._idle_waits.claiming

    def _idle(self) -> bool:
        """Nothing here would need Redis soon: no request ready or downloading, nothing
        to store or acknowledge, no start entry being stored, not pausing or closing. Only
        then may a batch block the Redis thread in a wait for work."""
        return not (
            self._leases.busy()
            or self._outbox.pending()
            or self._start_pending
            or self._paused
            or self._closing
        )

    def _lease_room(self) -> int:
        """How many more leases this worker may take (DistcrawlConfig.max_held: prefetched
        plus CONCURRENT_REQUESTS). A request's lease is held until it is acknowledged, after
        the item pipeline stored what its page yielded; so while items wait (MongoDB away)
        the backlog fills the room and leasing stops, rather than piling up leases that
        another worker would crawl again if this one died. Acknowledgements not yet
        committed count: Redis still has them leased."""
        return self.config.max_held - self._leases.held - self._outbox.counts()[1]

    def _held_refs(self) -> list[LeaseRef]:
        """Every lease this worker holds: waiting, in progress, and done but not yet
        acknowledged (kept while a commit is being retried, so that they stay ours)."""
        return self._leases.held_refs() + self._outbox.acked_refs()

    def _full(self) -> bool:
        cap = self.config.max_pending
        return cap is not None and self._remote_queue >= cap
