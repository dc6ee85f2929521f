"""Where the scheduler stands, as several of its parts read it.

Whether the worker is closing or paused, how many requests the shared queue held at its last
look, how many start URL entries it read are not stored yet: Scrapy's calls and the pump
(pump.py) change them, and the batch builder (building.py), the parking of an idle worker
(parking.py) and the engine's signals (handlers.py) decide from them. Each is held here once
and read through a reference to this object, never copied, so that no part decides from a
value another has changed since. Nothing here touches Redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distcrawl.config import DistcrawlConfig
    from distcrawl.engine.leases import Leases
    from distcrawl.engine.outbox import Outbox


class Status:
    """The scheduler's switches and what it knows of the work waiting (see the module
    docstring)."""

    def __init__(self, config: DistcrawlConfig, leases: Leases, outbox: Outbox) -> None:
        self.config = config
        self._leases = leases
        self._outbox = outbox
        #: no batch, no reconnection from now on: the close, a start refused, a frontier
        #: reset by a worker with other settings
        self.closing = False
        #: no request handed out; unstarted leased ones go back to the shared queue
        self.paused = False
        #: paused for good: the worker is stopping on a signal (drain.py); no resume
        self.draining = False
        #: this pause's give-back of claimed start_urls entries is in a batch already
        self.unclaimed = False
        #: the shared queue's size at this worker's last look (a lease, a commit, the open)
        self.remote_queue = 0
        #: start_urls entries claimed whose commit Redis has not confirmed yet
        self.start_pending = 0

    def waiting(self) -> int:
        """Requests waiting to be crawled as far as this worker knows without asking Redis:
        those it holds, those it has yet to push, and the shared queue at its last look."""
        return self._leases.waiting + self._outbox.entries + self.remote_queue

    def pending(self) -> bool:
        """Whether requests wait, here or in the shared queue (Scrapy's
        ``has_pending_requests``)."""
        return bool(self._leases.waiting or self._outbox.pending() or self.remote_queue > 0)

    def full(self) -> bool:
        """Whether the shared queue was at DISTCRAWL_MAX_PENDING at the last look."""
        cap = self.config.max_pending
        return cap is not None and self.remote_queue >= cap
