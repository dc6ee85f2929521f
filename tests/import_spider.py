"""The scrapy-redis baseline spider after its migration (``-s
SPIDER_MODULES=tests.import_spider``): the same name, ``srsite``, so that it continues the
crawl of ``benchmarks.spiders.ScrapyRedisSiteSpider``, and the same parsing, now on
distcrawl's frontier."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from scrapy.http import Response

from benchmarks.spiders import SPIDER_NAME
from distcrawl.spiders.site import SiteSpider


class MigratedSiteSpider(SiteSpider):
    name = SPIDER_NAME

    def parse_item(self, response: Response) -> Iterator[Any]:
        """A callback the old spider's requests may name, refused by SiteSpider's
        DISTCRAWL_ALLOWED_CALLBACKS until a setting allows it."""
        yield from self.parse(response)
