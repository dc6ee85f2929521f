"""The distributed scheduler (SCHEDULER): Scrapy's side of the shared Redis frontier.

Scrapy calls a scheduler synchronously (``enqueue_request``, ``next_request``), so this
class only touches local buffers; a periodic *pump* turns them into one batch of Redis work
at a time (distcrawl/batch.py), run on the crawler's Redis thread:

1. commit: push discovered requests and start-URL entries, and acknowledge the leases of
   requests the engine is completely done with, in one atomic script;
2. renew the leases this worker holds, and requeue expired leases and those of dead
   workers;
3. lease more requests when the local buffer runs low;
4. claim entries of ``<spider>:start_urls`` into this worker's claim list, O(1) each, so
   that no two workers read the same entry (an entry leaves the claim list only in the
   commit that stores the request made from it; the claims of a worker that closes, pauses
   or dies go back to ``start_urls``).

A request is acknowledged only after it left the engine, i.e. after its download, its
callback, and the handing-on of everything the callback produced, and only in the commit
that stores the last of its children (or a later one), so a worker killed at any moment
loses nothing: its leases expire, or are given back as soon as its liveness beats stop, and
another worker takes them. Each lease carries a token, so an acknowledgement that comes too
late (the request was leased again) changes nothing.

This class is Scrapy's interface and the pump; the parts that keep state of their own are
in distcrawl/_scheduler/, each module with the reason it is apart: ``leases`` (the requests
held under a lease), ``outbox`` (what waits for a commit), ``intake`` (entries made from
requests and start URLs), ``polling`` (when each Redis step is next due), ``outage`` (the
back-off while Redis fails), ``riders`` (other components' commands in its batches),
``report`` (stats and warnings about what Redis did) and ``opening`` (what a worker settles
before joining a crawl).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import redis
from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.dupefilters import BaseDupeFilter
from scrapy.exceptions import DontCloseSpider
from twisted.internet import defer, task

from distcrawl import _engine
from distcrawl._scheduler.intake import RETRY_DELAY_META as RETRY_DELAY_META
from distcrawl._scheduler.intake import Intake
from distcrawl._scheduler.leases import Leases
from distcrawl._scheduler.opening import check_durability, check_layout, connect, dupefilter_for
from distcrawl._scheduler.outage import Outage
from distcrawl._scheduler.outbox import Outbox
from distcrawl._scheduler.polling import Polling
from distcrawl._scheduler.report import Reporter
from distcrawl._scheduler.riders import Riders
from distcrawl.batch import (
    SPLIT_AFTER,
    Batch,
    BatchResult,
    Commit,
    Rider,
    Runner,
    refused,
)
from distcrawl.config import DistcrawlConfig
from distcrawl.connection import RedisIO, redact_url, redis_io
from distcrawl.dupefilter import RedisDupeFilter
from distcrawl.frontier import (
    CommitResult,
    Drained,
    Entry,
    EntryKind,
    Frontier,
    LeaseRef,
    dead_letter,
    new_tag,
)
from distcrawl.keys import FrontierKeys
from distcrawl.layout import LayoutMismatch
from distcrawl.liveness import Liveness
from distcrawl.redact import redact_error, redacted_exc_info
from distcrawl.serialize import RequestCodec
from distcrawl.shards import Shards

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: how old (s) the last look at the whole frontier may be for an idle worker to close
DRAIN_CHECK_MAX_AGE = 0.5
#: how long (s) a closing worker waits for a batch still running
CLOSE_WAIT = 30.0


_SCHEDULERS: WeakKeyDictionary[Any, Scheduler] = WeakKeyDictionary()


def scheduler_of(crawler: Crawler) -> Scheduler | None:
    """The open distcrawl scheduler of this crawler, for components that hand it requests
    to delay or to dead-letter; None when the crawl does not use distcrawl's scheduler."""
    return _SCHEDULERS.get(crawler)


class Scheduler(BaseScheduler):
    """Scrapy's scheduler for a frontier shared through Redis.

    Requests this worker discovers are pushed to the shared queue (deduplicated there),
    and the requests it crawls are leased from it, politeness applied for the whole
    cluster; see the module docstring for how nothing is lost when a worker dies.
    """

    def __init__(
        self,
        crawler: Crawler,
        config: DistcrawlConfig,
        dupefilter: RedisDupeFilter | BaseDupeFilter,
        io: RedisIO,
    ) -> None:
        self.crawler = crawler
        self.config = config
        #: None when DUPEFILTER_CLASS is BaseDupeFilter: no request is filtered
        self.df = dupefilter if isinstance(dupefilter, RedisDupeFilter) else None
        self._dupefilter = dupefilter
        self.io = io
        self.stats = crawler.stats
        #: this worker's tag: the first half of its lease tokens, its liveness beat's name
        self.tag = new_tag()
        self.spider: Spider | None = None
        self.keys: FrontierKeys | None = None
        self.frontier: Frontier | None = None
        #: the frontier's shards (DISTCRAWL_SHARDS); ``frontier`` is the crawl's own keys
        self.shards: Shards | None = None
        self.codec: RequestCodec | None = None
        self._runner: Runner | None = None
        self._liveness: Liveness | None = None
        self._liveness_started = False
        self._outbox = Outbox(config)
        self._leases = Leases()
        self._report = Reporter(crawler, config, self.df)
        self._outage = Outage(config, crawler.stats)
        #: made at open, with the codec
        self._intake: Intake | None = None
        self._busy = False
        self._closing = False
        self._paused = False
        #: this pause's give-back of claimed start_urls entries is in a batch already
        self._unclaimed = False
        self._kick_pending = False
        self._loop: task.LoopingCall | None = None
        self._remote_queue = 0
        self._start_pending = 0
        self._polling = Polling(config)
        #: whether the batch running is a lease poll's wait in Redis for a wake-up token
        #: (Polling.take_wake_wait): it brings no work of this worker's
        self._waiting = False
        self._last_work = time.monotonic()
        #: the last look at the whole frontier (monotonic time, what it saw), for idle close
        self._drained: tuple[float, Drained] | None = None
        self._drain_wanted = False
        #: other components' commands waiting for a batch to ride with (ride())
        self._riders = Riders()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Scheduler:
        config = DistcrawlConfig.from_settings(crawler.settings)
        return cls(crawler, config, dupefilter_for(crawler), redis_io(crawler))

    # -- Scrapy's scheduler interface ------------------------------------------------

    def open(self, spider: Spider) -> defer.Deferred[Any]:
        _engine.check(self.crawler)
        self.spider = spider
        # the helpers' log records name the spider, as the scheduler's do
        self._report.spider = self._outage.spider = self._riders.spider = spider
        self.keys = FrontierKeys(self.config.namespace or spider.name)
        self.codec = RequestCodec(
            self.config.serializer, spider, allowed_callbacks=self.config.allowed_callbacks
        )
        self._intake = Intake(self.config, self.df, self.codec, spider, self._report)
        self.io.start()
        # the Frontier, its runner and the liveness beat are made by _connect, on the Redis
        # thread: whether REDIS_URL is a cluster (and so the key names) is learnt by I/O
        self.crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        self.crawler.signals.connect(
            self._on_downloading, signal=signals.request_reached_downloader
        )
        # response_downloaded, not response_received: a 429 that the retry middleware turns
        # into a retry never reaches the engine as a response, and it is the one to report
        self.crawler.signals.connect(self._on_response, signal=signals.response_downloaded)
        self.crawler.signals.connect(self._on_left, signal=signals.request_left_downloader)
        _engine.local_delays_off(self.crawler)
        _SCHEDULERS[self.crawler] = self
        logger.info(
            "distcrawl frontier %r on %s (worker %s, lease %.0fs, prefetch %d, serializer %s, "
            "seen-set %s); per %s, cluster-wide: delay %.2fs, concurrency %d%s",
            self.keys.namespace,
            redact_url(self.config.redis_url),
            self.tag,
            self.config.lease_timeout,
            self.config.prefetch,
            self.config.serializer,
            self.config.seen if self.df is not None else "off (BaseDupeFilter)",
            "IP" if self.config.slots_by_ip else "domain",
            self.config.domain_delay,
            self.config.domain_concurrency,
            ", robots.txt Crawl-delay" if self.config.robots_obey else "",
            extra={"spider": spider},
        )
        d = self.io.run(self._open_frontier)
        d.addCallbacks(self._opened, self._open_failed)
        return d

    def _connect(self) -> None:
        """Make the client (a RedisCluster when REDIS_URL is a cluster node: it loads the
        slot map), the keys named for it, the Frontier and the liveness beat; on the Redis
        thread, never the reactor's. Until it succeeds the pump retries it (_pump)."""
        assert self.keys is not None and self.codec is not None
        self.keys, self.frontier, self._liveness, self._runner, self.shards = connect(
            self.io, self.keys, self.codec, self.config, self.tag, self.spider
        )

    def _open_frontier(self) -> dict[str, int]:
        if self._runner is None:
            self._connect()
        assert self.frontier is not None and self._liveness is not None
        if self.config.flush_on_start:
            assert self.shards is not None
            removed = self.shards.clear()
            logger.warning(
                "DISTCRAWL_FLUSH_ON_START: removed %d keys of %r",
                removed,
                self.frontier.keys.namespace,
            )
        check_layout(self.frontier, self.config, self.crawler)
        assert self.shards is not None
        check_durability(
            self.io.client,
            self.frontier.keys,
            self.config.redis_url,
            self.spider,
            [f.keys for f in self.shards.parts],
        )
        # alive before the first lease or claim, so that a worker dying at once is seen dead
        # (and its claims are not taken for orphans: requeue.lua)
        self._liveness.beat()
        self.frontier.publish_settings(max_pending=self.config.max_pending)
        assert self.shards is not None
        return self.shards.sizes()

    def _opened(self, sizes: dict[str, int]) -> None:
        self._remote_queue = sizes["queue"]
        logger.info(
            "Frontier: %(queue)d queued, %(leased)d leased, %(delayed)d retries waiting, "
            "%(seen)d seen, %(start_urls)d start URLs waiting, %(dead)d dead letters",
            sizes,
            extra={"spider": self.spider},
        )
        self._start_loop()

    def _open_failed(self, failure: Any) -> Any:
        if failure.check(LayoutMismatch):
            # the one failure a retry cannot cure: the crawl does not start
            logger.error("%s", failure.value, extra={"spider": self.spider})
            return failure
        if not failure.check(redis.RedisError) and self._runner is None:
            # a bug or a refused setting (e.g. a namespace a cluster cannot hash-tag)
            logger.error(
                "distcrawl could not open the frontier",
                exc_info=redacted_exc_info(
                    failure.value, self.config.redis_url, tb=failure.getTracebackObject()
                ),
                extra={"spider": self.spider},
            )
            return failure
        self._outage.error(failure.value, *self._outbox.counts())
        self._start_loop()

    def _start_loop(self) -> None:
        if self._liveness is not None and not self._liveness_started:
            self._liveness_started = True
            self._liveness.start()
        if self._loop is None:
            self._loop = task.LoopingCall(self._pump)
            self._loop.start(self.config.flush_interval, now=True)

    def _reconnect(self) -> None:
        """Retry ``_open_frontier`` when Redis could not be reached at open: the client,
        the keys (cluster or not) and the Frontier are only known once it answers."""
        self._busy = True

        def done(result: Any) -> None:
            self._busy = False
            if isinstance(result, dict):
                self._opened(result)
            elif self._open_failed(result) is not None:
                # what a retry cannot cure (logged): the crawl stops here
                self._runner = None
                self._closing = True
                self.crawler.stop()

        self.io.run(self._open_frontier).addBoth(done)

    def __len__(self) -> int:
        """Requests waiting to be crawled as far as this worker knows without asking Redis:
        those it holds, those it has yet to push, and the shared queue at its last look."""
        return self._leases.waiting + self._outbox.entries + self._remote_queue

    def has_pending_requests(self) -> bool:
        return bool(self._leases.waiting or self._outbox.pending() or self._remote_queue > 0)

    def enqueue_request(self, request: Request) -> bool:
        assert self._intake is not None, "enqueue_request() before open()"
        entry = self._intake.entry(request)
        if entry is None:
            return False
        self._outbox.push(entry)
        if entry.kind == EntryKind.DEAD_LETTER:
            return False
        self._last_work = time.monotonic()
        self._inc("scheduler/enqueued")
        self._inc("scheduler/enqueued/redis")
        if self._outbox.entries >= self.config.push_batch_size:
            self._kick()
        return True

    def dead_letter(self, request: Request, reason: str, *, source: str, **extra: Any) -> None:
        """Store a request that will not be crawled, with what is needed to re-drive it.

        It is committed no later than the acknowledgement of the request being processed,
        like any push, so it is neither lost nor stored twice.
        """
        assert self._intake is not None
        self._outbox.push(self._intake.dead_letter(request, reason, source=source, **extra))
        self._inc(f"distcrawl/dead/{source}")

    def pause(self) -> None:
        """Stop handing out requests; unstarted leased ones go back to the shared queue."""
        if not self._paused:
            logger.info(
                "Crawl paused: finishing the requests in progress", extra={"spider": self.spider}
            )
        self._paused = True
        self._kick()

    def resume(self) -> None:
        if self._paused:
            logger.info("Crawl resumed", extra={"spider": self.spider})
        self._paused = self._unclaimed = False
        self._polling.resume()
        self._kick()

    @property
    def paused(self) -> bool:
        return self._paused

    def ride(self, rider: Rider) -> bool:
        """Send ``rider``'s commands with the next batch, within ``rider.wait`` seconds, rather
        than in a round trip of their own; False when no batch will run (closing), and the
        caller sends them itself."""
        if self._closing or self._loop is None or self._runner is None:
            return False
        self._riders.add(rider)
        return True

    def next_request(self) -> Request | None:
        if self._paused:
            return None
        request = self._leases.hand_out()
        if request is None:
            self._kick()
            return None
        self._last_work = time.monotonic()
        self._inc("scheduler/dequeued")
        self._inc("scheduler/dequeued/redis")
        if self._leases.ready < self.config.prefetch // 2:
            self._kick()
        return request

    def close(self, reason: str) -> defer.Deferred[None]:
        self._closing = True
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        return defer.ensureDeferred(self._close(reason))

    async def _close(self, reason: str) -> None:
        from twisted.internet import reactor

        for _ in range(int(CLOSE_WAIT / 0.05)):  # the running batch, if any, ends in time
            if not self._busy:
                break
            await task.deferLater(reactor, 0.05)
        self._collect_finished()
        self._riders.drop(self._riders.take())
        # requests not done are given back at once, for another worker to take
        release = self._leases.release_all()
        commits = self._outbox.take_all()
        # after the commits: what is still claimed was never stored, another worker takes it
        batch = Batch(commits=commits, release=release, unclaim=True)
        acks = sum(len(c.acks) for c in commits)
        pushes = sum(len(c.entries) for c in commits)
        try:
            if self._runner is None:
                return
            res: BatchResult = await self.io.run(self._runner.run, batch)
            self._apply_commits(res, commits)
            error = res.commit_error or res.error
            if error is not None:
                raise error
            self._inc("distcrawl/released", res.released)
            self._inc("distcrawl/start_urls/given_back", res.unclaimed)
            logger.info(
                "Frontier closed: %d acknowledged, %d pushed, %d leases and %d start URLs "
                "given back",
                acks,
                pushes,
                res.released,
                res.unclaimed,
                extra={"spider": self.spider},
            )
        except redis.RedisError as exc:
            logger.error(
                "Could not save the last batch to Redis (%s): %d acknowledgements and %d "
                "pushes not stored; the leases concerned will expire and be crawled again",
                redact_error(exc, self.config.redis_url),
                acks,
                pushes,
                extra={"spider": self.spider},
            )
        finally:
            if self._liveness is not None:
                # a normal close: nobody needs to find this worker dead
                await self.io.run(self._liveness.stop, clean=True)
            self.io.stop()
            self._dupefilter.close(reason)

    # -- the pump ------------------------------------------------------------------------

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
        self._waiting = batch.wait > 0
        d = self.io.run(self._runner.run, batch)
        d.addCallback(self._apply, batch)
        d.addErrback(self._crashed, batch)

    def _build_batch(self, now: float) -> Batch:
        """The work due now, and what may ride with it: the reclaim of expired leases, other
        components' commands, a liveness beat. Those run in a batch of their own only once
        late (the beat never: its thread does), so an idle worker makes one round trip per
        lease poll, about one a second (DISTCRAWL_IDLE_POLL_MAX)."""
        batch = self._build_work(now)
        work = not batch.empty()
        if self._polling.reclaim_due(now, work=work):
            batch.reclaim = True
        if self._riders.due(now, work=not batch.empty()):
            batch.riders = self._riders.take()
        if not batch.empty() and self._liveness is not None and self._liveness.due(batch.wait):
            batch.beat = True
        return batch

    def _build_work(self, now: float) -> Batch:
        batch = Batch()
        self._leases.report(batch)
        commit = self._outbox.current()
        if commit is not None:
            batch.commits = [commit]
        if self._polling.renew_due(now):
            batch.renew = self._held_refs()
        if self._drain_wanted:
            batch.drain = True
            self._drain_wanted = False
        if self._paused:
            if self._start_pending == 0 and not self._unclaimed:
                # every start entry read is stored: what is still claimed goes back
                batch.unclaim = self._unclaimed = True
            batch.release = self._leases.release_waiting()
            return batch
        prefetch = self.config.prefetch
        lease = self._leases.ready <= prefetch // 2 and self._polling.lease_due(now)
        batch.release, held = self._leases.release_idle_reserves(lease)
        self._inc("distcrawl/places/reserves_returned", len(batch.release))
        if lease:
            batch.wait = self._polling.take_wake_wait(lambda: self._idle() and not batch.drain)
            batch.want = max(0, prefetch - self._leases.waiting)
            batch.held = held
            batch.reserve = prefetch // 2
            batch.reserved = self._leases.reserved()
        if self._start_pending == 0 and self._polling.peek_due(now) and not self._full():
            batch.peek = self.config.start_urls_batch
        return batch

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

    def _held_refs(self) -> list[LeaseRef]:
        """Every lease this worker holds: waiting, in progress, and done but not yet
        acknowledged (kept while a commit is being retried, so that they stay ours)."""
        return self._leases.held_refs() + self._outbox.acked_refs()

    def _apply(self, res: BatchResult, batch: Batch) -> None:
        self._busy = False
        now = time.monotonic()
        self._apply_commits(res, batch.commits)
        errors = [e for e in (res.commit_error, res.error) if e is not None]
        if len(errors) == 2 and errors[0] is errors[1]:
            # one lost pipeline, the commit's and the other steps' failure: counted once
            del errors[1]
        for error in errors:
            self._outage.error(error, *self._outbox.counts())
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
        if batch.want and res.lease is not None:
            if got:
                self._polling.lease_now(now)
            else:
                self._polling.back_off(now, res.lease, idle=self._idle())
        if res.woken:
            self._inc("distcrawl/idle/woken")
        self._riders.deliver(batch.riders, res.riders)
        if batch.peek and res.error is None:
            self._handle_peeked(res.peeked)
            busy = bool(self._leases.ready or self._leases.active)
            self._polling.peeked(now, len(res.peeked), batch.peek, busy=busy)
        if res.drained is not None:
            self._drained = (now, res.drained)
            _engine.wake(self.crawler)  # the engine asks spider_idle again, which reads it
        low = self._leases.ready <= self.config.prefetch // 2
        if self._outbox.due or self._leases.unreported or ((got or lease_now) and low):
            # the next batch now, not one reactor turn later: a turn can be a page's parsing
            self._pump()

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
        self._report.lease(lease)
        if got:
            self._inc("distcrawl/leased", got)
            self._last_work = time.monotonic()
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

    # -- lease tracking ------------------------------------------------------------------

    def _collect_finished(self) -> None:
        if not self._leases.active:
            return
        for ref in self._leases.finished(_engine.in_progress(self.crawler)):
            # everything it produced is pushed by now: acknowledged once that is stored
            self._outbox.ack(ref)

    def _on_idle(self, spider: Spider) -> None:
        timeout = self.config.idle_timeout
        if (
            timeout is None
            or (self._busy and not self._waiting)
            or self._outage.failing  # cannot tell whether the shared queue is empty
            or self._paused
            or self.has_pending_requests()
            or self._leases.active
        ):
            raise DontCloseSpider
        now = time.monotonic()
        idle_for = now - self._last_work
        if idle_for < timeout:
            raise DontCloseSpider
        # the whole crawl must be out of work, not only this worker: a start URL pushed a
        # moment ago, a retry coming due, another worker's lease that may still produce
        # requests or be given back
        look = self._drained
        if look is None or now - look[0] > DRAIN_CHECK_MAX_AGE or look[0] < self._last_work:
            self._drain_wanted = True
            self._kick()
            raise DontCloseSpider
        if not look[1].idle(int(timeout * 1000)):
            self._drained = None
            self._last_work = now  # there is work somewhere: wait a whole timeout again
            raise DontCloseSpider
        logger.info(
            "No work for %.1fs (DISTCRAWL_IDLE_TIMEOUT=%s) and the shared frontier is empty: "
            "closing",
            idle_for,
            timeout,
            extra={"spider": spider},
        )

    def _full(self) -> bool:
        cap = self.config.max_pending
        return cap is not None and self._remote_queue >= cap

    def _on_downloading(self, request: Request, spider: Spider) -> None:
        if self._leases.downloading(request):
            self._kick()  # before the slot's next turn, which this lag pushes back

    def _on_left(self, request: Request, spider: Spider) -> None:
        swapped = self._leases.left(request)
        if swapped is None:
            return
        if swapped:
            _engine.wake(self.crawler)  # a reserve of its slot took its place
            return
        # off the site (answered or failed): its place in the slot is free for the next request
        # now, while its lease waits for what the page yields to be stored (the ack); and this
        # worker may take it in the same batch, not after the back-off of a lease that found
        # the slot full
        self._polling.place_freed()
        self._kick()

    def _on_response(self, response: Any, request: Request, spider: Spider) -> None:
        if self._outbox.feedback(request, response):
            self._inc("distcrawl/politeness/throttled")
            self._inc(f"distcrawl/politeness/throttled/{response.status}")
            # every worker must hold back from now on, not from this worker's next batch
            self._kick()

    def _inc(self, key: str, count: int = 1) -> None:
        if count and self.stats is not None:
            self.stats.inc_value(key, count)
