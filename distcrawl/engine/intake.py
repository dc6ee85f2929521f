"""What a worker stores in the frontier, made into entries: the requests its engine
schedules, the ``start_urls`` entries it claimed, and the dead letters of those it cannot
store.

A request is checked here before anything is stored: the scheme first (a page can link to
``file://``, and Scrapy would read the file), then the duplicate filter, the politeness slot
and the codec. What fails a check is a dead letter with the reason, never an exception in the
engine or a request silently lost. The scheduler pushes the entries (Outbox); nothing here
touches Redis.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass, field
from typing import Any

from scrapy import Request, Spider

from distcrawl.codec import entries
from distcrawl.codec.politeness import slot_of
from distcrawl.codec.serialize import RequestCodec, SerializationError
from distcrawl.codec.start_urls import InvalidEntry
from distcrawl.config import DistcrawlConfig
from distcrawl.dupefilter import FINGERPRINT_BYTES, RedisDupeFilter, legacy_fingerprint
from distcrawl.engine.batch import refused_scheme
from distcrawl.engine.report import Reporter
from distcrawl.model.deadrecord import dead_letter
from distcrawl.model.queue_entry import bad_slot
from distcrawl.model.records import Entry, EntryKind

#: the scheduler's logger: these are its messages, filtered and configured as such
logger = logging.getLogger("distcrawl.scheduler")

#: meta key a component sets to have the scheduler store a request for later (seconds)
RETRY_DELAY_META = "distcrawl_retry_delay"


@dataclass
class Intake:
    """Entries from requests and ``start_urls`` entries, with the crawl's checks."""

    config: DistcrawlConfig
    #: None when the crawl's DUPEFILTER_CLASS is not distcrawl's: no duplicate is dropped here
    df: RedisDupeFilter | None
    codec: RequestCodec
    spider: Spider
    #: the scheduler's stats and warnings: a refused request is counted and said there
    report: Reporter
    #: whether the crawl has a legacy seen-set (read from ``<ns>:meta`` at open): each
    #: filtered request then carries its scrapy-redis fingerprint for commit.lua to look
    #: up there; off, nothing is computed nor sent
    legacy_seen: bool = field(default=False, init=False)

    def entry(self, request: Request) -> Entry | None:
        """The entry that stores a request the engine scheduled (a retry to store for
        later when a component set RETRY_DELAY_META); a dead letter when it cannot be
        stored; None when it is dropped here: a refused scheme, or a duplicate this worker
        has seen."""
        # first of all: a page can link to file://, and Scrapy would read the file
        why = refused_scheme(request.url, self.config.allowed_schemes)
        if why is not None:
            self.report.refused_scheme(request, why)
            return None
        fp = b""
        if not request.dont_filter and self.df is not None:
            fp = self.df.fingerprint(request)
            if self.df.seen_locally(fp):
                self.df.log(request, self.spider)
                return None
        delay = request.meta.pop(RETRY_DELAY_META, None)
        slot = slot_of(request, by_ip=self.config.slots_by_ip)
        why = bad_slot(slot)
        if why is not None:
            logger.error(
                "%s: invalid download slot %r (%s); dead-lettered",
                request,
                slot[:300],
                why,
                extra={"spider": self.spider},
            )
            self._inc("distcrawl/invalid_slot")
            record = dead_letter(f"invalid download slot: {why}", url=request.url, source="enqueue")
            return Entry(EntryKind.DEAD_LETTER, b"", 0, record)
        try:
            payload = self.codec.encode(request)
        except SerializationError as exc:
            logger.error("%s: dead-lettered", exc, extra={"spider": self.spider})
            self._inc("distcrawl/unserializable")
            record = dead_letter(str(exc), url=request.url, source="enqueue")
            return Entry(EntryKind.DEAD_LETTER, b"", 0, record)
        if delay is not None:
            delay_ms = str(max(0, int(float(delay) * 1000))).encode()
            self._inc("distcrawl/retry/scheduled")
            return Entry(EntryKind.RETRY, b"", request.priority, payload, delay_ms, slot, request)
        legacy = legacy_fingerprint(request) if fp and self.legacy_seen else b""
        return Entry(EntryKind.REQUEST, fp, request.priority, payload, legacy, slot, request)

    def revisit(self, request: Request, delay: float | None) -> Entry:
        """The entry that has a fetched page fetched again in ``delay`` seconds (None: never
        again, which forgets the revisit the page may still have waiting). Never filtered:
        the page was seen, that is the point; keyed by its fingerprint, so that it has one
        revisit however often it is fetched. A dead letter when it cannot be stored."""
        if self.df is not None:
            fp = self.df.fingerprint(request)
        else:
            fingerprinter = self.spider.crawler.request_fingerprinter
            fp = fingerprinter.fingerprint(request)[:FINGERPRINT_BYTES]
        slot = slot_of(request, by_ip=self.config.slots_by_ip)
        why = bad_slot(slot)
        try:
            payload = self.codec.encode(request) if why is None else b""
        except SerializationError as exc:
            why = str(exc)
        if why is not None:
            logger.error(
                "%s: cannot be stored for a revisit (%s); dead-lettered",
                request,
                why,
                extra={"spider": self.spider},
            )
            return self.dead_letter(request, f"revisit not stored: {why}", source="recrawl")
        delay_ms = -1 if delay is None else max(0, int(delay * 1000))
        raw = str(delay_ms).encode()
        return Entry(EntryKind.REVISIT, fp, request.priority, payload, raw, slot, request)

    def dead_letter(self, request: Request, reason: str, *, source: str, **extra: Any) -> Entry:
        """The dead letter of a request that will not be crawled, with what is needed to
        re-drive it."""
        assert self.codec is not None
        try:
            payload: str | None = base64.b64encode(self.codec.encode(request)).decode("ascii")
        except SerializationError:
            payload, dropped = self._partial_payload(request)
            if dropped:
                extra = {**extra, "payload_dropped": dropped}
        record = dead_letter(
            reason,
            url=request.url,
            source=source,
            payload=payload,
            priority=request.priority,
            **extra,
        )
        return Entry(EntryKind.DEAD_LETTER, b"", 0, record)

    def _partial_payload(self, request: Request) -> tuple[str | None, list[str]]:
        """A request whose meta the codec refuses (an object a middleware put there) still
        re-drives as nearly as it was: its URL, method, body, callback, priority and every
        meta value the codec takes; the values left out are named (``meta.<key>``)."""
        assert self.codec is not None
        kept: dict[str, Any] = {}
        dropped: list[str] = []
        for key, value in request.meta.items():
            try:
                self.codec.encode(request.replace(meta={key: value}))
            except SerializationError:
                dropped.append(f"meta.{key}")
            else:
                kept[key] = value
        try:
            encoded = self.codec.encode(request.replace(meta=kept))
        except SerializationError:  # not the meta: nothing of it can be kept
            return None, dropped
        return base64.b64encode(encoded).decode("ascii"), dropped

    def bad_start(self, raw: bytes, reason: str) -> Entry:
        """The dead letter of a start URL the spider itself was given (``-a start_urls``,
        its ``start_urls``) that cannot become a request: it is kept, with the reason, and
        the other start URLs are crawled."""
        logger.warning(
            "Bad start URL %r: %s; dead-lettered",
            raw[:200],
            reason,
            extra={"spider": self.spider},
        )
        self._inc("distcrawl/start_urls/invalid")
        return Entry(
            EntryKind.DEAD_LETTER, b"", 0, dead_letter(reason, raw=raw, source="start_urls")
        )

    def start_entry(self, raw: bytes) -> Entry:
        """The entry that stores a ``start_urls`` entry this worker claimed, checked as
        the producer checks it (entries.py), or its dead letter: one bad entry, or a
        spider hook failing on it, must not stop the others."""
        assert self.codec is not None
        try:
            data = entries.entry_data(raw, self.config)
            request = entries.spider_request(self.spider, data, self.config.allowed_schemes)
            fp = b""
            if not request.dont_filter and self.df is not None:
                fp = self.df.fingerprint(request)
            slot = slot_of(request, by_ip=self.config.slots_by_ip)
            why = bad_slot(slot)
            if why is not None:
                raise InvalidEntry(f"invalid download slot: {why}")
            payload = self.codec.encode(request)
            return Entry(EntryKind.START_REQUEST, fp, request.priority, payload, raw, slot, request)
        except (InvalidEntry, SerializationError) as exc:
            reason = str(exc)
        except Exception as exc:  # a spider hook failing on one entry must not stop the rest
            reason = f"{type(exc).__name__}: {exc}"
        logger.warning(
            "Bad start_urls entry %r: %s; dead-lettered",
            raw[:200],
            reason,
            extra={"spider": self.spider},
        )
        self._inc("distcrawl/start_urls/invalid")
        record = dead_letter(reason, raw=raw, source="start_urls")
        return Entry(EntryKind.BAD_START, b"", 0, record, raw)

    def _inc(self, key: str, count: int = 1) -> None:
        stats = self.report.stats
        if count and stats is not None:
            stats.inc_value(key, count)
