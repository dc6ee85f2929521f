"""The scheduler's pump: one batch of Redis work at a time, on the crawler's Redis thread.

Scrapy calls the scheduler synchronously and only local buffers change then; the pump runs on
the reactor, every DISTCRAWL_FLUSH_INTERVAL and whenever something makes a batch worth sending
now (``kick``), sends what the batch builder (building.py) puts in a batch through the runner
(batch.py) and takes the result back in: confirmed commits forgotten, failed ones kept to send
again, leased requests handed to the buffer, claimed start URLs made entries, an idle worker
parked (parking.py). A batch never overlaps another.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis
from scrapy.utils.defer import deferred_from_coro
from twisted.internet import task, threads
from twisted.python.failure import Failure

from distcrawl import signals as distcrawl_signals
from distcrawl.engine import _engine
from distcrawl.engine._batch_types import Batch, BatchResult, Commit
from distcrawl.engine.batch import SPLIT_AFTER
from distcrawl.engine.webhook import FinishWebhook
from distcrawl.model.deadrecord import dead_letter
from distcrawl.model.layout import LayoutMismatch, Rejoined
from distcrawl.model.records import Entry, EntryKind
from distcrawl.model.redact import redact_error, redacted_exc_info
from distcrawl.model.refusals import refused
from distcrawl.model.replies import CommitResult, Finished

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

    from distcrawl.codec.politeness import Hold, ServerClock
    from distcrawl.dupefilter import RedisDupeFilter
    from distcrawl.engine.building import BatchBuilder
    from distcrawl.engine.intake import Intake
    from distcrawl.engine.parts import Parts
    from distcrawl.model.connection import RedisIO

#: the scheduler's logger: these are its messages, filtered and configured as such
logger = logging.getLogger("distcrawl.scheduler")


class Pump:
    """Runs the scheduler's batches (see the module docstring)."""

    def __init__(
        self,
        crawler: Crawler,
        df: RedisDupeFilter | None,
        io: RedisIO,
        parts: Parts,
        *,
        builder: BatchBuilder,
        clock: ServerClock,
        reconnect: Callable[[], None],
    ) -> None:
        self.crawler = crawler
        self.config = parts.config
        self.df = df
        self.io = io
        self._p = parts
        self._builder = builder
        self._clock = clock
        #: the scheduler's retry of its open, while Redis could not be reached at open
        self._reconnect = reconnect
        #: set when the scheduler opens
        self.spider: Spider | None = None
        self._intake: Intake | None = None
        #: a batch (or the retry of the open) is running: the next waits for it
        self.busy = False
        self._kick_pending = False
        #: the Redis user may not publish holds (holds.py): not tried again
        self._publish_refused = False
        self._loop: task.LoopingCall | None = None
        #: the turn that asks for a lease at a slot's next turn (Polling.turn_at)
        self._turn_call: Any = None
        #: made at the first completion event to deliver (DISTCRAWL_FINISH_WEBHOOK)
        self._webhook: FinishWebhook | None = None

    def open(self, spider: Spider, intake: Intake) -> None:
        """The spider its log records name, and the intake that makes entries of the start
        URLs it claims: both made when the scheduler opens."""
        self.spider = spider
        self._intake = intake

    @property
    def started(self) -> bool:
        """Whether the periodic turn was started (it stops at the close, and stays
        started)."""
        return self._loop is not None

    def start(self) -> None:
        """Run a turn now, then every DISTCRAWL_FLUSH_INTERVAL."""
        if self._loop is None:
            self._loop = task.LoopingCall(self.turn)
            self._loop.start(self.config.flush_interval, now=True)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._turn_call is not None and self._turn_call.active():
            self._turn_call.cancel()

    def _ask_at_turn(self) -> None:
        """A lease poll waiting for a slot's next turn (its delay) goes at that turn, not at
        the first periodic turn after it: up to DISTCRAWL_FLUSH_INTERVAL later, the slot's
        gaps would stretch by as much, and whichever worker's periodic turn came first after
        the slot's would take its every turn."""
        at = self._p.polling.turn_at
        if at is None or self._p.status.closing:
            return
        from twisted.internet import reactor

        if self._turn_call is not None and self._turn_call.active():
            self._turn_call.cancel()
        # a millisecond late rather than early: the lease is due from ``at`` on
        delay = max(0.0, at - time.monotonic()) + 0.001
        self._turn_call = reactor.callLater(delay, self.kick)  # type: ignore[attr-defined,arg-type,unused-ignore]

    def kick(self) -> None:
        if self._kick_pending or self._p.status.closing or self._loop is None:
            return
        from twisted.internet import reactor

        self._kick_pending = True
        reactor.callLater(0, self._kicked)  # type: ignore[attr-defined,arg-type,unused-ignore]

    def _kicked(self) -> None:
        self._kick_pending = False
        self.turn()
        if self.busy and self._loop is not None and self._loop.running:
            # a batch went: the periodic turn comes an interval after it, not a moment after
            self._loop.reset()

    def turn(self) -> None:
        if self.df is not None:
            self.df.flush_stats_if_due()
        if self.busy or self._p.status.closing:
            return
        now = time.monotonic()
        if not self._p.outage.due(now):
            return
        runner = self._p.link.runner
        if runner is None:
            self._reconnect()
            return
        self.collect_finished()
        batch = self._builder.build(now)
        if batch.empty():
            return
        self.busy = True
        d = self.io.run(runner.run, batch)
        d.addCallback(self._apply, batch)
        d.addErrback(self._crashed, batch)

    def _apply(self, res: BatchResult, batch: Batch) -> None:
        self.busy = False
        now = time.monotonic()
        if res.rejoined is not None:
            # before what the batch leased or claimed: that is the new crawl's work
            self._rejoined(res.rejoined)
            if self._p.link.runner is None:
                return
        self.apply_commits(res, batch.commits)
        errors = [e for e in (res.commit_error, res.error) if e is not None]
        if len(errors) == 2 and errors[0] is errors[1]:
            # one lost pipeline, the commit's and the other steps' failure: counted once
            del errors[1]
        for error in errors:
            self._p.outage.error(error, *self._p.outbox.counts(), memory=res.memory)
        if res.commit_error is None and res.error is None:
            self._p.outage.answered()
        if res.finished is not None:
            self._finished(res.finished)
        if res.webhook_pending is not None and self.config.finish_webhook is not None:
            self._deliver(res.webhook_pending)
        self._p.report.inc("distcrawl/released", res.released)
        self._p.report.inc("distcrawl/start_urls/given_back", res.unclaimed)
        self._p.report.inc("distcrawl/places/freed", res.freed)
        self._p.report.inc("distcrawl/places/taken", res.taken)
        if res.error is not None and (batch.freed or batch.taken):
            # the report is idempotent: sent again with the next batch rather than lost
            self._p.leases.report_again(batch)
        lease_now = bool(res.committed and res.committed.queue_size and not batch.want)
        if lease_now:
            # work just arrived (e.g. from a start URL): ask for it now, not at the next
            # idle poll
            self._p.polling.lease_now(now)
        if batch.renew and res.error is None and res.renewed < len(batch.renew):
            logger.debug(
                "%d of %d leases had expired or been taken over before renewal",
                len(batch.renew) - res.renewed,
                len(batch.renew),
            )
        self._p.report.requeue(res)
        self._p.report.shards(res)
        got = self._handle_leased(res)
        park: float | None = None
        if batch.want and res.lease is not None:
            if got:
                self._p.polling.leased(now, res.lease, got=len(res.leased), asked=batch.want)
            else:
                park = self._p.polling.back_off(now, res.lease, idle=self._builder.idle())
        self._p.riders.deliver(batch.riders, res.riders)
        parking = self._p.parking
        if batch.peek and res.error is None:
            self._handle_peeked(res.peeked)
            busy = bool(self._p.leases.ready or self._p.leases.active)
            self._p.polling.peeked(now, len(res.peeked), batch.peek, busy=busy)
            # claim.lua hands out the claim list first: nothing means it and start_urls
            # were both empty
            parking.claims_empty = not res.peeked
            if len(res.peeked) >= batch.peek:
                park = None  # more start URLs wait: claimed next
        if park is not None:
            ready = (
                self._builder.idle() and res.error is None and self._p.link.idle_waits is not None
            )
            if ready and parking.claims_empty:
                parking.park(now, park)
            else:
                # its claim list may hold entries (held back at the pending cap): the BLMOVE
                # of a park waits on start_urls only, so a claim comes first
                self._p.polling.peek_now(now)
                later = parking.claims_waiting() or not ready
                self._p.polling.lease_in(
                    now, self.config.idle_poll_max if later else self.config.flush_interval
                )
        if res.drained is not None:
            self._p.idle_clock.drained = (now, res.drained)
            _engine.wake(self.crawler)  # the engine asks spider_idle again, which reads it
        if batch.want:
            self._ask_at_turn()
        # acknowledgements just stored made room for the lease they held back
        freed = self._builder.held_back and res.commits_done > 0
        leases = self._p.leases
        if (
            self._p.outbox.overdue(now)
            or leases.report_due(now, self.config.flush_interval)
            or ((got or lease_now or freed) and leases.starving())
        ):
            # the next batch now, not one reactor turn later (a turn can be a page's
            # parsing): what may not wait, or a lease for a worker short of work.
            # What may wait (a commit, a reserve's swap, a refill of the prefetch) goes with
            # the next turn, at most DISTCRAWL_FLUSH_INTERVAL later: a batch on every answer
            # costs Redis a script call or three a page
            self.turn()

    def waited(self, kind: str, value: Any) -> None:
        """A parked worker's wait returned (on the reactor, from idle.py's threads): a start
        URL it moved into this worker's claim list, a wake-up token, or an error
        (``Parking.woke``); a batch goes at once."""
        if self._p.status.closing:
            return  # a claimed entry is in the claim list: the close gives it back
        self._p.parking.woke(kind, value, time.monotonic())
        self.kick()

    def hold(self, hold: Hold, *, publish: bool) -> None:
        """A site asked to wait (a 429/503 with Retry-After): this worker gives back the
        requests of that slot it has not sent (Leases.hold), and, when it read the answer
        itself (``publish``), tells every other worker at once (holds.py), not with their
        next leases: once per hold that goes beyond the one this worker knew (a burst of
        429s from the requests in flight is one message or a few)."""
        back = self._p.leases.hold(hold.slot, hold.ms / 1000)
        if back is None:
            return  # held that long already: heard from another worker, or its own echo
        if back:
            logger.debug(
                "Slot %s asked to wait %d ms: giving back the %d requests of it waiting here",
                hold.slot,
                hold.ms,
                back,
                extra={"spider": self.spider},
            )
            self._p.report.inc("distcrawl/politeness/given_back", back)
            self.kick()
        listener = self._p.link.holds
        if not publish or listener is None or self._publish_refused:
            return
        self._p.report.inc("distcrawl/politeness/holds_published")
        d = self.io.run(self._publish, listener.channel, hold.message())
        d.addErrback(self._not_published, hold)

    def _publish(self, channel: str, message: str) -> None:
        client = self.io.client
        client.publish(channel, message)

    def _not_published(self, failure: Failure, hold: Hold) -> None:
        error = failure.value
        if isinstance(error, redis.exceptions.NoPermissionError):
            # a worker ACL user made before the channel was granted: said once, not retried
            self._publish_refused = True
        logger.warning(
            "Could not tell the other workers that slot %s asks to wait %d ms (%s): Redis "
            "holds it back for their next leases",
            hold.slot,
            hold.ms,
            redact_error(error, self.config.redis_url) if error is not None else "no reply",
            extra={"spider": self.spider},
        )

    def _rejoined(self, rejoined: Rejoined) -> None:
        """The frontier this worker joined was reset, and it joined the crawl there now
        (layout.py): what it remembers of the old crawl would spoil the new one (its seen
        cache alone drops every link already pushed once), so it is forgotten."""
        runner = self._p.link.runner
        assert runner is not None
        namespace = runner.frontier.keys.namespace
        if rejoined.differences:
            # set up anew by a worker with other settings: working in it would corrupt it
            logger.error(
                "The frontier %r this worker joined was reset, and %s",
                namespace,
                LayoutMismatch(namespace, rejoined.differences),
                extra={"spider": self.spider},
            )
            self._p.link.runner = None  # nothing of this worker's goes to that crawl
            self._p.status.closing = True
            deferred_from_coro(
                self.crawler.engine.close_spider_async(reason="frontier_layout_mismatch")
            )
            return
        logger.warning(
            "The frontier %r this worker joined is gone (%s): forgetting the URLs it "
            "pushed, the robots.txt it read and its politeness state, and going on with "
            "the crawl there now",
            namespace,
            "reset or emptied" if rejoined.gone else "set up anew by another worker",
            extra={"spider": self.spider},
        )
        self._p.report.inc("distcrawl/frontier/rejoined")
        if self.df is not None:
            self.df.forget()
        self._p.outbox.forget_feedback()
        self._p.status.remote_queue = 0
        self._p.idle_clock.drained = None
        self._p.idle_clock.had_work = (
            False  # the next crawl's idle clock starts with its first work
        )
        self._p.polling.resume()
        self.crawler.signals.send_catch_log(signal=distcrawl_signals.frontier_reset)

    def _finished(self, finished: Finished) -> None:
        """This worker's look found the whole crawl out of work, and finish.lua recorded
        the run's one completion event."""
        runner = self._p.link.runner
        where = runner.frontier.keys.events if runner is not None else "events"
        logger.info(
            "Crawl finished: nothing queued, leased or waiting in the whole crawl (run %d, "
            "event %s in %s)",
            finished.run,
            finished.event,
            where,
            extra={"spider": self.spider},
        )
        self._p.report.inc("distcrawl/finished")
        if self.config.finish_webhook is not None:
            self._deliver(finished.event)

    def _deliver(self, event_id: str) -> None:
        """POST the completion event (DISTCRAWL_FINISH_WEBHOOK) in a thread of the
        reactor's pool: at most one delivery at a time in this worker."""
        runner = self._p.link.runner
        url = self.config.finish_webhook
        if runner is None or url is None:
            return
        if self._webhook is None:
            frontier = runner.frontier
            self._webhook = FinishWebhook(url, self.io.client, frontier.keys, frontier.tag)
        hook = self._webhook
        if hook.busy:
            return
        hook.busy = True

        def done(result: Any) -> None:
            hook.busy = False
            if isinstance(result, Failure) and result.value is not None:
                logger.error(
                    "Completion webhook failed: %s",
                    redact_error(result.value, self.io.url),
                    extra={"spider": self.spider},
                )

        threads.deferToThread(hook.deliver, event_id).addBoth(done)

    def apply_commits(self, res: BatchResult, commits: list[Commit]) -> None:
        """Forget the commits Redis confirmed; keep the first that failed, to send again."""
        for commit in commits[: res.commits_done]:
            self._p.status.start_pending -= commit.start_entries
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
            self._p.outbox.commit = failed
        elif commits:
            self._p.outbox.commit = None
        if res.committed is not None:
            self._apply_commit(res.committed, commits[0] if len(commits) == 1 else None)
        if res.split_dead:
            self._p.report.inc("distcrawl/dead/refused", res.split_dead)

    def _apply_commit(self, c: CommitResult, commit: Commit | None) -> None:
        self._p.status.remote_queue = c.queue_size
        if c.held:
            self._p.parking.claims_empty = False  # start entries left in the claim list at the cap
        self._p.report.commit(c, commit)
        if c.dropped or c.held:
            self._p.polling.queue_full()

    def _handle_leased(self, res: BatchResult) -> int:
        lease = res.lease
        if lease is None:
            return 0
        got = reserves = 0
        for item in res.leased:
            if item.request is None:
                logger.error(
                    "Queue entry %s cannot be crawled: %s; dead-lettered",
                    item.ref.id,
                    item.error,
                    extra={"spider": self.spider},
                )
                record = dead_letter(item.error, raw=item.payload, source="queue")
                self._p.outbox.push(Entry(EntryKind.DEAD_LETTER, b"", 0, record))
                self._p.outbox.ack(item.ref)
                self._p.report.inc("distcrawl/quarantined")
                continue
            self._p.leases.add(item, lease.leased_at)
            got += 1
            reserves += item.reserve
        self._p.status.remote_queue = lease.queue_size
        self._clock.learn(lease.leased_at)
        self._p.report.lease(lease)
        if got:
            self._p.report.inc("distcrawl/leased", got)
            self._p.report.inc("distcrawl/places/reserves_leased", reserves)
            self._p.idle_clock.worked()
            _engine.wake(self.crawler)
        return got

    def _handle_peeked(self, raws: list[bytes]) -> None:
        """Entries claimed for this worker (Frontier.claim_start_urls): each becomes a
        request or a dead letter, whose commit takes it out of the claim list."""
        assert self._intake is not None
        for raw in raws:
            self._p.outbox.push(self._intake.start_entry(raw))
            self._p.status.start_pending += 1
        if raws:
            self._p.idle_clock.worked()
            self._p.report.inc("distcrawl/start_urls/read", len(raws))
            self.kick()

    def _crashed(self, failure: Any, batch: Batch) -> None:
        """A bug, not an outage: keep the work and log it loudly."""
        self.busy = False
        self._p.riders.drop(batch.riders)
        logger.error(
            "distcrawl scheduler error",
            exc_info=redacted_exc_info(
                failure.value, self.config.redis_url, tb=failure.getTracebackObject()
            ),
            extra={"spider": self.spider},
        )
        self._p.outage.crashed()

    def collect_finished(self) -> None:
        """Acknowledge the leases of the requests that left the engine."""
        if not self._p.leases.active:
            return
        for ref in self._p.leases.finished(_engine.in_progress(self.crawler)):
            # everything it produced is pushed by now: acknowledged once that is stored
            self._p.outbox.ack(ref)
