"""The pieces of Scrapy's engine that distcrawl relies on, kept in one place.

Scrapy has no signal for "this request is completely done" (downloaded, its callback
finished, and every request and item it produced handed on), which is exactly when a
lease may be acknowledged. The engine tracks that set itself (``_slot.inprogress``: a
request enters it when its download starts and leaves it after the scraper is done with
it). Likewise there is no public way to ask the engine to look at the scheduler again when
work arrives from Redis. Both are checked once when the scheduler opens, so a Scrapy release
that renames them fails loudly at start-up instead of losing requests silently. Nor is
there a public way to ask whether the crawl is closing, which the MongoDB pipeline must know
to stop waiting for MongoDB and spill what it holds.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler


class EngineIncompatible(RuntimeError):
    """Raised at open when the running Scrapy lacks an engine internal distcrawl relies on:
    better no crawl than one that acknowledges leases at the wrong time."""


def _slot(crawler: Crawler) -> Any:
    engine = crawler.engine
    return getattr(engine, "_slot", None) if engine is not None else None


def check(crawler: Crawler) -> None:
    slot = _slot(crawler)
    if (
        slot is None
        or not isinstance(getattr(slot, "inprogress", None), set)
        or not hasattr(getattr(slot, "nextcall", None), "schedule")
    ):
        raise EngineIncompatible(
            "this Scrapy version's engine does not expose _slot.inprogress and "
            "_slot.nextcall; distcrawl cannot tell when a request is done"
        )


def local_delays_off(crawler: Crawler) -> None:
    """distcrawl spaces a slot's requests for the whole cluster when it leases them, so
    the downloader's own per-process DOWNLOAD_DELAY (and DOWNLOAD_SLOTS delays) would only
    add a second wait on top: set them to 0 in this process."""
    engine = crawler.engine
    downloader = getattr(engine, "downloader", None) if engine is not None else None
    if downloader is None or not hasattr(downloader, "_delay"):
        raise EngineIncompatible("this Scrapy version's downloader has no _delay")
    downloader._delay = 0.0
    downloader.per_slot_settings = {
        slot: {**values, "delay": 0.0}
        for slot, values in getattr(downloader, "per_slot_settings", {}).items()
    }
    for slot in getattr(downloader, "slots", {}).values():
        slot.delay = 0.0


def in_progress(crawler: Crawler) -> Collection[Request]:
    slot = _slot(crawler)
    return slot.inprogress if slot is not None else ()


def stop_waiting(crawler: Crawler) -> bool:
    """Make a closing engine stop waiting for the requests it has in progress (a drain that
    ended early, distcrawl/engine/drain.py): its close goes on now. Downloads still running
    end later, or never: the engine's bookkeeping then finds nothing to remove, where a
    plain set would raise. False when the engine is gone or not closing."""
    slot = _slot(crawler)
    if slot is None or getattr(slot, "closing", None) is None:
        return False
    slot.inprogress = _Abandoned()
    slot._maybe_fire_closing()
    return True


class _Abandoned(set):  # type: ignore[type-arg]
    """An engine's set of requests in progress once a drain stopped waiting for them."""

    def remove(self, element: Any) -> None:
        self.discard(element)


def wake(crawler: Crawler) -> None:
    slot = _slot(crawler)
    if slot is not None:
        slot.nextcall.schedule()


def closing(crawler: Crawler) -> bool:
    """Whether the crawl is on its way out, whichever way it was stopped; an engine this
    cannot read counts as closing, so that a pipeline waiting on it never waits forever."""
    try:
        engine = crawler.engine
    except (AttributeError, RuntimeError):  # not started, or already gone
        return True
    if engine is None or not getattr(engine, "running", True):
        return True  # engine.stop(): SIGTERM, crawler.stop()
    # close_spider() (idle timeout, CLOSESPIDER_*): Scrapy sets _slot.closing
    slot = getattr(engine, "_slot", None)
    return slot is None or getattr(slot, "closing", None) is not None


def exit_failed(crawler: Crawler) -> None:
    """Make ``scrapy crawl`` exit non-zero although the crawl closes cleanly.

    A crawl that cannot start (no add-on, a REDIS_URL no retry can mend) is closed with one
    log line rather than an exception, which Scrapy would log again with a traceback from
    each component it then fails to close. Scrapy sets the exit code 1 only when a crawl's
    bootstrap failed, which it reads as "the crawler has no spider once the crawl ended"
    (``CrawlerRunnerBase._crawl``/``AsyncCrawlerRunner._done``); the spider is let go once it
    is closed, so a supervisor (systemd, Kubernetes, Scrapyd) sees the worker failed.
    """
    from scrapy import signals

    def closed(spider: Any, reason: str) -> None:
        crawler.spider = None

    crawler.signals.connect(closed, signal=signals.spider_closed, weak=False)


def close_spider(crawler: Crawler, reason: str) -> None:
    """Close the crawl with ``reason``, as a CLOSESPIDER_* limit does."""
    from scrapy.utils.defer import deferred_from_coro

    engine = crawler.engine
    if engine is not None and engine.spider is not None:
        deferred_from_coro(engine.close_spider_async(reason=reason))
