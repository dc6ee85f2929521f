"""Redis not answering, seen from the scheduler: how long to wait before the next batch,
and what to say.

An outage is not an error of the crawl: the scheduler keeps every push and acknowledgement,
backs off (doubling up to MAX_RETRY_DELAY) and sends them again. It is logged once when it
starts and once when Redis answers again, not on every failed batch, and while it lasts the
worker never closes for lack of work, as it cannot tell whether the shared queue is empty.

Redis answering but taking no write (full at maxmemory, a read-only replica after a failover,
loading, busy, a refused permission: refusals.py) is an outage too, not a refusal of the
commit's content: the commit waits and goes again unchanged, nothing is dead-lettered, and
the worker takes no new work while it holds a commit Redis cannot store (``writes_refused``),
since what it would lease could not be stored either.
"""

from __future__ import annotations

import logging
import time

import redis
from scrapy import Spider
from scrapy.statscollectors import StatsCollector

from distcrawl.config import DistcrawlConfig
from distcrawl.engine._batch_types import RedisMemory
from distcrawl.model.connection import auth_refusal, redact_url
from distcrawl.model.redact import redact_error
from distcrawl.model.refusals import outage_code, reply_code

#: the scheduler's logger: these are its messages, filtered and configured as such
logger = logging.getLogger("distcrawl.scheduler")

MAX_RETRY_DELAY = 15.0


class Outage:
    """The scheduler's back-off while Redis fails its batches."""

    def __init__(self, config: DistcrawlConfig, stats: StatsCollector | None) -> None:
        self.config = config
        self.stats = stats
        #: set when the scheduler opens
        self.spider: Spider | None = None
        self._retry_at = 0.0
        self._retry_delay = 0.0
        self._failing = False
        self._writes_refused = False
        self._began_refusing = False
        self._said_full = False

    @property
    def failing(self) -> bool:
        """The last batch failed: whether the shared queue is empty is unknown."""
        return self._failing

    @property
    def writes_refused(self) -> bool:
        """Redis answers but the last batch found it taking no write (full, read-only...):
        no new work until it does."""
        return self._failing and self._writes_refused

    def due(self, now: float) -> bool:
        """Whether a batch may run at ``now`` (monotonic)."""
        return now >= self._retry_at

    def error(
        self, exc: BaseException, pushes: int, acks: int, memory: RedisMemory | None = None
    ) -> None:
        """A batch failed for ``exc``, with ``pushes`` and ``acks`` kept to send again:
        back off, doubling the delay; say it once per outage. ``memory``: Redis' INFO
        memory when it was full."""
        self._inc("distcrawl/redis_errors")
        code = outage_code(exc)
        if code == "OOM":
            self._inc("distcrawl/redis_full")
        self._writes_refused = reply_code(exc) is not None
        self._retry_delay = min(max(self._retry_delay * 2, 0.5), MAX_RETRY_DELAY)
        self._retry_at = time.monotonic() + self._retry_delay
        if not self._failing or (code == "OOM" and not self._said_full):
            # once per outage; and a full Redis is said even when it began otherwise
            self._log(exc, code, pushes, acks, memory)
            self._said_full = code == "OOM"
        if not self._failing:
            self._began_refusing = self._writes_refused  # what its end is said as
        self._failing = True

    def _log(
        self,
        exc: BaseException,
        code: str | None,
        pushes: int,
        acks: int,
        memory: RedisMemory | None,
    ) -> None:
        where = redact_url(self.config.redis_url)
        error = f"{type(exc).__name__}: {redact_error(exc, self.config.redis_url)}"
        extra = {"spider": self.spider}
        if code == "OOM":
            if memory is not None:
                how = (
                    f"used_memory {memory.used} of maxmemory {memory.maxmemory} bytes, "
                    f"maxmemory-policy {memory.policy}"
                )
            else:
                how = "INFO memory unreadable"
            logger.error(
                "Redis at %s is full (%s) and refuses every write: keeping %d pushes and %d "
                "acknowledgements to send again unchanged, taking no new work until Redis "
                "has room; raise maxmemory or free memory (DISTCRAWL_MAX_PENDING, "
                "DISTCRAWL_SEEN='bloom' save some)",
                where,
                how,
                pushes,
                acks,
                extra=extra,
            )
            return
        refusal = auth_refusal(exc)
        if code is not None or refusal is not None:
            what = refusal or (
                "Redis is a read-only replica (REDIS_URL may name the old master of a failover)"
                if code == "READONLY"
                else "Redis takes no writes now"
            )
            logger.error(
                "%s at %s (%s): keeping %d pushes and %d acknowledgements to send again "
                "unchanged (none is dead-lettered), taking no new work until Redis takes them",
                what,
                where,
                error,
                pushes,
                acks,
                extra=extra,
            )
            return
        what = (
            "Redis refused a batch" if isinstance(exc, redis.ResponseError) else "Redis unreachable"
        )
        logger.error(
            "%s at %s (%s); keeping %d pushes and %d acknowledgements and retrying",
            what,
            where,
            error,
            pushes,
            acks,
            extra=extra,
        )

    def answered(self) -> None:
        """A batch succeeded: the outage, if any, is over."""
        if self._failing:
            logger.info(
                "Redis takes writes again at %s"
                if self._began_refusing
                else "Redis is reachable again at %s",
                redact_url(self.config.redis_url),
                extra={"spider": self.spider},
            )
            self._failing = False
            self._writes_refused = self._said_full = False
            self._retry_delay = 0.0
            self._inc("distcrawl/redis_reconnects")

    def crashed(self) -> None:
        """A batch failed for a bug, not an outage: try again in a second."""
        self._retry_at = time.monotonic() + 1.0

    def _inc(self, key: str, count: int = 1) -> None:
        if count and self.stats is not None:
            self.stats.inc_value(key, count)
