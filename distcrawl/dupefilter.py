"""Duplicate filtering against the shared seen-set (DUPEFILTER_CLASS).

The authoritative check happens in Redis, inside ``commit.lua``, atomically with the push,
so that two workers discovering the same link at once still queue it once. This class
supplies what that check needs (compact fingerprints from ``crawler.request_fingerprinter``)
and keeps a bounded local memory of what this worker already pushed, so that the ~17 links
per page that point to already-queued pages mostly never cost a byte of Redis traffic.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

from scrapy import Request, Spider
from scrapy.dupefilters import BaseDupeFilter

from distcrawl.config import DistcrawlConfig

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.utils.request import RequestFingerprinterProtocol

logger = logging.getLogger(__name__)

#: bytes of the fingerprint kept in the seen-set; 128 bits make a collision negligible
#: even at billions of URLs, and a 16-byte string fits Redis' smallest string allocation.
FINGERPRINT_BYTES = 16


class RedisDupeFilter(BaseDupeFilter):
    def __init__(
        self,
        fingerprinter: RequestFingerprinterProtocol,
        *,
        local_cache: int = 100_000,
        debug: bool = False,
        crawler: Crawler | None = None,
    ) -> None:
        self.fingerprinter = fingerprinter
        self.local_cache = max(0, local_cache)
        self.debug = debug
        self.crawler = crawler
        self._recent: OrderedDict[bytes, None] = OrderedDict()
        self._logged_first = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisDupeFilter:
        config = DistcrawlConfig.from_settings(crawler.settings)
        return cls(
            crawler.request_fingerprinter,
            local_cache=config.local_seen_cache,
            debug=crawler.settings.getbool("DUPEFILTER_DEBUG"),
            crawler=crawler,
        )

    def fingerprint(self, request: Request) -> bytes:
        return self.fingerprinter.fingerprint(request)[:FINGERPRINT_BYTES]

    def request_seen(self, request: Request) -> bool:
        """True if this worker already pushed the request; the shared check is in Redis."""
        return self.seen_locally(self.fingerprint(request))

    def seen_locally(self, fp: bytes) -> bool:
        if fp in self._recent:
            self._recent.move_to_end(fp)
            return True
        if self.local_cache:
            self._recent[fp] = None
            if len(self._recent) > self.local_cache:
                self._recent.popitem(last=False)
        return False

    def log(self, request: Request, spider: Spider) -> None:
        if self.debug:
            logger.debug(
                "Filtered duplicate request: %(request)s",
                {"request": request},
                extra={"spider": spider},
            )
        elif not self._logged_first:
            logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be shown"
                " (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
                extra={"spider": spider},
            )
            self._logged_first = True
        if self.crawler is not None and self.crawler.stats is not None:
            self.crawler.stats.inc_value("dupefilter/filtered")

    def close(self, reason: str) -> None:
        self._recent.clear()
