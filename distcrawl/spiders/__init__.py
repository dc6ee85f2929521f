"""Spiders fed by the shared frontier.

``RedisSpider`` and ``RedisCrawlSpider`` behave like Scrapy's ``Spider`` and ``CrawlSpider``
with two differences that matter when many workers share one crawl:

- entries pushed to ``<name>:start_urls`` are read by the scheduler, on start and whenever
  the worker is idle, and become requests through :meth:`make_request_from_data`;
- ``start_urls`` defined on the class are queued like discovered links (deduplicated), not
  with ``dont_filter`` as Scrapy does, so that ten workers starting do not crawl them ten
  times.

An idle worker stays up waiting for work unless ``DISTCRAWL_IDLE_TIMEOUT`` is set.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request, Spider
from scrapy.exceptions import CloseSpider
from scrapy.spiders import CrawlSpider
from scrapy.utils.misc import load_object

from distcrawl.codec.start_urls import InvalidEntry, request_from_entry, validate_url
from distcrawl.config import DistcrawlConfig
from distcrawl.engine import _engine

logger = logging.getLogger(__name__)

#: the close reason of a spider run without distcrawl's scheduler
NO_ADDON = "distcrawl_addon_missing"


class RedisMixin:
    """What both spiders share: start URLs queued through the frontier, deduplicated, and
    ``make_request_from_data`` as the one hook for entries pushed by producers."""

    start_urls: list[str]

    async def start(self) -> AsyncIterator[Any]:
        urls = getattr(self, "start_urls", ())
        if isinstance(urls, str):  # `scrapy crawl NAME -a start_urls=URL,URL`
            urls = [u.strip() for u in urls.split(",") if u.strip()]
        self._check_scheduler(own_start_urls=bool(urls))
        crawler = getattr(self, "crawler", None)
        schemes = (
            DistcrawlConfig.from_settings(crawler.settings).allowed_schemes
            if crawler is not None
            else DistcrawlConfig.allowed_schemes
        )
        for url in urls:
            try:
                # the checks a pushed entry passes (start_urls.parse_entry), then the hook
                request = self.make_request_from_data({"url": validate_url(str(url), schemes)})
            except Exception as exc:  # one bad URL must not stop the others
                self._bad_start_url(url, exc)
                continue
            yield request

    def _bad_start_url(self, url: Any, exc: Exception) -> None:
        from distcrawl.scheduler import scheduler_of

        reason = str(exc) if isinstance(exc, InvalidEntry) else f"{type(exc).__name__}: {exc}"
        crawler = getattr(self, "crawler", None)
        scheduler = scheduler_of(crawler) if crawler is not None else None
        if scheduler is None:  # checked at start: only a spider run outside a crawl
            raise exc
        scheduler.dead_letter_start(str(url), reason)

    def _check_scheduler(self, own_start_urls: bool) -> None:
        """Refuse to run without distcrawl's scheduler when the spider has no start URL of
        its own: Scrapy's own scheduler never reads ``<name>:start_urls``, so the crawl would
        close ``finished`` at once, 0 pages, exit 0, the pushed URLs left in Redis, and
        nothing said. A spider given start URLs (``-a start_urls=...`` or the class's) is a
        plain Scrapy crawl of them, which runs, with a warning that Redis is not read.
        Checked here (the engine is open) and not in ``from_crawler``, because add-ons are
        applied after the spider is made."""
        from distcrawl.scheduler import Scheduler

        crawler = getattr(self, "crawler", None)
        if crawler is None:
            return
        path = crawler.settings["SCHEDULER"]
        cls = load_object(path) if isinstance(path, str) else path
        # by the MRO: Scrapy's BaseScheduler makes issubclass() true for any class that has
        # the scheduler's methods, Scrapy's own scheduler included
        if isinstance(cls, type) and Scheduler in cls.__mro__:
            return
        name = getattr(self, "name", "?")
        if own_start_urls:
            logger.warning(
                "%s %r runs without distcrawl's add-on (SCHEDULER is %s): a plain Scrapy crawl "
                "of its own start URLs; %s:start_urls in Redis is not read and nothing is shared "
                'with other workers (ADDONS = {"distcrawl.Addon": 0} turns distcrawl on)',
                type(self).__name__,
                name,
                path if isinstance(path, str) else getattr(path, "__qualname__", path),
                name,
                extra={"spider": self},
            )
            return
        logger.error(
            "%s %r needs distcrawl's add-on, which is not enabled: add "
            'ADDONS = {"distcrawl.Addon": 0} to the project\'s settings.py (SCHEDULER is %s, '
            "which never reads %s:start_urls from Redis); the crawl stops",
            type(self).__name__,
            name,
            path if isinstance(path, str) else getattr(path, "__qualname__", path),
            name,
            extra={"spider": self},
        )
        _engine.exit_failed(crawler)
        raise CloseSpider(NO_ADDON)

    def make_request_from_data(self, data: dict[str, Any]) -> Request:
        """Build the request for one ``start_urls`` entry.

        ``data`` holds Request arguments already validated: ``url`` and optionally
        ``priority``, ``meta``, ``method``, ``headers``, ``body`` and ``dont_filter``; the
        meta keys Scrapy or distcrawl act on, and ``dont_filter``, were already refused unless
        DISTCRAWL_START_META_KEYS names them (``parse_entry``), so an override need not check.
        Override it to add spider-specific meta or a callback.
        """
        return request_from_entry(data)


class RedisSpider(RedisMixin, Spider):
    """Scrapy's ``Spider`` fed by ``<name>:start_urls``: the name scrapy-redis users know,
    so a spider moves over by changing its import."""


class RedisCrawlSpider(RedisMixin, CrawlSpider):
    """Scrapy's ``CrawlSpider`` (rules, link extractors) fed by ``<name>:start_urls``."""
