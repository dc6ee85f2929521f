"""Redis not answering, seen from the scheduler: how long to wait before the next batch,
and what to say.

An outage is not an error of the crawl: the scheduler keeps every push and acknowledgement,
backs off (doubling up to MAX_RETRY_DELAY) and sends them again. It is logged once when it
starts and once when Redis answers again, not on every failed batch, and while it lasts the
worker never closes for lack of work, as it cannot tell whether the shared queue is empty.
"""

from __future__ import annotations

import logging
import time

import redis
from scrapy import Spider
from scrapy.statscollectors import StatsCollector

from distcrawl.config import DistcrawlConfig
from distcrawl.connection import auth_refusal, redact_url
from distcrawl.redact import redact_error

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

    @property
    def failing(self) -> bool:
        """The last batch failed: whether the shared queue is empty is unknown."""
        return self._failing

    def due(self, now: float) -> bool:
        """Whether a batch may run at ``now`` (monotonic)."""
        return now >= self._retry_at

    def error(self, exc: BaseException, pushes: int, acks: int) -> None:
        """A batch failed for ``exc``, with ``pushes`` and ``acks`` kept to send again:
        back off, doubling the delay; say it once per outage."""
        self._inc("distcrawl/redis_errors")
        self._retry_delay = min(max(self._retry_delay * 2, 0.5), MAX_RETRY_DELAY)
        self._retry_at = time.monotonic() + self._retry_delay
        if not self._failing:
            what = auth_refusal(exc) or (
                "Redis refused a batch"
                if isinstance(exc, redis.ResponseError)
                else "Redis unreachable"
            )
            logger.error(
                "%s at %s (%s: %s); keeping %d pushes and %d acknowledgements and retrying",
                what,
                redact_url(self.config.redis_url),
                type(exc).__name__,
                redact_error(exc, self.config.redis_url),
                pushes,
                acks,
                extra={"spider": self.spider},
            )
        self._failing = True

    def answered(self) -> None:
        """A batch succeeded: the outage, if any, is over."""
        if self._failing:
            logger.info(
                "Redis is reachable again at %s",
                redact_url(self.config.redis_url),
                extra={"spider": self.spider},
            )
            self._failing = False
            self._retry_delay = 0.0
            self._inc("distcrawl/redis_reconnects")

    def crashed(self) -> None:
        """A batch failed for a bug, not an outage: try again in a second."""
        self._retry_at = time.monotonic() + 1.0

    def _inc(self, key: str, count: int = 1) -> None:
        if count and self.stats is not None:
            self.stats.inc_value(key, count)
