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

from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request, Spider
from scrapy.spiders import CrawlSpider

from distcrawl.start_urls import request_from_entry


class RedisMixin:
    """What both spiders share: start URLs queued through the frontier, deduplicated, and
    ``make_request_from_data`` as the one hook for entries pushed by producers."""

    start_urls: list[str]

    async def start(self) -> AsyncIterator[Any]:
        urls = getattr(self, "start_urls", ())
        if isinstance(urls, str):  # `scrapy crawl NAME -a start_urls=URL,URL`
            urls = [u.strip() for u in urls.split(",") if u.strip()]
        for url in urls:
            yield self.make_request_from_data({"url": url})

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
