"""An idle worker parked: no more polls, blocking reads wait in Redis for work (idle.py).

A lease poll that finds nothing queued anywhere, by a worker that holds nothing, parks it
(the pump decides from the poll's reply, pump.py): lease polls and claims stop, the liveness
beat slows, and idle.py's blocking reads wait for a start URL and for a wake-up token, until
work arrives or the reply's next due time (a retry, a revisit) comes. This part keeps whether
the worker is parked and until when, when it next looks for dead workers' work, and what a
wait that returned means for the next batch; the batch builder (building.py) reads it for
what a parked worker sends. Nothing here touches Redis: the waits do, on threads of their own.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from distcrawl.engine.idle import IDLE_REAP_INTERVAL

if TYPE_CHECKING:
    from scrapy import Spider

    from distcrawl.config import DistcrawlConfig
    from distcrawl.engine.link import Link
    from distcrawl.engine.polling import Polling
    from distcrawl.engine.report import Reporter
    from distcrawl.engine.status import Status

#: the scheduler's logger: these are its messages, filtered and configured as such
logger = logging.getLogger("distcrawl.scheduler")


class Parking:
    """Whether this worker is parked, and the waits' news for its next batches (see the
    module docstring)."""

    def __init__(
        self,
        config: DistcrawlConfig,
        link: Link,
        status: Status,
        polling: Polling,
        report: Reporter,
    ) -> None:
        self.config = config
        self._link = link
        self._status = status
        self._polling = polling
        self._report = report
        #: set when the scheduler opens
        self.spider: Spider | None = None
        #: idle: no poll, the blocking reads wait for work (park), until _park_until
        self.parked = False
        self._park_until = 0.0
        #: when a parked worker next stands for the look for dead workers' work
        self._next_idle_reap = 0.0
        #: a wait just woke this worker: its next lease asks every shard
        self._woken = False
        #: the last claim found this worker's claim list and start_urls empty, and nothing
        #: was claimed or left claimed since: a park's BLMOVE (start_urls only) misses nothing
        self.claims_empty = False

    def park(self, now: float, until: float) -> None:
        """Nothing queued anywhere and nothing here: stop polling, wait in Redis for a start
        URL (BLMOVE into the claim list, unless a claim may not be made now) and for a
        wake-up token, beat rarely, until work arrives or ``until`` s pass (the next retry
        or revisit due)."""
        idle_waits = self._link.idle_waits
        assert idle_waits is not None
        self.parked = True
        # a due time that came already: polled again at the flush pace, not in a busy loop
        self._park_until = now + max(until, self.config.flush_interval)
        self._next_idle_reap = now + IDLE_REAP_INTERVAL * (0.25 + 0.75 * random.random())
        if self._link.liveness is not None:
            self._link.liveness.idle(True)
        status = self._status
        claims = status.start_pending == 0 and not status.full() and not status.paused
        idle_waits.park(claims=claims)

    def unpark(self, now: float) -> None:
        """Back to polling: the next lease now. A BLMOVE still waiting goes on until it
        returns (``claims_waiting``), its entry handed over as any claim."""
        self.parked = False
        if self._link.liveness is not None:
            self._link.liveness.idle(False)
        if self._link.idle_waits is not None:
            self._link.idle_waits.unpark()
        self._polling.lease_now(now)

    def over(self, now: float, *, idle: bool) -> bool:
        """Whether a parked worker goes back to polling: something here needs Redis (a
        request to push, a pause, a close: not ``idle``), or the lease reply's next due time
        came."""
        return not idle or now >= self._park_until

    def reap_due(self, now: float) -> bool:
        """Whether this parked worker stands in this batch for the look for dead workers'
        work (then due again in an interval)."""
        if now >= self._next_idle_reap:
            self._next_idle_reap = now + IDLE_REAP_INTERVAL
            return True
        return False

    def take_woken(self) -> bool:
        """Whether a wait woke this worker since its last lease (its next lease asks every
        shard); forgotten once read."""
        woken, self._woken = self._woken, False
        return woken

    def claims_waiting(self) -> bool:
        """Whether a parked worker's BLMOVE may still move a start URL into this worker's
        claim list (idle.py): claim.lua, which hands out what the list holds, and the give
        back of the list wait until it returned, or the entry would be handed out twice."""
        return self._link.idle_waits is not None and self._link.idle_waits.claiming

    def end_claims(self) -> None:
        """End a BLMOVE that may still move an entry into the claim list (a pause)."""
        assert self._link.idle_waits is not None
        self._link.idle_waits.end_claims()

    def woke(self, kind: str, value: Any, now: float) -> None:
        """A parked worker's wait returned (handed on by the pump from idle.py's threads): a
        start URL it moved into this worker's claim list, a wake-up token, or an error."""
        if kind == "claimed":
            self.claims_empty = False
            # in the claim list already: the next claim (claim.lua) hands it out with what
            # followed it, and the generation read after it says whether the crawl it came
            # from is still the one this worker joined (layout.py)
            self._polling.peek_now(now)
        elif kind == "failed":
            # the claim list may hold an entry whose reply was lost: the next claim hands
            # it out; and an unreachable Redis is the polls' to report
            logger.debug("idle wait failed: %r", value, extra={"spider": self.spider})
        if kind != "failed":
            self._report.inc("distcrawl/idle/woken")
        if self.parked:
            self.unpark(now)
            self._woken = True
        else:
            self._polling.lease_now(now)
