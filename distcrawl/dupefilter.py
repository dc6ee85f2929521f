"""Duplicate filtering against the shared seen-set (DUPEFILTER_CLASS).

The authoritative check happens in Redis, inside ``commit.lua``, atomically with the push,
so that two workers discovering the same link at once still queue it once. This class
supplies what that check needs (compact fingerprints from ``crawler.request_fingerprinter``)
and keeps a bounded local memory of what this worker already pushed, so that the ~17 links
per page that point to already-queued pages mostly never cost a byte of Redis traffic.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING

from scrapy import Request, Spider
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.python import to_unicode
from scrapy.utils.request import RequestFingerprinter, referer_str
from scrapy.utils.request import fingerprint as scrapy_fingerprint
from w3lib.url import canonicalize_url

from distcrawl.config import DistcrawlConfig

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.utils.request import RequestFingerprinterProtocol

logger = logging.getLogger(__name__)

#: bytes of the fingerprint kept in the seen-set. 96 bits of SHA1 are still safe: a new URL
#: is wrongly skipped only if its fingerprint equals one of the n already stored, probability
#: n / 2^96, about 1e-20 per URL at a billion URLs, so even a crawl of 1e9 URLs expects to
#: lose 1e9 * 1e9 / 2^97 ~ 6e-12 of them. Stored in a SET, 12 bytes fit Redis' 16-byte
#: allocation (1-byte header, NUL) where 16 bytes needed 24: 48 instead of 64 bytes per URL
#: measured at 1e6 URLs. The Bloom filter takes its two 48-bit hashes from these 12 bytes.
FINGERPRINT_BYTES = 12
#: seconds between two flushes of the duplicate count to the stats
STATS_FLUSH_INTERVAL = 1.0
#: URLs whose default fingerprint is remembered (about 200 bytes each): a site's menus and
#: footers link to the same few pages from every page
URL_MEMO_SIZE = 10_000
#: the JSON that Scrapy's ``fingerprint`` hashes for a GET without a body (``json.dumps`` of
#: its dict with ``sort_keys=True``), the canonical URL left to fill in
_GET_FINGERPRINT_JSON = '{"body": "", "headers": {}, "method": "GET", "url": %s}'


class RedisDupeFilter(BaseDupeFilter):
    """``DUPEFILTER_CLASS`` of a distcrawl worker: a cheap local first look, not the verdict.

    ``request_seen`` answers from this worker's bounded memory only, so most duplicate links
    cost no Redis traffic; a link it has not seen goes on to the scheduler, and the shared
    seen-set decides in ``commit.lua``, atomically with the push. It keeps Scrapy's
    ``dupefilter/filtered`` stat and ``DUPEFILTER_DEBUG`` logging, so a project reads it as
    it reads Scrapy's ``RFPDupeFilter``.
    """

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
        #: URL -> fingerprint of plain GETs, when the fingerprint is a function of the URL
        #: alone (Scrapy's default fingerprinter): most links of a page were seen before,
        #: and fingerprinting each new Request object again (canonicalize_url, JSON, SHA1,
        #: ~15 us) was the largest per-link cost in profiles
        self._url_memo: dict[str, bytes] | None = {} if url_only(fingerprinter) else None
        self._logged_first = False
        # counted here and added to the stats at most once a second: inc_value per duplicate
        # link (~17 per page) showed in profiles
        self._filtered = 0
        self._flushed_at = time.monotonic()

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
        memo = self._url_memo
        if memo is None or request.method != "GET" or request.body:
            return self.fingerprinter.fingerprint(request)[:FINGERPRINT_BYTES]
        if request.meta.get("verbatim_url"):
            return self.fingerprinter.fingerprint(request)[:FINGERPRINT_BYTES]
        url = request.url
        fp = memo.get(url)
        if fp is None:
            fp = self.fingerprinter.fingerprint(request)[:FINGERPRINT_BYTES]
            if len(memo) >= URL_MEMO_SIZE:
                del memo[next(iter(memo))]  # the oldest: cheaper than keeping an LRU order
            memo[url] = fp
        return fp

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

    def forget(self) -> None:
        """Forget what this worker pushed: the frontier was reset, and the URLs of the old
        crawl are new to the next one (the URL memo stays: a fingerprint is a function of
        its URL)."""
        self._recent.clear()

    def log(self, request: Request, spider: Spider) -> None:
        """Scrapy's RFPDupeFilter.log, for duplicates caught here and in Redis alike."""
        if self.debug:
            logger.debug(
                "Filtered duplicate request: %(request)s (referer: %(referer)s)",
                {"request": request, "referer": referer_str(request)},
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
        self.count(1)

    def count(self, duplicates: int) -> None:
        """Count duplicates in ``dupefilter/filtered`` (added to the stats at most once a
        second)."""
        self._filtered += duplicates
        self.flush_stats_if_due()

    def flush_stats_if_due(self) -> None:
        """Also called by the scheduler's loop, so the stat does not lag behind for long
        once duplicates stop coming."""
        if self._filtered and time.monotonic() - self._flushed_at >= STATS_FLUSH_INTERVAL:
            self.flush_stats()

    def flush_stats(self) -> None:
        """Add the duplicates counted since the last flush to ``dupefilter/filtered``."""
        self._flushed_at = time.monotonic()
        count, self._filtered = self._filtered, 0
        if count and self.crawler is not None and self.crawler.stats is not None:
            self.crawler.stats.inc_value("dupefilter/filtered", count)

    def close(self, reason: str) -> None:
        self.flush_stats()
        self._recent.clear()
        if self._url_memo is not None:
            self._url_memo.clear()


def url_only(fingerprinter: object) -> bool:
    """Whether a GET's fingerprint depends on its URL alone: Scrapy's own fingerprinter
    computing Scrapy's fingerprint (method, canonical URL, body; no headers), not a subclass
    or a REQUEST_FINGERPRINTER_CLASS of the project, which may look at anything."""
    return (
        type(fingerprinter) is RequestFingerprinter
        and getattr(fingerprinter, "_fingerprint", None) is scrapy_fingerprint
    )


def get_fingerprint(url: str) -> bytes:
    """Scrapy's fingerprint of a plain GET of ``url`` (no body, no ``verbatim_url``), for
    fingerprinters for which :func:`url_only` holds; not truncated.

    The same bytes as ``fingerprinter.fingerprint(Request(url))`` without the Request, the
    dict, the sorted ``json.dumps`` and Scrapy's per-request cache (a WeakKeyDictionary):
    about half the cost of a fingerprint, which was the largest single cost of
    ``Producer.push_many``. tests/test_producer.py compares the two on a table of URLs."""
    text = _GET_FINGERPRINT_JSON % encode_basestring_ascii(canonicalize_url(url))
    return hashlib.sha1(text.encode()).digest()  # SHA1: Scrapy's choice


def scrapy_redis_fingerprint(method: str, url: str, body: bytes) -> str:
    """scrapy-redis 0.9.1's ``RFPDupeFilter.request_fingerprint``, byte for byte: the SHA1,
    in hex, of the JSON (sorted keys, ASCII) of the method, the canonical URL and the body
    in hex; no headers, and never ``crawler.request_fingerprinter``. Copied so that the
    optional package need not be installed (tests/test_import.py pins it against the
    package and against known values)."""
    data = {"method": to_unicode(method), "url": canonicalize_url(url), "body": body.hex()}
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()


def legacy_fingerprint(request: Request) -> bytes:
    """What the legacy seen-set (``FrontierKeys.legacy_seen``) holds for ``request``: the
    first FINGERPRINT_BYTES of its scrapy-redis fingerprint, as ``distcrawl import``
    stores the dupefilter's."""
    hexdigest = scrapy_redis_fingerprint(request.method, request.url, request.body)
    return bytes.fromhex(hexdigest)[:FINGERPRINT_BYTES]
