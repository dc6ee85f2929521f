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
apart. The parts that keep state of their own: ``leases`` (the requests held under a lease),
``outbox`` (what waits for a commit), ``intake`` (entries made from requests and start URLs),
``polling`` (when each Redis step is next due), ``outage`` (the back-off while Redis fails),
``riders`` (other components' commands in its batches), ``report`` (stats and warnings about
what Redis did) and ``opening`` (what a worker settles before joining a crawl). The bases of
this class, one module per responsibility, working on the state ``state`` declares:
``building`` (what goes in the next batch), ``pump`` (running batches, taking in their
results) and ``handlers`` (the engine's signals).
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
from twisted.internet import defer, task

from distcrawl.codec.politeness import ServerClock
from distcrawl.codec.serialize import RequestCodec
from distcrawl.config import DistcrawlConfig
from distcrawl.dupefilter import RedisDupeFilter
from distcrawl.engine import _engine
from distcrawl.engine._batch_types import Batch, BatchResult, Rider
from distcrawl.engine.batch import Runner
from distcrawl.engine.building import BatchBuilding
from distcrawl.engine.handlers import SignalHandlers
from distcrawl.engine.idle import IdleWaits, claim_wait_for
from distcrawl.engine.intake import Intake
from distcrawl.engine.leases import Leases
from distcrawl.engine.liveness import Liveness
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
from distcrawl.engine.polling import Polling
from distcrawl.engine.pump import Pump
from distcrawl.engine.report import Reporter
from distcrawl.engine.riders import Riders
from distcrawl.model.connection import RedisIO, redact_url, redis_io, unmendable, url_problem
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.layout import LayoutMismatch
from distcrawl.model.lua import LibraryMismatch, ScriptsRefused
from distcrawl.model.queue_entry import new_tag
from distcrawl.model.records import EntryKind
from distcrawl.model.redact import redact_error, redacted_exc_info
from distcrawl.model.replies import Drained
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


class Scheduler(BaseScheduler, SignalHandlers, Pump, BatchBuilding):
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
        #: the Redis server's clock as leases tell it, for Retry-After dates (politeness.py)
        self.clock = ServerClock()
        self._outbox = Outbox(config, self.clock)
        self._leases = Leases()
        self._report = Reporter(crawler, config, self.df)
        self._outage = Outage(config, crawler.stats)
        #: made at open, with the codec
        self._intake: Intake | None = None
        self._busy = False
        self._closing = False
        #: the start was refused (REDIS_URL no retry mends): the crawl is closing
        self.refused = False
        self._paused = False
        #: this pause's give-back of claimed start_urls entries is in a batch already
        self._unclaimed = False
        self._kick_pending = False
        self._loop: task.LoopingCall | None = None
        self._remote_queue = 0
        self._start_pending = 0
        self._polling = Polling(config)
        #: an idle worker's blocking reads (idle.py), made with the frontier
        self._idle_waits: IdleWaits | None = None
        #: idle: no poll, the blocking reads wait for work (Pump._park), until _park_until
        self._parked = False
        self._park_until = 0.0
        #: when a parked worker next stands for the look for dead workers' work
        self._next_idle_reap = 0.0
        #: a wait just woke this worker: its next lease asks every shard
        self._woken = False
        #: the last claim found this worker's claim list and start_urls empty, and nothing
        #: was claimed or left claimed since: a park's BLMOVE (start_urls only) misses nothing
        self._claims_empty = False
        self._last_work = time.monotonic()
        #: whether the crawl has had work since this worker joined it (or, read from Redis,
        #: before): the idle clock (DISTCRAWL_IDLE_TIMEOUT) runs only from then on
        self._had_work = False
        #: the "No work yet" line was logged
        self._noted_no_work = False
        #: the last look at the whole frontier (monotonic time, what it saw), for idle close
        self._drained: tuple[float, Drained] | None = None
        self._drain_wanted = False
        #: the last batch built took no lease: the leases held filled DistcrawlConfig.max_held
        self._held_back = False
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
        self.keys = FrontierKeys.of_crawl(spider.name, self.config.namespace)
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
        self._closing = True  # no batch, no reconnection from now on
        _engine.exit_failed(self.crawler)
        reactor.callLater(0, _engine.close_spider, self.crawler, REDIS_URL_REFUSED)  # type: ignore[attr-defined,arg-type,unused-ignore]

    def _connect(self) -> None:
        """Make the client (a RedisCluster when REDIS_URL is a cluster node: it loads the
        slot map), the keys named for it, the Frontier and the liveness beat; on the Redis
        thread, never the reactor's. Until it succeeds the pump retries it (_pump)."""
        assert self.keys is not None and self.codec is not None
        self.keys, self.frontier, self._liveness, self._runner, self.shards = connect(
            self.io, self.keys, self.codec, self.config, self.tag, self.spider
        )
        if self._idle_waits is None:
            from twisted.internet import reactor

            def deliver(kind: str, value: Any) -> None:
                reactor.callFromThread(self._waited, kind, value)

            self._idle_waits = IdleWaits(
                self.config.redis_url,
                self.keys,
                self.tag,
                socket_timeout=self.config.socket_timeout,
                cluster=self.io.cluster,
                deliver=deliver,
                claim_wait=claim_wait_for(self.config.lease.worker_timeout),
            )
            assert self._liveness is not None
            self._liveness.on_readded = self._idle_waits.registered_again

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
        joined = check_layout(self.frontier, self.config, self.crawler)
        check_scripts(self.frontier, self.spider)
        assert self._runner is not None and self._intake is not None
        self._runner.joined = joined
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
        problem = unmendable(failure.value, started=False)
        if problem is not None:
            self._refuse_start(problem, failure.value)
            return None
        if failure.check(LayoutMismatch, LibraryMismatch, ScriptsRefused):
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
        return None  # an outage: handled, the loop reconnects

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
        self._had_work = True
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

    def dead_letter_start(self, url: str, reason: str) -> None:
        """Store a start URL of the spider's own that cannot become a request, so that one
        bad URL neither stops the start nor is lost."""
        assert self._intake is not None
        raw = url.encode("utf-8", errors="surrogateescape")
        self._outbox.push(self._intake.bad_start(raw, reason))
        self._inc("distcrawl/dead/start_urls")

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
        self._inc("distcrawl/recrawl/scheduled" if delay is not None else "distcrawl/recrawl/never")

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

    @property
    def parked(self) -> bool:
        """Idle: holding nothing, waiting for work in blocking reads (distcrawl/engine/idle.py)."""
        return self._parked

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
        self._had_work = True
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
        if self._idle_waits is not None:
            # a BLMOVE still waiting could move a start URL into the claim list after the
            # give-back below: ended first (CLIENT UNBLOCK, or its timeout)
            self._idle_waits.unpark()
            self._idle_waits.end_claims()
            bound = self._idle_waits.claim_wait + self.config.socket_timeout
            for _ in range(int(bound / 0.05)):
                if not self._idle_waits.claiming:
                    break
                await task.deferLater(reactor, 0.05)
            self._idle_waits.stop()
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

    def _inc(self, key: str, count: int = 1) -> None:
        if count and self.stats is not None:
            self.stats.inc_value(key, count)
