"""The scheduler's handlers of the engine's signals.

The engine tells the scheduler what happens to requests after it handed them out (reached
the downloader, answered, left it) and when the spider has nothing to do; each of these can
make a batch worth sending now, and the idle one decides whether the worker may close: only
once the whole shared frontier, not just this worker, is out of work.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scrapy import Request, Spider
from scrapy.exceptions import DontCloseSpider

from distcrawl.engine import _engine
from distcrawl.engine.idle import IDLE_REAP_INTERVAL
from distcrawl.engine.state import SchedulerState

#: the scheduler's logger: these are its messages, filtered and configured as such
logger = logging.getLogger("distcrawl.scheduler")

#: how old (s) the last look at the whole frontier may be for an idle worker to close
DRAIN_CHECK_MAX_AGE = 0.5


class SignalHandlers(SchedulerState):
    """The part of ``Scheduler`` that the engine's signals call (see the module docstring);
    ``Scheduler.open`` connects them."""

    def _on_idle(self, spider: Spider) -> None:
        timeout = self.config.idle_timeout
        if (
            timeout is None
            or self._busy
            or self._outage.failing  # cannot tell whether the shared queue is empty
            or self._paused
            or self.has_pending_requests()
            or self._leases.active
        ):
            raise DontCloseSpider
        now = time.monotonic()
        if not self._had_work and not self._crawl_had_work(now, spider):
            raise DontCloseSpider
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

    def _crawl_had_work(self, now: float, spider: Spider) -> bool:
        """Whether the crawl has had work, for a worker that had none yet: the idle clock
        starts only then. Workers are often started before the first push (scrapy-redis
        users start them, then push): one that closed before its crawl began would leave
        the crawl without workers. A crawl that had work before this worker came (its
        frontier numbered a request or holds dead letters) starts the clock at the worker's
        start, so a worker joining a finished crawl closes as before."""
        look = self._drained
        if look is not None and look[1].worked:
            self._had_work = True
            return True
        # parked (idle.py), work wakes it: a look at the whole frontier only now and then
        max_age = IDLE_REAP_INTERVAL if self._parked else DRAIN_CHECK_MAX_AGE
        if look is None or now - look[0] > max_age:
            self._drain_wanted = True  # read at most once per idle signal (about 5 s)
            self._kick()
        if look is not None and not self._noted_no_work:
            self._noted_no_work = True
            assert self.keys is not None
            logger.info(
                "No work yet: waiting for the first start URL in %s; the "
                "DISTCRAWL_IDLE_TIMEOUT=%s clock starts once the crawl has had work",
                self.keys.start_urls,
                self.config.idle_timeout,
                extra={"spider": spider},
            )
        return False

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
