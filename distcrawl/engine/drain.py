"""A clean drain on SIGTERM (what Kubernetes, Scrapyd's cancel and ``kill`` send).

Scrapy's own first SIGTERM (or Ctrl-C) stops the crawl gracefully: the engine starts no new
request and waits, without a bound, for those it has; only then does the scheduler close and
give back what this worker leased and never started. Other workers wait for that give-back
as long as the slowest download lasts, and a pod's grace period may end first (SIGKILL: the
leases then wait for their timeout or the reaper).

This module keeps Scrapy's handling and adds what a worker sharing a frontier needs:

1. first signal: the scheduler drains (``Scheduler.drain``): it leases and claims nothing
   more and gives every leased request the engine has not started, and its claimed start
   URLs, back at once, waking parked workers for them (another worker fetches them within a
   second, not after a lease timeout); then Scrapy's own graceful stop runs: the requests
   in progress finish, their pages and items are stored and acknowledged as usual;
2. ``DISTCRAWL_DRAIN_TIMEOUT`` seconds later, or at a second signal: the engine stops
   waiting for the requests still in progress; the scheduler's close gives their leases
   back at once (they are fetched again elsewhere: a page in progress is never lost), and
   the worker exits 0;
3. a third signal: Scrapy's forced stop (the reactor stops; leases wait for the reaper).

Only Scrapy's own handlers are wrapped (``scrapy crawl``, Scrapyd's jobs): a program that
runs crawlers under its own signal handling (``CrawlerRunner``) keeps it untouched.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import TYPE_CHECKING, Any, Protocol

from scrapy import signals
from twisted.internet import reactor as _reactor

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    from scrapy.crawler import Crawler
    from twisted.internet.base import DelayedCall

logger = logging.getLogger(__name__)
#: zope interfaces confuse mypy about callLater's and callFromThread's signatures
reactor: Any = _reactor

#: the signals Scrapy stops a crawl on and the drain takes over (SIGBREAK is Windows')
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Drainable(Protocol):
    """What the drain asks of the scheduler."""

    def drain(self) -> int: ...

    def stop_waiting(self) -> int: ...


class Drain:
    """One crawler's drain: begun at the first signal, ended by the timeout or the second."""

    def __init__(self, crawler: Crawler, scheduler: Drainable, timeout: float) -> None:
        self.crawler = crawler
        self.scheduler = scheduler
        self.timeout = timeout
        self.began = False
        self.ended = False
        self._timer: DelayedCall | None = None
        crawler.signals.connect(self._engine_started, signal=signals.engine_started)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)

    def _engine_started(self) -> None:
        # Scrapy installs its handlers once the reactor runs ("after startup"): a call
        # queued now runs after that, whichever comes first
        reactor.callLater(0, _HANDLERS.add, self)

    def _spider_closed(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        _HANDLERS.discard(self)

    def begin(self, signame: str) -> None:
        if self.began:
            return
        self.began = True
        given = self.scheduler.drain()
        logger.info(
            "%s: draining: no new request is leased, %d leased and not started are given "
            "back now; those in progress may finish within DISTCRAWL_DRAIN_TIMEOUT (%gs). "
            "Send it again to give them back at once",
            signame,
            given,
            self.timeout,
            extra={"spider": self.crawler.spider},
        )
        self._timer = reactor.callLater(self.timeout, self.end, "DISTCRAWL_DRAIN_TIMEOUT")

    def end(self, why: str) -> None:
        """Stop waiting for the requests in progress: the engine closes now, and the
        scheduler's close gives their leases back."""
        if self.ended or not self.began:
            return
        self.ended = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        abandoned = self.scheduler.stop_waiting()
        if abandoned:
            logger.warning(
                "Drain ended by %s: %d request(s) still in progress are given back for "
                "another worker to fetch",
                why,
                abandoned,
                extra={"spider": self.crawler.spider},
            )


class _Handlers:
    """The process's signal handlers while distcrawl crawlers run: one set for every
    crawler of the process, as Scrapy's are."""

    def __init__(self) -> None:
        self.drains: list[Drain] = []
        self.received = 0
        #: Scrapy's handlers: its graceful stop, then its forced one
        self._scrapy: Callable[[int, FrameType | None], Any] | None = None

    def add(self, drain: Drain) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self._scrapy is None:
            current = signal.getsignal(signal.SIGTERM)
            if getattr(current, "__name__", "") != "_signal_shutdown" or not callable(current):
                return  # not Scrapy's: whoever runs this crawler handles signals
            self._scrapy = current
            self._install()
        self.drains.append(drain)

    def discard(self, drain: Drain) -> None:
        if drain in self.drains:
            self.drains.remove(drain)

    def _install(self) -> None:
        for signum in SIGNALS:
            signal.signal(signum, self._received)

    def _received(self, signum: int, frame: FrameType | None) -> None:
        # a signal handler runs between two bytecodes of whatever the main thread was
        # doing: the work (and the logging) is handed to the reactor
        self.received += 1
        name = signal.Signals(signum).name
        drains = list(self.drains)
        if self.received == 1:
            for drain in drains:
                reactor.callFromThread(drain.begin, name)
        elif self.received == 2:
            for drain in drains:
                reactor.callFromThread(drain.end, f"a second {name}")
            return
        scrapy = self._scrapy
        if scrapy is not None:
            # Scrapy's graceful stop of every crawler of the process (it installs its forced
            # stop for the next signal: kept for the third, ours for the second)
            scrapy(signum, frame)
            if self.received == 1:
                self._scrapy = signal.getsignal(signal.SIGTERM)  # type: ignore[assignment]
                self._install()


_HANDLERS = _Handlers()
