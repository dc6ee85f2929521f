"""The scrapy-redis baseline spider after its migration (``-s
SPIDER_MODULES=tests.import_spider``): the same name, ``srsite``, so that it continues the
crawl of ``benchmarks.spiders.ScrapyRedisSiteSpider``, and the same parsing, now on
distcrawl's frontier."""

from __future__ import annotations

from benchmarks.spiders import SPIDER_NAME
from distcrawl.spiders.site import SiteSpider


class MigratedSiteSpider(SiteSpider):
    name = SPIDER_NAME
