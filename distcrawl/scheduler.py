"""The distributed scheduler (SCHEDULER): Scrapy's side of the shared Redis frontier.

Scrapy calls a scheduler synchronously (``enqueue_request``, ``next_request``), so this
class only touches local buffers; a periodic *pump* turns them into one batch of Redis work
at a time (distcrawl/engine/batch.py), run on the crawler's Redis thread:

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

This class is Scrapy's interface: opening and closing the frontier, and the calls that touch
only local buffers. The rest is in distcrawl/engine/, each module with the reason it is
apart, each part an object that owns its state and is handed the parts it works with when
this class makes it: ``leases`` (the requests held under a lease), ``outbox`` (what waits for
a commit), ``intake`` (entries made from requests and start URLs), ``polling`` (when each
Redis step is next due), ``outage`` (the back-off while Redis fails), ``riders`` (other
components' commands in its batches), ``report`` (stats and warnings about what Redis did),
``status`` (closing, paused, the work known to wait: read by several parts), ``link`` (what is
made once Redis answers: the runner, the liveness beat, the idle waits), ``parking`` (an idle
worker waiting in blocking reads), ``building`` (what goes in the next batch), ``pump``
(running batches, taking in their results), ``handlers`` (the engine's signals, and the idle
clock the worker closes by) and ``opening`` (what a worker settles before joining a crawl).
The builder, the pump and the handlers work with many of the others: they are handed them as
one bundle (``parts``), made once here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import redis
from scrapy import Request, Spider
from scrapy.core.scheduler import BaseScheduler
from scrapy.dupefilters import BaseDupeFilter
from twisted.internet import defer, task

from distcrawl.codec.politeness import Hold, ServerClock
from distcrawl.codec.serialize import RequestCodec
from distcrawl.config import DistcrawlConfig
from distcrawl.dupefilter import RedisDupeFilter
from distcrawl.engine import _engine
from distcrawl.engine._batch_types import Batch, BatchResult, Rider
from distcrawl.engine.building import BatchBuilder
from distcrawl.engine.drain import Drain
from distcrawl.engine.handlers import IdleClock, SignalHandlers
from distcrawl.engine.holds import HoldListener
from distcrawl.engine.idle import IdleWaits, claim_wait_for
from distcrawl.engine.intake import Intake
from distcrawl.engine.leases import Leases
from distcrawl.engine.link import Link
from distcrawl.engine.opening import (
    check_durability,
    check_layout,
    check_scripts,
    connect,
    dupefilter_for,
    politeness_bound,
)
from distcrawl.engine.outage import Outage
from distcrawl.engine.outbox import Outbox
from distcrawl.engine.parking import Parking
from distcrawl.engine.parts import Parts
from distcrawl.engine.polling import Polling
from distcrawl.engine.pump import Pump
from distcrawl.engine.report import Reporter
from distcrawl.engine.riders import Riders
from distcrawl.engine.status import Status
from distcrawl.model.connection import RedisIO, redact_url, redis_io, unmendable, url_problem
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.layout import LayoutMismatch
from distcrawl.model.lua import LibraryMismatch, ScriptsRefused
from distcrawl.model.queue_entry import new_tag
from distcrawl.model.records import EntryKind
from distcrawl.model.redact import redact_error, redacted_exc_info
from distcrawl.model.shards import Shards

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: how long (s) a closing worker waits for a batch still running
CLOSE_WAIT = 30.0
#: the close reason of a worker whose REDIS_URL no retry can mend
REDIS_URL_REFUSED = "redis_url_refused"


_SCHEDULERS: WeakKeyDictionary[Any, Scheduler] = WeakKeyDictionary()


def scheduler_of(crawler: Crawler) -> Scheduler | None:
    """The open distcrawl scheduler of this crawler, for components that hand it requests
    to delay or to dead-letter; None when the crawl does not use distcrawl's scheduler."""
    return _SCHEDULERS.get(crawler)


class Scheduler(BaseScheduler):
    """Scrapy's scheduler for a frontier shared through Redis.

    Requests this worker discovers are pushed to the shared queue (deduplicated there),
    and the requests it crawls are leased from it, politeness applied for the whole
    cluster; see the module docstring for how nothing is lost when a worker dies, and for
    the parts it is made of.
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
        #: the Redis server's clock as leases tell it, for Retry-After dates (politeness.py)
        self.clock = ServerClock()
        #: the start was refused (REDIS_URL no retry mends): the crawl is closing
        self.refused = False
        # the parts (see the module docstring), each handed those it works with
        self._outbox = Outbox(config, self.clock)
        self._leases = Leases(short=max(1, config.concurrency // 2))
        self._report = Reporter(crawler, config, self.df)
        self._outage = Outage(config, crawler.stats)
        #: other components' commands waiting for a batch to ride with (ride())
        self._riders = Riders()
        self._polling = Polling(config)
        self._status = Status(config, self._leases, self._outbox)
        self._link = Link()
        self._liveness_started = False
        self._idle_clock = IdleClock()
        self._parking = Parking(config, self._link, self._status, self._polling, self._report)
        self._parts = Parts(
            config,
            link=self._link,
            status=self._status,
            leases=self._leases,
            outbox=self._outbox,
            polling=self._polling,
            outage=self._outage,
            riders=self._riders,
            report=self._report,
            parking=self._parking,
            idle_clock=self._idle_clock,
        )
        self._builder = BatchBuilder(self._parts)
        self._pump = Pump(
            crawler,
            self.df,
            io,
            self._parts,
            builder=self._builder,
            clock=self.clock,
            reconnect=self._reconnect,
        )
        #: made at open, with the codec
        self._intake: Intake | None = None
        #: made at open, with the keys: connected to the engine's signals then
        self._handlers: SignalHandlers | None = None
        self._drain = Drain(crawler, self, config.drain_timeout)

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
        self._parking.spider = spider
        self.keys = FrontierKeys.of_crawl(spider.name, self.config.namespace)
        self.codec = RequestCodec(
            self.config.serializer, spider, allowed_callbacks=self.config.allowed_callbacks
        )
        self._intake = Intake(self.config, self.df, self.codec, spider, self._report)
        self._pump.open(spider, self._intake)
        self.io.start()
        # the Frontier, its runner and the liveness beat are made by _connect, on the Redis
        # thread: whether REDIS_URL is a cluster (and so the key names) is learnt by I/O
        self._handlers = SignalHandlers(
            self.crawler,
            self._parts,
            # named alike on a cluster: the keys _connect makes keep it
            start_urls=self.keys.start_urls,
            pump=self._pump,
        )
        self._handlers.connect()
        _engine.local_delays_off(self.crawler)
        _SCHEDULERS[self.crawler] = self
        logger.info(
            "distcrawl frontier %r on %s (worker %s, lease %.0fs, prefetch %d, serializer %s, "
            "seen-set %s); %s",
            self.keys.namespace,
            redact_url(self.config.redis_url),
            self.tag,
            self.config.lease.timeout,
            self.config.prefetch,
            self.config.serializer,
            self.config.seen if self.df is not None else "off (BaseDupeFilter)",
            politeness_bound(self.config, self.crawler.settings),
            extra={"spider": spider},
        )
        problem = url_problem(self.config.redis_url)
        if problem is not None:
            self._refuse_start(problem)
            return defer.succeed(None)
        d = self.io.run(self._open_frontier)
        d.addCallbacks(self._opened, self._open_failed)
        return d

    def _refuse_start(self, problem: str, exc: BaseException | None = None) -> None:
        """One ERROR naming REDIS_URL for what no retry mends, then the crawl closed with a
        non-zero exit code (``_engine.exit_failed``), instead of retrying for ever. The
        open itself succeeds and the close follows: an open that fails leaves Scrapy's
        scraper unopened, and every component it then fails to close logs a traceback."""
        from twisted.internet import reactor

        if self.refused:  # said once; the close is on its way
            return
        detail = (
            f" ({type(exc).__name__}: {redact_error(exc, self.config.redis_url)})" if exc else ""
        )
        logger.error(
            "REDIS_URL=%s: %s%s; the worker stops, as retrying cannot mend this",
            redact_url(self.config.redis_url),
            problem,
            detail,
            extra={"spider": self.spider},
        )
        self.refused = True
        self._status.closing = True  # no batch, no reconnection from now on
        _engine.exit_failed(self.crawler)
        reactor.callLater(0, _engine.close_spider, self.crawler, REDIS_URL_REFUSED)  # type: ignore[attr-defined,arg-type,unused-ignore]

    def _connect(self) -> None:
        """Make the client (a RedisCluster when REDIS_URL is a cluster node: it loads the
        slot map), the keys named for it, the Frontier and the liveness beat; on the Redis
        thread, never the reactor's. Until it succeeds the pump retries it (Pump.turn)."""
        assert self.keys is not None and self.codec is not None
        link = self._link
        self.keys, self.frontier, link.liveness, link.runner, self.shards = connect(
            self.io, self.keys, self.codec, self.config, self.tag, self.spider
        )
        if link.idle_waits is None:
            from twisted.internet import reactor

            def deliver(kind: str, value: Any) -> None:
                reactor.callFromThread(self._pump.waited, kind, value)

            link.idle_waits = IdleWaits(
                self.config.redis_url,
                self.keys,
                self.tag,
                socket_timeout=self.config.socket_timeout,
                cluster=self.io.cluster,
                deliver=deliver,
                claim_wait=claim_wait_for(self.config.lease.worker_timeout),
            )
            assert link.liveness is not None
            link.liveness.on_readded = link.idle_waits.registered_again
        if link.holds is None:
            from twisted.internet import reactor

            def heard(hold: Hold) -> None:
                reactor.callFromThread(self._heard, hold)

            link.holds = HoldListener(
                self.config.redis_url,
                self.keys.holds,
                socket_timeout=self.config.socket_timeout,
                cluster=self.io.cluster,
                max_ms=int(self.config.retry.after_max * 1000),
                deliver=heard,
            )
            link.holds.start()

    def _heard(self, hold: Hold) -> None:
        """Another worker (or this one) read an answer asking its slot to wait (holds.py)."""
        if self._status.closing:
            return
        self._report.inc("distcrawl/politeness/holds_heard")
        self._pump.hold(hold, publish=False)

    def _open_frontier(self) -> dict[str, int]:
        if self._link.runner is None:
            self._connect()
        liveness, runner = self._link.liveness, self._link.runner
        assert self.frontier is not None and liveness is not None
        if self.config.flush_on_start:
            assert self.shards is not None
            removed = self.shards.clear()
            logger.warning(
                "DISTCRAWL_FLUSH_ON_START: removed %d keys of %r",
                removed,
                self.frontier.keys.namespace,
            )
        joined = check_layout(self.frontier, self.config, self.crawler)
        check_scripts(self.frontier, self.spider)
        assert runner is not None and self._intake is not None
        runner.joined = joined
        self._intake.legacy_seen = joined.legacy_seen and self.df is not None
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
        liveness.beat()
        self.frontier.publish_settings(max_pending=self.config.max_pending)
        assert self.shards is not None
        sizes = self.shards.sizes()
        # a paused crawl stays paused for a worker that joins it: read before its first
        # lease, not at its first monitor beat (it would have fetched a prefetch by then)
        sizes["paused"] = int(self.io.client.exists(self.frontier.keys.paused))
        return sizes

    def _opened(self, sizes: dict[str, int]) -> None:
        self._status.remote_queue = sizes["queue"]
        logger.info(
            "Frontier: %(queue)d queued, %(leased)d leased, %(delayed)d retries waiting, "
            "%(seen)d seen, %(start_urls)d start URLs waiting, %(dead)d dead letters",
            sizes,
            extra={"spider": self.spider},
        )
        if sizes.get("paused"):
            self.pause()
        self._start_loop()

    def _open_failed(self, failure: Any) -> Any:
        problem = unmendable(failure.value, started=False)
        if problem is not None:
            self._refuse_start(problem, failure.value)
            return None
        if failure.check(LayoutMismatch, LibraryMismatch, ScriptsRefused):
            # the one failure a retry cannot cure: the crawl does not start
            logger.error("%s", failure.value, extra={"spider": self.spider})
            return failure
        if not failure.check(redis.RedisError) and self._link.runner is None:
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
        return None  # an outage: handled, the loop reconnects

    def _start_loop(self) -> None:
        liveness = self._link.liveness
        if liveness is not None and not self._liveness_started:
            self._liveness_started = True
            liveness.start()
        self._pump.start()

    def _reconnect(self) -> None:
        """Retry ``_open_frontier`` when Redis could not be reached at open: the client,
        the keys (cluster or not) and the Frontier are only known once it answers. The pump
        calls it, and waits for it as for a batch."""
        self._pump.busy = True

        def done(result: Any) -> None:
            self._pump.busy = False
            if isinstance(result, dict):
                self._opened(result)
            elif self._open_failed(result) is not None:
                # what a retry cannot cure (logged): the crawl stops here
                self._link.runner = None
                self._status.closing = True
                self.crawler.stop()

        self.io.run(self._open_frontier).addBoth(done)

    def __len__(self) -> int:
        """Requests waiting to be crawled as far as this worker knows (Status.waiting)."""
        return self._status.waiting()

    def has_pending_requests(self) -> bool:
        return self._status.pending()

    def enqueue_request(self, request: Request) -> bool:
        assert self._intake is not None, "enqueue_request() before open()"
        entry = self._intake.entry(request)
        if entry is None:
            return False
        self._outbox.push(entry)
        if entry.kind == EntryKind.DEAD_LETTER:
            return False
        self._idle_clock.worked()
        self._report.inc("scheduler/enqueued")
        self._report.inc("scheduler/enqueued/redis")
        if self._outbox.entries >= self.config.push_batch_size:
            self._pump.kick()
        return True

    def dead_letter(self, request: Request, reason: str, *, source: str, **extra: Any) -> None:
        """Store a request that will not be crawled, with what is needed to re-drive it.

        It is committed no later than the acknowledgement of the request being processed,
        like any push, so it is neither lost nor stored twice.
        """
        assert self._intake is not None
        self._outbox.push(self._intake.dead_letter(request, reason, source=source, **extra))
        self._report.inc(f"distcrawl/dead/{source}")

    def dead_letter_start(self, url: str, reason: str) -> None:
        """Store a start URL of the spider's own that cannot become a request, so that one
        bad URL neither stops the start nor is lost."""
        assert self._intake is not None
        raw = url.encode("utf-8", errors="surrogateescape")
        self._outbox.push(self._intake.bad_start(raw, reason))
        self._report.inc("distcrawl/dead/start_urls")

    def leased(self, request: Request) -> bool:
        """Whether the engine has ``request`` from this worker's leases: only such a request
        is the frontier's, to be acknowledged (and revisited)."""
        return self._leases.holds(request)

    def revisit(self, request: Request, delay: float | None) -> None:
        """Have the page ``request`` fetched again in ``delay`` seconds (None: never again).

        Stored no later than the acknowledgement of the request that fetched it, like any
        push, so a worker killed in between loses neither: the page is fetched again and
        its revisit stored then.
        """
        assert self._intake is not None
        self._outbox.push(self._intake.revisit(request, delay))
        self._report.inc(
            "distcrawl/recrawl/scheduled" if delay is not None else "distcrawl/recrawl/never"
        )

    def pause(self) -> None:
        """Stop handing out requests; unstarted leased ones go back to the shared queue."""
        status = self._status
        if not status.paused:
            logger.info(
                "Crawl paused: finishing the requests in progress", extra={"spider": self.spider}
            )
        status.paused = True
        self._pump.kick()

    def drain(self) -> int:
        """Stop for good (a SIGTERM, distcrawl/engine/drain.py): paused, never resumed, so
        the next batch gives every request not yet in the engine, and the claimed start
        URLs, back to the other workers at once. Returns how many requests go back."""
        status = self._status
        given = self._leases.waiting
        status.paused = status.draining = True
        self._pump.kick()
        return given

    def stop_waiting(self) -> int:
        """The drain ends before the engine's requests did (DISTCRAWL_DRAIN_TIMEOUT, a
        second SIGTERM): their leases go back with the close, unacknowledged, and the
        engine closes now. Returns how many requests were still in progress."""
        abandoned = self._leases.abandon()
        _engine.stop_waiting(self.crawler)
        return abandoned

    def resume(self) -> None:
        status = self._status
        if status.draining:
            return
        if status.paused:
            logger.info("Crawl resumed", extra={"spider": self.spider})
        status.paused = status.unclaimed = False
        self._polling.resume()
        self._pump.kick()

    @property
    def paused(self) -> bool:
        return self._status.paused

    @property
    def draining(self) -> bool:
        return self._status.draining

    @property
    def parked(self) -> bool:
        """Idle: holding nothing, waiting for work in blocking reads (distcrawl/engine/idle.py)."""
        return self._parking.parked

    def ride(self, rider: Rider) -> bool:
        """Send ``rider``'s commands with the next batch, within ``rider.wait`` seconds, rather
        than in a round trip of their own; False when no batch will run (closing), and the
        caller sends them itself."""
        if self._status.closing or not self._pump.started or self._link.runner is None:
            return False
        self._riders.add(rider)
        return True

    def next_request(self) -> Request | None:
        if self._status.paused:
            return None
        request = self._leases.hand_out()
        if request is None:
            # what the engine holds, counted now, not at the last turn: a worker whose ready
            # requests ran out between two turns waited for the next one, its engine empty
            self._pump.collect_finished()
            if self._leases.starving():
                self._pump.kick()  # a lease now: the next turn may be an interval away
            return None
        self._idle_clock.worked()
        self._report.inc("scheduler/dequeued")
        self._report.inc("scheduler/dequeued/redis")
        # a prefetch running low is refilled by the next turn (DISTCRAWL_FLUSH_INTERVAL):
        # the reserves and what is still ready cover it, and a batch of its own would
        # cost Redis a script call every few pages
        return request

    def close(self, reason: str) -> defer.Deferred[None]:
        self._status.closing = True
        self._pump.stop()
        return defer.ensureDeferred(self._close(reason))

    async def _close(self, reason: str) -> None:
        from twisted.internet import reactor

        for _ in range(int(CLOSE_WAIT / 0.05)):  # the running batch, if any, ends in time
            if not self._pump.busy:
                break
            await task.deferLater(reactor, 0.05)
        idle_waits = self._link.idle_waits
        if idle_waits is not None:
            # a BLMOVE still waiting could move a start URL into the claim list after the
            # give-back below: ended first (CLIENT UNBLOCK, or its timeout)
            idle_waits.unpark()
            idle_waits.end_claims()
            bound = idle_waits.claim_wait + self.config.socket_timeout
            for _ in range(int(bound / 0.05)):
                if not idle_waits.claiming:
                    break
                await task.deferLater(reactor, 0.05)
            idle_waits.stop()
        if self._link.holds is not None:
            self._link.holds.stop()
        self._pump.collect_finished()
        self._riders.drop(self._riders.take())
        # requests not done are given back at once, for another worker to take
        release = self._leases.release_all()
        commits = self._outbox.take_all()
        # after the commits: what is still claimed was never stored, another worker takes it
        batch = Batch(commits=commits, release=release, hand_over=True, unclaim=True)
        acks = sum(len(c.acks) for c in commits)
        pushes = sum(len(c.entries) for c in commits)
        try:
            runner = self._link.runner
            if runner is None:
                return
            res: BatchResult = await self.io.run(runner.run, batch)
            self._pump.apply_commits(res, commits)
            error = res.commit_error or res.error
            if error is not None:
                raise error
            self._report.inc("distcrawl/released", res.released)
            self._report.inc("distcrawl/start_urls/given_back", res.unclaimed)
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
            liveness = self._link.liveness
            if liveness is not None:
                # a normal close: nobody needs to find this worker dead
                await self.io.run(liveness.stop, clean=True)
            self.io.stop()
            self._dupefilter.close(reason)
