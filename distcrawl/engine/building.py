"""What goes in the scheduler's next batch.

Each pump turn (pump.py) asks here for the work due now and what may ride with it, read from
the parts that hold the buffers and timers (leases, outbox, polling, riders, parking); nothing
here touches Redis or the engine, so the rules for what a batch holds, and when an idle worker
may block the Redis thread waiting for work, are in one place and can change without touching
how batches run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distcrawl.engine._batch_types import Batch, Commit

if TYPE_CHECKING:
    from distcrawl.engine.parts import Parts
    from distcrawl.model.queue_entry import LeaseRef


def reserves_per_slot(prefetch: int) -> int:
    """How many reserves a worker may hold of one slot (lease.lua): a whole prefetch, so
    that a worker whose slot is full at the site (a latency of 100 ms: its places are all
    downloading) still has a request to send for each answer until its next batch, which
    then goes once an interval rather than on every answer; none with DISTCRAWL_PREFETCH = 1."""
    return prefetch if prefetch > 1 else 0


class BatchBuilder:
    """Decides a batch's contents (see the module docstring)."""

    def __init__(
        self,
        parts: Parts,
    ) -> None:
        self.config = parts.config
        self._p = parts
        #: the last batch built took no lease: the leases held filled DistcrawlConfig.max_held
        self.held_back = False

    def build(self, now: float) -> Batch:
        """The work due now, and what may ride with it: the reclaim of expired leases, other
        components' commands, a liveness beat. Those run in a batch of their own only once
        late (the beat never: its thread does). A parked worker (idle.py) sends no poll:
        only what its riders need, and one look for dead workers' work an interval."""
        parking = self._p.parking
        if parking.parked and parking.over(now, idle=self.idle()):
            parking.unpark(now)
        batch = self._build_work(now)
        work = not batch.empty()
        if parking.parked:
            if parking.reap_due(now):
                # one parked worker an interval looks for dead workers' work (batch.py)
                batch.idle_reap = True
        elif self._p.polling.reclaim_due(now, work=work):
            batch.reclaim = True
        if self._p.riders.due(now, work=not batch.empty()):
            batch.riders = self._p.riders.take()
        liveness = self._p.link.liveness
        if not batch.empty() and liveness is not None and liveness.due():
            batch.beat = True
        return batch

    def _build_work(self, now: float) -> Batch:
        batch = Batch()
        if self._p.leases.report_due(now, self.config.flush_interval):
            self._p.leases.report(batch)
        self._work(now, batch)
        if not batch.commits:
            self._commit(now, batch)  # rides with the lease, the claim or the reports
        if not batch.empty():
            # a reserve's swap, which may wait, goes with what is sent (and before the
            # acknowledgement of the request that left, which a commit may carry)
            self._p.leases.report(batch)
        if batch.commits and (batch.freed or batch.taken):
            self._fold_into_acks(batch)
        return batch

    def _fold_into_acks(self, batch: Batch) -> None:
        """Drop the place reports of requests this batch acknowledges: the acknowledgement
        gives the place back (a request that holds one) or takes it out of 'placeless' (one
        that holds none), which leaves Redis as the report and then the acknowledgement
        would (commit.lua, places.lua). On most answers the page's acknowledgement goes in
        the batch that reports its place, so a place report then costs Redis no script
        call. Should the commit fail, it is sent again with its acknowledgements; the
        places go back with them, before any later lease."""
        acked = {ref for commit in batch.commits for ref in commit.acks}
        if not acked:
            return
        freed = [ref for ref in batch.freed if ref not in acked]
        taken = [ref for ref in batch.taken if ref not in acked]
        folded = len(batch.freed) - len(freed) + len(batch.taken) - len(taken)
        if folded:
            self._p.report.inc("distcrawl/places/with_acks", folded)
            batch.freed, batch.taken = freed, taken

    def _work(self, now: float, batch: Batch) -> None:
        status = self._p.status
        if self._p.polling.renew_due(now):
            batch.renew = self._held_refs()
        if self._p.idle_clock.drain_wanted:
            batch.drain = True
            self._p.idle_clock.drain_wanted = False
        commit = self._commit(now, batch)
        if commit is not None and self._p.outage.writes_refused:
            # Redis takes no write (full, read-only...): what this worker would lease or
            # claim now could not be stored either; the commit alone finds when it does
            return
        if status.paused:
            if self._p.parking.claims_waiting():
                # a BLMOVE may still move an entry into the claim list: ended first
                self._p.parking.end_claims()
            elif status.start_pending == 0 and not status.unclaimed:
                # every start entry read is stored: what is still claimed goes back
                batch.unclaim = status.unclaimed = True
            batch.release = self._p.leases.release_waiting()
            batch.hand_over = True
            return
        prefetch = self.config.prefetch
        lease = self._p.leases.ready <= prefetch // 2 and self._p.polling.lease_due(now)
        room = self._lease_room()
        if lease and room <= 0:
            if not self.held_back:
                self._p.report.inc("distcrawl/leases/held_back")
            self.held_back, lease = True, False
        else:
            self.held_back = False
        batch.release, held = self._p.leases.release_idle_reserves(lease)
        self._p.report.inc("distcrawl/places/reserves_returned", len(batch.release))
        # requests of a slot a site asked to wait for (Leases.hold): they wait in Redis
        batch.release += self._p.leases.take_given_back()
        if self._p.parking.parked:
            return  # the blocking reads wait for work (idle.py): no poll, no claim
        if lease:
            batch.woken = self._p.parking.take_woken()
            batch.want = min(room, max(0, prefetch - self._p.leases.waiting))
            batch.held = held
            batch.reserve = reserves_per_slot(prefetch)
            batch.reserved = self._p.leases.reserved()
        if (
            status.start_pending == 0
            and self._p.polling.peek_due(now)
            and not status.full()
            and not self._p.parking.claims_waiting()
        ):
            batch.peek = self.config.start_urls_batch

    def _commit(self, now: float, batch: Batch) -> Commit | None:
        """The commit of this batch, if one goes now: one being sent again, or entries and
        acknowledgements that ride with other work, or that may not wait for it (overdue,
        a pause or close, acknowledgements holding leases back, or discovered requests for a
        shared queue that is empty: every worker may be waiting for them). Otherwise they
        wait for the next batch, at most DISTCRAWL_FLUSH_INTERVAL: a page's commit sent
        alone is a round trip of its own."""
        outbox = self._p.outbox
        if outbox.commit is None and not (
            not batch.empty()
            or outbox.overdue(now)
            or self._p.status.paused
            or self._p.status.closing
            or self.held_back
            or (outbox.entries and self._p.status.remote_queue == 0)
        ):
            return None
        commit = outbox.current()
        if commit is not None:
            batch.commits = [commit]
            if self._ran_dry(commit):
                # the last of this worker's work: after its commit, a look at the whole
                # crawl, which finishes it if nothing waits anywhere (finish.lua). Whether
                # the commit goes at once or rides with a lease poll: a last page without
                # links waits for the next batch, and that one must look too
                batch.drain = True
        return commit

    def _ran_dry(self, commit: Commit) -> bool:
        """This commit acknowledges the last requests this worker holds (what it queues may
        all be duplicates: Redis decides) and no start URL is on its way: a look at the whole
        crawl follows it, which finds whether another worker still has work."""
        status = self._p.status
        return bool(
            commit.acks
            and self._p.leases.held == 0
            and status.start_pending == 0
            and not status.paused
        )

    def idle(self) -> bool:
        """Nothing here would need Redis soon: no request ready or downloading, nothing
        to store or acknowledge, no start entry being stored, not pausing or closing. Only
        then may a batch block the Redis thread in a wait for work."""
        status = self._p.status
        return not (
            self._p.leases.busy()
            or self._p.outbox.pending()
            or status.start_pending
            or status.paused
            or status.closing
        )

    def _lease_room(self) -> int:
        """How many more leases this worker may take (DistcrawlConfig.max_held: prefetched
        plus CONCURRENT_REQUESTS). A request's lease is held until it is acknowledged, after
        the item pipeline stored what its page yielded; so while items wait (MongoDB away)
        the backlog fills the room and leasing stops, rather than piling up leases that
        another worker would crawl again if this one died. Acknowledgements not yet
        committed count: Redis still has them leased."""
        return self.config.max_held - self._p.leases.held - self._p.outbox.counts()[1]

    def _held_refs(self) -> list[LeaseRef]:
        """Every lease this worker holds: waiting, in progress, and done but not yet
        acknowledged (kept while a commit is being retried, so that they stay ours)."""
        return self._p.leases.held_refs() + self._p.outbox.acked_refs()
