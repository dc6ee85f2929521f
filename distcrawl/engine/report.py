"""What a batch's results tell the operator: stats, and warnings that do not flood the log.

The scheduler applies a batch's results to its buffers; what they say about the crawl (requests
dropped for back-pressure, acknowledgements that came too late, expired leases, dead workers,
malformed entries) is counted here in the crawl's stats and logged, each kind of warning at
most once per interval, as a crawled page or a dead worker can cause thousands at once.
Nothing here changes what the scheduler does next.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider, signals

from distcrawl.config import DistcrawlConfig
from distcrawl.dupefilter import RedisDupeFilter
from distcrawl.engine._batch_types import BatchResult, Commit
from distcrawl.engine.replicas import ReplicaChange
from distcrawl.model.connection import redact_url
from distcrawl.model.replies import CommitResult, LeaseResult

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

#: the scheduler's logger: these are its messages, filtered and configured as such
logger = logging.getLogger("distcrawl.scheduler")

#: seconds between two warnings of the same kind
WARN_EVERY = 10.0
#: seconds between two warnings about requests refused for the same scheme
SCHEME_WARN_EVERY = 60.0
#: schemes whose last warning time is kept (a page can make up any number of schemes)
SCHEME_WARN_MAX = 100


class Reporter:
    """The scheduler's stats and warnings about what Redis did with its batches."""

    def __init__(
        self, crawler: Crawler, config: DistcrawlConfig, df: RedisDupeFilter | None
    ) -> None:
        self.crawler = crawler
        self.config = config
        self.df = df
        self.stats = crawler.stats
        #: set when the scheduler opens
        self.spider: Spider | None = None
        #: kind -> monotonic time of its last warning (see _warn_now_and_then)
        self._warned = {"slot_full": 0.0, "full": 0.0, "acks": -WARN_EVERY, "replicas": -WARN_EVERY}
        #: scheme -> monotonic time of the last warning about requests refused for it
        self._warned_schemes: dict[str, float] = {}

    def refused_scheme(self, request: Request, why: str) -> None:
        """Count the refusal; warn once a minute per scheme, as a crawled page can hold
        any number of such links."""
        self.inc("distcrawl/refused/scheme")
        scheme = request.url.partition(":")[0].lower()[:20]
        now = time.monotonic()
        last = self._warned_schemes.get(scheme)
        if last is not None and now - last < SCHEME_WARN_EVERY:
            return
        if len(self._warned_schemes) >= SCHEME_WARN_MAX:
            self._warned_schemes.clear()
        self._warned_schemes[scheme] = now
        logger.warning(
            "Refused %s: %s (counted in distcrawl/refused/scheme; logged once a minute per scheme)",
            redact_url(request.url)[:200],
            why,
            extra={"spider": self.spider},
        )

    def commit(self, c: CommitResult, commit: Commit | None) -> None:
        """Count and tell what a commit did; log at most every WARN_EVERY seconds what
        the operator should act on."""
        self.inc("distcrawl/pushed", c.enqueued)
        self.inc("distcrawl/duplicates", c.duplicates)
        self.inc("distcrawl/dead_letters", c.dead)
        self.inc("distcrawl/commit/replayed", c.replayed)
        self.inc("distcrawl/ack/late", c.late)
        self.inc("distcrawl/ack/stale", c.stale)
        self.inc("distcrawl/ack/missing", c.missing)
        # start entries no longer in this worker's claim list: it was taken for dead and
        # they went back to start_urls, for another worker; not stored here
        self.inc("distcrawl/start_urls/taken_over", c.skipped)
        if c.replayed:
            logger.warning(
                "A commit whose reply was lost had already been stored; not stored again",
                extra={"spider": self.spider},
            )
        if c.stale or c.missing:
            self._warn_now_and_then(
                "acks",
                "%d acknowledgements came after their leases were taken over and %d found no "
                "request (already done, or lost by Redis); they changed nothing (stats: "
                "distcrawl/ack/stale, distcrawl/ack/missing)",
                c.stale,
                c.missing,
            )
        if commit is not None and not commit.split:
            self.dropped(commit, c.not_stored)
        elif c.duplicates and self.df is not None:
            self.df.count(c.duplicates)
        if c.slot_dropped:
            self.inc("distcrawl/backpressure/slot_dropped", c.slot_dropped)
            self._warn_now_and_then(
                "slot_full",
                "%d new requests dropped: their slots have DISTCRAWL_MAX_PENDING_PER_SLOT=%d "
                "requests queued (stat distcrawl/backpressure/slot_dropped)",
                c.slot_dropped,
                self.config.max_pending_per_slot,
            )
        if c.dropped or c.held:
            self.inc("distcrawl/backpressure/dropped", c.dropped)
            self.inc("distcrawl/backpressure/start_urls_held", c.held)
            self._warn_now_and_then(
                "full",
                "The shared queue is at DISTCRAWL_MAX_PENDING=%d: %d new requests dropped "
                "and %d start URLs left waiting in Redis (stats: distcrawl/backpressure/)",
                self.config.max_pending,
                c.dropped,
                c.held,
            )

    def dropped(self, commit: Commit, positions: tuple[int, ...]) -> None:
        """Requests Redis did not store (duplicates; negative positions: over the pending
        cap): logged and signalled as Scrapy does for the requests its scheduler drops."""
        for position in positions:
            entry = commit.entries[position if position >= 0 else -position - 1]
            request = entry.request
            if position >= 0 and self.df is not None:
                if request is not None:
                    self.df.log(request, self.spider)  # type: ignore[arg-type]
                else:
                    self.df.count(1)
            if request is not None:
                self.crawler.signals.send_catch_log(
                    signals.request_dropped, request=request, spider=self.spider
                )

    def shards(self, res: BatchResult) -> None:
        """What only a sharded frontier does: dead letters moved from the shards'
        quarantines, and first phases that did not reach DISTCRAWL_WAIT_REPLICAS replicas."""
        self.inc("distcrawl/dead/moved", res.dead_moved)
        for change in res.replica_changes:
            self._replicas_changed(change)
        wanted = self.config.wait_replicas
        if res.replicas >= wanted:
            return
        self.inc("distcrawl/commit/unreplicated")
        if res.wait_skipped:
            # said once, when the node lost its replicas (_replicas_changed)
            self.inc("distcrawl/commit/wait_skipped")
            return
        self._warn_now_and_then(
            "replicas",
            "Children stored in other shards reached %d of %d replicas within %.1fs "
            "(DISTCRAWL_WAIT_REPLICAS); their pages are acknowledged anyway, so that the "
            "crawl goes on: a failover now could lose them",
            res.replicas,
            wanted,
            self.config.wait_replicas_timeout,
        )

    def _replicas_changed(self, change: ReplicaChange) -> None:
        where = change.node or redact_url(self.config.redis_url)
        if change.lost:
            logger.warning(
                "Redis at %s has %d connected replicas, fewer than DISTCRAWL_WAIT_REPLICAS=%d "
                "(a failover left it without?): commits to it no longer wait for replicas, "
                "which would take DISTCRAWL_WAIT_REPLICAS_TIMEOUT=%.1fs each; counted in "
                "distcrawl/commit/unreplicated until a replica is back (a failover now could "
                "lose their children)",
                where,
                change.connected,
                change.wanted,
                self.config.wait_replicas_timeout,
                extra={"spider": self.spider},
            )
        else:
            logger.info(
                "Redis at %s has %d connected replicas again: commits to it wait for them "
                "(DISTCRAWL_WAIT_REPLICAS=%d)",
                where,
                change.connected,
                change.wanted,
                extra={"spider": self.spider},
            )

    def requeue(self, res: BatchResult) -> None:
        """Tell what the reclaim of expired leases and of dead workers' found."""
        if res.swept is not None:
            self.inc("distcrawl/slots/forgotten", res.swept.forgotten)
        r = res.requeue
        if r is None:
            return
        expired = r.requeued - r.released
        self._tell(logging.INFO, expired, "Requeued %d requests whose leases expired")
        self.inc("distcrawl/lease_expired", expired)
        if r.dead_workers:
            logger.warning(
                "%d workers stopped sending liveness beats for %.0fs: %d of their leases "
                "given back",
                r.dead_workers,
                self.config.lease.worker_timeout,
                r.released,
                extra={"spider": self.spider},
            )
            self.inc("distcrawl/dead_workers", r.dead_workers)
            self.inc("distcrawl/dead_worker_released", r.released)
        self._tell(
            logging.WARNING,
            r.unclaimed,
            "%d start URLs claimed by workers no longer alive given back to start_urls",
        )
        self.inc("distcrawl/start_urls/reclaimed", r.unclaimed)
        self._tell(
            logging.WARNING,
            r.orphans,
            "%d leases had no request record (Redis lost data, or it was edited): removed",
        )
        self.inc("distcrawl/orphan_leases", r.orphans)

    def lease(self, lease: LeaseResult) -> None:
        """Tell what a lease found besides requests: due retries, and what is wrong."""
        self.inc("distcrawl/retry/due", lease.released)
        self._tell(
            logging.ERROR, lease.quarantined, "%d malformed queue entries moved to the dead letters"
        )
        self._tell(
            logging.WARNING,
            lease.missing_retries,
            "%d retries were due but their records were gone (Redis lost data?)",
        )
        self.inc("distcrawl/retry/missing", lease.missing_retries)
        self._tell(
            logging.WARNING,
            lease.rearmed,
            "%d queued slots were missing from the ready set: armed again",
        )

    def _warn_now_and_then(self, kind: str, message: str, *args: Any) -> None:
        """Warn unless a warning of this ``kind`` was logged within WARN_EVERY seconds: its
        cause shows in every commit while it lasts, which would flood the log."""
        now = time.monotonic()
        if now - self._warned[kind] < WARN_EVERY:
            return
        self._warned[kind] = now
        logger.warning(message, *args, extra={"spider": self.spider}, stacklevel=2)

    def _tell(self, level: int, count: int, message: str) -> None:
        """Log ``message`` (``%d``: the count) at ``level`` when ``count`` is not 0."""
        if count:
            logger.log(level, message, count, extra={"spider": self.spider}, stacklevel=2)

    def inc(self, key: str, count: int = 1) -> None:
        """Add ``count`` to a stat of the crawl's: every part of the scheduler counts here."""
        if count and self.stats is not None:
            self.stats.inc_value(key, count)
