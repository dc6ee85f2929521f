"""A spider for worker-process tests (``-s SPIDER_MODULES=distcrawl.spiders,tests.meta_spider``)
that shows in its log what meta its callback received."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from scrapy.http import Response

from distcrawl.spiders.site import SiteSpider

#: the meta keys the callback logs
ECHOED = ("tag", "download_timeout")


class MetaEchoSpider(SiteSpider):
    name = "meta_echo"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        shown = {key: response.meta.get(key) for key in ECHOED}
        self.logger.info("meta of %s: %s", response.url, json.dumps(shown, sort_keys=True))
        yield from ()
