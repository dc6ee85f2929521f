"""The scrapy-redis 0.9.1 baseline: ``scrapy crawl srsite`` with scrapy-redis' own classes.

The comparison is only fair if both crawlers do the same work per page, so the parsing is
not rewritten here: ``parse``, ``page_item`` and ``_scope`` are the very functions of
:class:`distcrawl.spiders.site.SiteSpider` (same link extraction, same scope, one item per
page). Only the frontier differs: scrapy-redis' ``RedisSpider`` reads
``srsite:start_urls`` on the ``spider_idle`` heartbeat, and its scheduler and dupefilter
(set on the command line by the benchmark) keep the queue and seen-set in Redis.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.linkextractors import LinkExtractor
from scrapy_redis.spiders import RedisSpider

from distcrawl.spiders.site import SCOPE_META, SiteSpider

SPIDER_NAME = "srsite"


class ScrapyRedisSiteSpider(RedisSpider):
    """``SiteSpider``'s parsing on scrapy-redis' frontier."""

    name = SPIDER_NAME
    custom_settings = {"ROBOTSTXT_OBEY": True}

    parse = SiteSpider.parse
    page_item = SiteSpider.page_item
    _scope = SiteSpider._scope

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.link_extractor = LinkExtractor()

    def make_request_from_data(self, data: bytes | str) -> Request:
        """A plain URL entry, scoped to its host like ``SiteSpider`` does.

        ``dont_filter=True`` is what scrapy-redis itself does for a plain-URL entry; building
        the request here only skips its deprecation warning and adds the scope meta.
        """
        url = data.decode(self.redis_encoding or "utf-8") if isinstance(data, bytes) else data
        host = (urlsplit(url).hostname or "").lower()
        return Request(url.strip(), dont_filter=True, meta={SCOPE_META: host})
