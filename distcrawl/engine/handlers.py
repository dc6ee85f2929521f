"""The scheduler's handlers of the engine's signals, and the idle clock they close by.

The engine tells the scheduler what happens to requests after it handed them out (reached
the downloader, answered, left it) and when the spider has nothing to do; each of these can
make a batch worth sending now, and the idle one decides whether the worker may close: only
once the whole shared frontier, not just this worker, is out of work. How long this worker has
had none, and what the last look at the whole frontier saw, is the idle clock's (``IdleClock``):
Scrapy's calls and the pump tell it of work, the idle handler reads it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider, signals
from scrapy.exceptions import DontCloseSpider

from distcrawl.engine import _engine
from distcrawl.engine.idle import IDLE_REAP_INTERVAL

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from distcrawl.engine.parts import Parts
    from distcrawl.engine.pump import Pump
    from distcrawl.model.replies import Drained

#: the scheduler's logger: these are its messages, filtered and configured as such
logger = logging.getLogger("distcrawl.scheduler")

#: how old (s) the last look at the whole frontier may be for an idle worker to close
DRAIN_CHECK_MAX_AGE = 0.5


class IdleClock:
    """When this worker last had work, and the last look at the whole frontier: what the
    spider_idle handler closes the worker by (DISTCRAWL_IDLE_TIMEOUT)."""

    def __init__(self) -> None:
        self.last_work = time.monotonic()
        #: whether the crawl has had work since this worker joined it (or, read from Redis,
        #: before): the idle clock (DISTCRAWL_IDLE_TIMEOUT) runs only from then on
        self.had_work = False
        #: the "No work yet" line was logged
        self.noted_no_work = False
        #: the last look at the whole frontier (monotonic time, what it saw), for idle close
        self.drained: tuple[float, Drained] | None = None
        #: the next batch looks at the whole frontier (Batch.drain)
        self.drain_wanted = False

    def worked(self) -> None:
        """This worker had work just now (a request pushed, handed out, leased or read from
        start_urls): the idle clock starts again."""
        self.last_work = time.monotonic()
        self.had_work = True


class SignalHandlers:
    """The handlers of the engine's signals (see the module docstring); ``connect`` connects
    them when the scheduler opens."""

    def __init__(
        self,
        crawler: Crawler,
        parts: Parts,
        *,
        start_urls: str,
        pump: Pump,
    ) -> None:
        self.crawler = crawler
        self.config = parts.config
        #: the crawl's start_urls key, named in the "No work yet" line
        self._start_urls = start_urls
        self._p = parts
        self._pump = pump

    def connect(self) -> None:
        """Have the engine's signals call these handlers (the signal manager holds them
        weakly: the scheduler keeps this object)."""
        connect = self.crawler.signals.connect
        connect(self.on_idle, signal=signals.spider_idle)
        connect(self.on_downloading, signal=signals.request_reached_downloader)
        # response_downloaded, not response_received: a 429 that the retry middleware turns
        # into a retry never reaches the engine as a response, and it is the one to report
        connect(self.on_response, signal=signals.response_downloaded)
        connect(self.on_left, signal=signals.request_left_downloader)

    def on_idle(self, spider: Spider) -> None:
        timeout = self.config.idle_timeout
        self._look_for_the_finish()
        if (
            timeout is None
            or self._pump.busy
            or self._p.outage.failing  # cannot tell whether the shared queue is empty
            or self._p.status.paused
            or self._p.status.pending()
            or self._p.leases.active
        ):
            raise DontCloseSpider
        clock = self._p.idle_clock
        now = time.monotonic()
        if not clock.had_work and not self._crawl_had_work(now, spider):
            raise DontCloseSpider
        idle_for = now - clock.last_work
        if idle_for < timeout:
            raise DontCloseSpider
        # the whole crawl must be out of work, not only this worker: a start URL pushed a
        # moment ago, a retry coming due, another worker's lease that may still produce
        # requests or be given back
        look = clock.drained
        if look is None or now - look[0] > DRAIN_CHECK_MAX_AGE or look[0] < clock.last_work:
            clock.drain_wanted = True
            self._pump.kick()
            raise DontCloseSpider
        if not look[1].idle(int(timeout * 1000)):
            clock.drained = None
            clock.last_work = now  # there is work somewhere: wait a whole timeout again
            raise DontCloseSpider
        logger.info(
            "No work for %.1fs (DISTCRAWL_IDLE_TIMEOUT=%s) and the shared frontier is empty: "
            "closing",
            idle_for,
            timeout,
            extra={"spider": spider},
        )

    def _look_for_the_finish(self) -> None:
        """Once per idle spell, after this worker's last work: a look at the whole crawl,
        which finishes it (finish.lua) if nothing waits anywhere. The look after a worker's
        last commit (BatchBuilder._ran_dry) usually did it already; this one catches a last
        commit that left something held, whatever DISTCRAWL_IDLE_TIMEOUT is."""
        p = self._p
        if self._pump.busy or p.status.paused or p.status.pending() or p.leases.active:
            return
        clock = p.idle_clock
        look = clock.drained
        if look is None or look[0] < clock.last_work:
            clock.drain_wanted = True
            self._pump.kick()

    def _crawl_had_work(self, now: float, spider: Spider) -> bool:
        """Whether the crawl has had work, for a worker that had none yet: the idle clock
        starts only then. Workers are often started before the first push (scrapy-redis
        users start them, then push): one that closed before its crawl began would leave
        the crawl without workers. A crawl that had work before this worker came (its
        frontier numbered a request or holds dead letters) starts the clock at the worker's
        start, so a worker joining a finished crawl closes as before."""
        clock = self._p.idle_clock
        look = clock.drained
        if look is not None and look[1].worked:
            clock.had_work = True
            return True
        # parked (idle.py), work wakes it: a look at the whole frontier only now and then
        max_age = IDLE_REAP_INTERVAL if self._p.parking.parked else DRAIN_CHECK_MAX_AGE
        if look is None or now - look[0] > max_age:
            clock.drain_wanted = True  # read at most once per idle signal (about 5 s)
            self._pump.kick()
        if look is not None and not clock.noted_no_work:
            clock.noted_no_work = True
            logger.info(
                "No work yet: waiting for the first start URL in %s; the "
                "DISTCRAWL_IDLE_TIMEOUT=%s clock starts once the crawl has had work",
                self._start_urls,
                self.config.idle_timeout,
                extra={"spider": spider},
            )
        return False

    def on_downloading(self, request: Request, spider: Spider) -> None:
        if self._p.leases.downloading(request):
            self._pump.kick()  # before the slot's next turn, which this lag pushes back

    def on_left(self, request: Request, spider: Spider) -> None:
        swapped = self._p.leases.left(request)
        if swapped is None:
            return
        if swapped:
            _engine.wake(self.crawler)  # a reserve of its slot took its place
            return
        # off the site (answered or failed): its place in the slot is free for the next request
        # now, while its lease waits for what the page yields to be stored (the ack); and this
        # worker may take it in the same batch, not after the back-off of a lease that found
        # the slot full. At once only when this worker is short of work: otherwise the report
        # goes with the next turn (Leases.left)
        self._p.polling.place_freed()
        if self._p.leases.report_due(time.monotonic(), self.config.flush_interval):
            self._pump.kick()

    def on_response(self, response: Any, request: Request, spider: Spider) -> None:
        if self._p.outbox.feedback(request, response):
            self._p.report.inc("distcrawl/politeness/throttled")
            self._p.report.inc(f"distcrawl/politeness/throttled/{response.status}")
            hold = self._p.outbox.hold_of(request, response)
            if hold is not None:
                # before the request leaves the downloader (the next signal), whose place a
                # reserve of the slot would take at once
                self._pump.hold(hold, publish=True)
            # every worker must hold back from now on, not from this worker's next batch
            self._pump.kick()
