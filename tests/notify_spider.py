"""``scrapy crawl notify``: the ``site`` spider, but every tenth page's item is one MongoDB
refuses (a top-level ``$`` field), so that it is dead-lettered (tests/test_celery.py)."""

from __future__ import annotations

from typing import Any

from itemadapter import ItemAdapter
from scrapy.http import TextResponse

from distcrawl.spiders.site import SiteSpider

#: pages /page/N with N % 10 == REFUSED_EVERY_3 make a refused item
REFUSED_REMAINDER = 3


def refused(path: str) -> bool:
    tail = path.rsplit("/", 1)[-1]
    return path.startswith("/page/") and tail.isdigit() and int(tail) % 10 == REFUSED_REMAINDER


class NotifySpider(SiteSpider):
    name = "notify"

    def page_item(self, response: TextResponse, links: list[str]) -> Any:
        item = super().page_item(response, links)
        path = "/" + response.url.split("/", 3)[-1] if response.url.count("/") >= 3 else "/"
        if refused(path):
            return {**ItemAdapter(item).asdict(), "$refused": 1}
        return item
