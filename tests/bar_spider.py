"""``scrapy crawl barsite``: the ``site`` spider under another name, for a crawl that a
Celery app outside the project feeds (tests/test_celery.py): that app has no spider named
``barsite`` to import, the workers do (``SPIDER_MODULES=distcrawl.spiders,tests.bar_spider``)."""

from __future__ import annotations

from distcrawl.spiders.site import SiteSpider


class BarSiteSpider(SiteSpider):
    name = "barsite"
