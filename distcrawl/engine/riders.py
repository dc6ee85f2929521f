"""Other components' Redis commands that ride in the scheduler's batches.

The worker monitor's heartbeat and counters (extensions.py) would cost a round trip of their
own about once a second; in the pipeline of a batch the scheduler sends anyway they cost
none. A rider waits at most ``Rider.wait`` seconds for a batch with work to join before one
runs for it alone, and hears back exactly once, with its replies or the error that kept them
from being sent.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from scrapy import Spider

from distcrawl.engine._batch_types import Rider

#: the scheduler's logger: these are its messages, filtered and configured as such
logger = logging.getLogger("distcrawl.scheduler")


class Riders:
    """The riders waiting for a batch, and the handing back of their replies."""

    def __init__(self) -> None:
        self._riders: list[Rider] = []
        #: set when the scheduler opens
        self.spider: Spider | None = None

    def add(self, rider: Rider) -> None:
        rider.since = time.monotonic()
        self._riders.append(rider)

    def due(self, now: float, *, work: bool) -> bool:
        """Whether the riders go in the batch being built: with work to ride along, or
        alone once one has waited as long as it may."""
        return bool(self._riders) and (work or any(now - r.since >= r.wait for r in self._riders))

    def take(self) -> list[Rider]:
        riders, self._riders = self._riders, []
        return riders

    def drop(self, riders: list[Rider]) -> None:
        """Tell riders their commands were not sent (they keep what they meant to send)."""
        self.deliver(riders, [[redis.ConnectionError("not sent")] * len(r.ops) for r in riders])

    def deliver(self, riders: list[Rider], replies: list[list[Any]]) -> None:
        """Hand each rider its replies, once: a rider's bug is logged, and must not fail
        the batch (whose errback would hand them again)."""
        pending = list(riders)
        riders.clear()  # the batch's own list: handed now, never again
        for rider, got in zip(pending, replies, strict=True):
            try:
                rider.done(got)
            except Exception:
                logger.exception("distcrawl rider failed", extra={"spider": self.spider})
