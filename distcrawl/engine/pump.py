"""The scheduler's pump: one batch of Redis work at a time, on the crawler's Redis thread.

Scrapy calls the scheduler synchronously and only local buffers change then; the pump runs on
the reactor, every DISTCRAWL_FLUSH_INTERVAL and whenever something makes a batch worth sending
now (``_kick``), sends what building.py puts in a batch through the runner (batch.py) and takes
the result back in: confirmed commits forgotten, failed ones kept to send again, leased
requests handed to the buffer, claimed start URLs made entries. A batch never overlaps another.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from scrapy.utils.defer import deferred_from_coro

from distcrawl import signals as distcrawl_signals
from distcrawl.engine import _engine
from distcrawl.engine._batch_types import Batch, BatchResult, Commit
from distcrawl.engine.batch import SPLIT_AFTER
from distcrawl.engine.idle import IDLE_REAP_INTERVAL
from distcrawl.engine.state import SchedulerState
from distcrawl.model.deadrecord import dead_letter
from distcrawl.model.layout import LayoutMismatch, Rejoined
from distcrawl.model.records import Entry, EntryKind
from distcrawl.model.redact import redact_error, redacted_exc_info
from distcrawl.model.refusals import refused
from distcrawl.model.replies import CommitResult

#: the scheduler's logger: these are its messages, filtered and configured as such
logger = logging.getLogger("distcrawl.scheduler")


class Pump(SchedulerState):
    """The part of ``Scheduler`` that runs its batches (see the module docstring)."""

    def _kick(self) -> None:
        if self._kick_pending or self._closing or self._loop is None:
            return
        from twisted.internet import reactor

        self._kick_pending = True
        reactor.callLater(0, self._kicked)  # type: ignore[attr-defined,arg-type,unused-ignore]

    def _kicked(self) -> None:
        self._kick_pending = False
        self._pump()

    def _pump(self) -> None:
        if self.df is not None:
            self.df.flush_stats_if_due()
        if self._busy or self._closing:
            return
        now = time.monotonic()
        if not self._outage.due(now):
            return
        if self._runner is None:
            self._reconnect()
            return
        self._collect_finished()
        batch = self._build_batch(now)
        if batch.empty():
            return
        self._busy = True
        d = self.io.run(self._runner.run, batch)
        d.addCallback(self._apply, batch)
        d.addErrback(self._crashed, batch)

    def _apply(self, res: BatchResult, batch: Batch) -> None:
        self._busy = False
        now = time.monotonic()
        if res.rejoined is not None:
            # before what the batch leased or claimed: that is the new crawl's work
            self._rejoined(res.rejoined)
            if self._runner is None:
                return
        self._apply_commits(res, batch.commits)
        errors = [e for e in (res.commit_error, res.error) if e is not None]
        if len(errors) == 2 and errors[0] is errors[1]:
            # one lost pipeline, the commit's and the other steps' failure: counted once
            del errors[1]
        for error in errors:
            self._outage.error(error, *self._outbox.counts(), memory=res.memory)
        if res.commit_error is None and res.error is None:
            self._outage.answered()
        self._inc("distcrawl/released", res.released)
        self._inc("distcrawl/start_urls/given_back", res.unclaimed)
        self._inc("distcrawl/places/freed", res.freed)
        self._inc("distcrawl/places/taken", res.taken)
        if res.error is not None and (batch.freed or batch.taken):
            # the report is idempotent: sent again with the next batch rather than lost
            self._leases.report_again(batch)
        lease_now = bool(res.committed and res.committed.queue_size and not batch.want)
        if lease_now:
            # work just arrived (e.g. from a start URL): ask for it now, not at the next
            # idle poll
            self._polling.lease_now(now)
        if batch.renew and res.error is None and res.renewed < len(batch.renew):
            logger.debug(
                "%d of %d leases had expired or been taken over before renewal",
                len(batch.renew) - res.renewed,
                len(batch.renew),
            )
        self._report.requeue(res)
        self._report.shards(res)
        got = self._handle_leased(res)
        park: float | None = None
        if batch.want and res.lease is not None:
            if got:
                self._polling.lease_now(now)
            else:
                park = self._polling.back_off(now, res.lease, idle=self._idle())
        self._riders.deliver(batch.riders, res.riders)
        if batch.peek and res.error is None:
            self._handle_peeked(res.peeked)
            busy = bool(self._leases.ready or self._leases.active)
            self._polling.peeked(now, len(res.peeked), batch.peek, busy=busy)
            # claim.lua hands out the claim list first: nothing means it and start_urls
            # were both empty
            self._claims_empty = not res.peeked
            if len(res.peeked) >= batch.peek:
                park = None  # more start URLs wait: claimed next
        if park is not None:
            ready = self._idle() and res.error is None and self._idle_waits is not None
            if ready and self._claims_empty:
                self._park(now, park)
            else:
                # its claim list may hold entries (held back at the pending cap): the BLMOVE
                # of a park waits on start_urls only, so a claim comes first
                self._polling.peek_now(now)
                later = self._claims_waiting() or not ready
                self._polling.lease_in(
                    now, self.config.idle_poll_max if later else self.config.flush_interval
                )
        if res.drained is not None:
            self._drained = (now, res.drained)
            _engine.wake(self.crawler)  # the engine asks spider_idle again, which reads it
        low = self._leases.ready <= self.config.prefetch // 2
        # acknowledgements just stored made room for the lease they held back
        freed = self._held_back and res.commits_done > 0
        if self._outbox.due or self._leases.unreported or ((got or lease_now or freed) and low):
            # the next batch now, not one reactor turn later: a turn can be a page's parsing
            self._pump()

    # -- parked: an idle worker waits in blocking reads (idle.py) ------------------------

    def _park(self, now: float, until: float) -> None:
        """Nothing queued anywhere and nothing here: stop polling, wait in Redis for a start
        URL (BLMOVE into the claim list, unless a claim may not be made now) and for a
        wake-up token, beat rarely, until work arrives or ``until`` s pass (the next retry
        or revisit due)."""
        assert self._idle_waits is not None
        self._parked = True
        # a due time that came already: polled again at the flush pace, not in a busy loop
        self._park_until = now + max(until, self.config.flush_interval)
        self._next_idle_reap = now + IDLE_REAP_INTERVAL * (0.25 + 0.75 * random.random())
        if self._liveness is not None:
            self._liveness.idle(True)
        claims = self._start_pending == 0 and not self._full() and not self._paused
        self._idle_waits.park(claims=claims)

    def _unpark(self, now: float) -> None:
        """Back to polling: the next lease now. A BLMOVE still waiting goes on until it
        returns (``_claims_waiting``), its entry handed over as any claim."""
        self._parked = False
        if self._liveness is not None:
            self._liveness.idle(False)
        if self._idle_waits is not None:
            self._idle_waits.unpark()
        self._polling.lease_now(now)

    def _waited(self, kind: str, value: Any) -> None:
        """A parked worker's wait returned (on the reactor, from idle.py's threads): a start
        URL it moved into this worker's claim list, a wake-up token, or an error."""
        if self._closing:
            return  # a claimed entry is in the claim list: the close gives it back
        now = time.monotonic()
        if kind == "claimed":
            self._claims_empty = False
            # in the claim list already: the next claim (claim.lua) hands it out with what
            # followed it, and the generation read after it says whether the crawl it came
            # from is still the one this worker joined (layout.py)
            self._polling.peek_now(now)
        elif kind == "failed":
            # the claim list may hold an entry whose reply was lost: the next claim hands
            # it out; and an unreachable Redis is the polls' to report
            logger.debug("idle wait failed: %r", value, extra={"spider": self.spider})
        if kind != "failed":
            self._inc("distcrawl/idle/woken")
        if self._parked:
            self._unpark(now)
            self._woken = True
        else:
            self._polling.lease_now(now)
        self._kick()

    def _rejoined(self, rejoined: Rejoined) -> None:
        """The frontier this worker joined was reset, and it joined the crawl there now
        (layout.py): what it remembers of the old crawl would spoil the new one (its seen
        cache alone drops every link already pushed once), so it is forgotten."""
        assert self.keys is not None
        if rejoined.differences:
            # set up anew by a worker with other settings: working in it would corrupt it
            logger.error(
                "The frontier %r this worker joined was reset, and %s",
                self.keys.namespace,
                LayoutMismatch(self.keys.namespace, rejoined.differences),
                extra={"spider": self.spider},
            )
            self._runner = None  # nothing of this worker's goes to that crawl
            self._closing = True
            deferred_from_coro(
                self.crawler.engine.close_spider_async(reason="frontier_layout_mismatch")
            )
            return
        logger.warning(
            "The frontier %r this worker joined is gone (%s): forgetting the URLs it "
            "pushed, the robots.txt it read and its politeness state, and going on with "
            "the crawl there now",
            self.keys.namespace,
            "reset or emptied" if rejoined.gone else "set up anew by another worker",
            extra={"spider": self.spider},
        )
        self._inc("distcrawl/frontier/rejoined")
        if self.df is not None:
            self.df.forget()
        self._outbox.forget_feedback()
        self._remote_queue = 0
        self._drained = None
        self._had_work = False  # the next crawl's idle clock starts with its first work
        self._polling.resume()
        self.crawler.signals.send_catch_log(signal=distcrawl_signals.frontier_reset)

    def _apply_commits(self, res: BatchResult, commits: list[Commit]) -> None:
        """Forget the commits Redis confirmed; keep the first that failed, to send again."""
        for commit in commits[: res.commits_done]:
            self._start_pending -= commit.start_entries
        if res.commits_done < len(commits):
            failed = commits[res.commits_done]
            failed.failures += 1
            if (
                res.commit_error is not None
                and refused(res.commit_error)
                and failed.failures >= SPLIT_AFTER
                and not failed.split
            ):
                logger.error(
                    "Redis refused a commit of %d entries %d times (%s): storing them "
                    "one part at a time to find the entry it refuses",
                    len(failed.entries),
                    failed.failures,
                    redact_error(res.commit_error, self.config.redis_url),
                    extra={"spider": self.spider},
                )
                failed.split = True
            self._outbox.commit = failed
        elif commits:
            self._outbox.commit = None
        if res.committed is not None:
            self._apply_commit(res.committed, commits[0] if len(commits) == 1 else None)
        if res.split_dead:
            self._inc("distcrawl/dead/refused", res.split_dead)

    def _apply_commit(self, c: CommitResult, commit: Commit | None) -> None:
        self._remote_queue = c.queue_size
        if c.held:
            self._claims_empty = False  # start entries left in the claim list at the cap
        self._report.commit(c, commit)
        if c.dropped or c.held:
            self._polling.queue_full()

    def _handle_leased(self, res: BatchResult) -> int:
        lease = res.lease
        if lease is None:
            return 0
        got = 0
        for item in res.leased:
            if item.request is None:
                logger.error(
                    "Queue entry %s cannot be crawled: %s; dead-lettered",
                    item.ref.id,
                    item.error,
                    extra={"spider": self.spider},
                )
                record = dead_letter(item.error, raw=item.payload, source="queue")
                self._outbox.push(Entry(EntryKind.DEAD_LETTER, b"", 0, record))
                self._outbox.ack(item.ref)
                self._inc("distcrawl/quarantined")
                continue
            self._leases.add(item, lease.leased_at)
            got += 1
        self._remote_queue = lease.queue_size
        self.clock.learn(lease.leased_at)
        self._report.lease(lease)
        if got:
            self._inc("distcrawl/leased", got)
            self._last_work = time.monotonic()
            self._had_work = True
            _engine.wake(self.crawler)
        return got

    def _handle_peeked(self, raws: list[bytes]) -> None:
        """Entries claimed for this worker (Frontier.claim_start_urls): each becomes a
        request or a dead letter, whose commit takes it out of the claim list."""
        assert self._intake is not None
        for raw in raws:
            self._outbox.push(self._intake.start_entry(raw))
            self._start_pending += 1
        if raws:
            self._last_work = time.monotonic()
            self._had_work = True
            self._inc("distcrawl/start_urls/read", len(raws))
            self._kick()

    def _crashed(self, failure: Any, batch: Batch) -> None:
        """A bug, not an outage: keep the work and log it loudly."""
        self._busy = False
        self._riders.drop(batch.riders)
        logger.error(
            "distcrawl scheduler error",
            exc_info=redacted_exc_info(
                failure.value, self.config.redis_url, tb=failure.getTracebackObject()
            ),
            extra={"spider": self.spider},
        )
        self._outage.crashed()

    def _collect_finished(self) -> None:
        if not self._leases.active:
            return
        for ref in self._leases.finished(_engine.in_progress(self.crawler)):
            # everything it produced is pushed by now: acknowledged once that is stored
            self._outbox.ack(ref)
