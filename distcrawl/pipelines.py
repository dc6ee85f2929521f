"""MongoPipeline: every item into MongoDB, batched, idempotent, and never lost.

distcrawl acknowledges a request in Redis only after Scrapy is done with it, which includes
``process_item`` of every item it produced. So ``process_item`` here returns only once the
item's batch is in MongoDB (or its dead letter is, or it is in the spill file). Many items
wait on one batch at a time, which gives batching and back-pressure together:

- items join a buffer; a batch is written when it is full (DISTCRAWL_MONGO_BATCH_SIZE) or
  its oldest item has waited DISTCRAWL_MONGO_FLUSH_INTERVAL; one unordered ``bulk_write`` of
  upserts by ``_id`` per batch, on the pipeline's own thread, never on the reactor;
- when MongoDB is down the batch stays in the buffer and is retried with backoff; when the
  buffer holds DISTCRAWL_MONGO_MAX_BUFFER items, ``process_item`` waits for room, so the
  spider slows down instead of memory growing; and the requests whose items wait keep their
  leases, which count against the most a worker may hold (DISTCRAWL_PREFETCH +
  CONCURRENT_REQUESTS, BatchBuilder._lease_room), so the worker stops leasing as well;
- a worker that closes while MongoDB stays down waits DISTCRAWL_MONGO_CLOSE_TIMEOUT, then
  appends what it holds to a JSON-lines spill file (``distcrawl mongo replay`` writes it);
- a worker killed at any moment loses nothing either: requests whose items were not yet
  written are not acknowledged, so their leases expire and another worker crawls them
  again, and the upserts by ``_id`` make that second write replace the first;
- while pages are revisited, items are ``$set`` updates rather than replacements and each
  PageFetch updates its page's document (``distcrawl.mongo._tracking``), so that the
  change-tracking fields survive every new version of the page.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import Deferred

from distcrawl._pipeline_report import PipelineReport
from distcrawl.config import DistcrawlConfig
from distcrawl.engine import _engine
from distcrawl.model.redact import redacted_exc_info
from distcrawl.mongo import (
    Doc,
    DocContext,
    FlushResult,
    MongoConfig,
    MongoIO,
    MongoWriter,
    SpillFile,
    document_for,
    error_reason,
    is_transient,
)
from distcrawl.mongo import auth_refusal as mongo_auth_refusal
from distcrawl.notify import Notifier, NotifyConfig

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from twisted.internet.base import DelayedCall
    from twisted.python.failure import Failure

logger = logging.getLogger(__name__)

RETRY_MIN_DELAY = 0.25
RETRY_MAX_DELAY = 10.0
#: how often a pipeline waiting for MongoDB checks whether the crawl is closing
TICK = 0.5


def _call_later(delay: float, func: Callable[[], None]) -> DelayedCall:
    from twisted.internet import reactor

    clock: Any = reactor  # zope interfaces confuse mypy about callLater's signature
    return cast("DelayedCall", clock.callLater(delay, func))


class _Pending:
    __slots__ = ("doc", "done", "since")

    def __init__(self, doc: Doc) -> None:
        self.doc = doc
        self.done: Deferred[str] = Deferred()
        self.since = time.monotonic()


class MongoPipeline:
    """Item pipeline (enabled by the add-on when MONGO_URI is set); see the module docstring."""

    def __init__(
        self,
        crawler: Crawler,
        config: MongoConfig,
        notify: NotifyConfig | None = None,
        *,
        revisits: bool = False,
    ) -> None:
        self.crawler = crawler
        self.config = config
        self.notify = notify or NotifyConfig()
        #: pages are revisited: items become $set updates, so tracking fields survive them
        self.revisits = revisits
        self._notifier: Notifier | None = None
        self._io = MongoIO()
        self._writer: MongoWriter | None = None
        self._spill: SpillFile | None = None
        #: what every item's Doc is made with; the spider's name is known once it opens
        self._docs = DocContext(config, "items", self._fingerprint)
        self._buffer: deque[_Pending] = deque()
        self._in_flight: list[_Pending] = []
        self._space: deque[Deferred[None]] = deque()
        self._drained: list[Deferred[None]] = []
        self._timer: DelayedCall | None = None
        self._retry: DelayedCall | None = None
        self._retry_delay = 0.0
        self._retry_at = 0.0
        self._down_since: float | None = None
        self._closing_since: float | None = None
        self._closing_logged = False
        self._report = PipelineReport(crawler, config)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MongoPipeline:
        config = MongoConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("MONGO_URI is not set")
        revisits = DistcrawlConfig.from_settings(crawler.settings).recrawl is not None
        return cls(crawler, config, NotifyConfig.from_settings(crawler.settings), revisits=revisits)

    # ------------------------------------------------------------------ Scrapy API

    async def open_spider(self) -> None:
        spider = self.crawler.spider
        name = spider.name if spider is not None else "items"
        self._docs = replace(self._docs, default_collection=self.config.collection or name)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self._spill = SpillFile(
            Path(self.config.buffering.spill_dir) / f"{name}-{stamp}-{os.getpid()}.jsonl"
        )
        assert self.config.uri is not None
        self._writer = MongoWriter(
            self.config.uri,
            self.config.database,
            spill=self._spill,
            source=f"{name}@{socket.gethostname()}:{os.getpid()}",
            key_fields=self.config.key_fields,
            timeout=self.config.timeout,
        )
        if self.notify.task is not None:
            path = (
                Path(self.config.buffering.spill_dir) / f"{name}-notify-{stamp}-{os.getpid()}.jsonl"
            )
            self._notifier = Notifier(self.notify, self.config.database, path)
            logger.info(
                "Item notifications: %s via %s", self.notify.task, self._notifier.shown_broker
            )
        self._io.start()
        logger.info(
            "MongoDB: items go to %s.%s at %s (batches of up to %d, every %.2fs at most)",
            self.config.database,
            self._docs.default_collection,
            self.config.shown_uri,
            self.config.buffering.batch_size,
            self.config.buffering.flush_interval,
        )
        if self.revisits and self.config.key_fields:
            logger.warning(
                "MongoDB: revisits record each fetch on the document keyed by its URL's "
                "fingerprint, but DISTCRAWL_MONGO_KEY_FIELDS keys items otherwise: a page's "
                "fetches and its items will be on different documents"
            )
        # first contact in the background: the crawl does not wait for MongoDB to start
        self._io.run(self._writer.prepare, self._docs.default_collection).addErrback(
            self._report.unreachable_at_open
        )

    async def process_item(self, item: Any) -> Any:
        pending = _Pending(document_for(item, self._docs, revisits=self.revisits))
        if self._queued() >= self.config.buffering.max_buffer:
            self._report.inc("waited_for_room")
            while self._queued() >= self.config.buffering.max_buffer:
                room: Deferred[None] = Deferred()
                self._space.append(room)
                await maybe_deferred_to_future(room)
        self._buffer.append(pending)
        self._report.max("buffer_max", self._queued())
        self._kick()
        await maybe_deferred_to_future(pending.done)
        return item

    async def close_spider(self) -> None:
        if self._closing_since is None:
            self._closing_since = time.monotonic()
        # Scrapy closes pipelines once every process_item has returned, so normally
        # nothing is left; anything that is goes through the same retry/spill path.
        if self._queued():
            drained: Deferred[None] = Deferred()
            self._drained.append(drained)
            self._kick()
            await maybe_deferred_to_future(drained)
        for call in (self._timer, self._retry):
            if call is not None and call.active():
                call.cancel()
        self._timer = self._retry = None
        if self._writer is not None:
            try:
                await maybe_deferred_to_future(self._io.run(self._writer.close))
                if self._notifier is not None:
                    await maybe_deferred_to_future(self._io.run(self._notifier.close))
            finally:
                self._io.stop()
        self._report.closed(self._spill)

    # ------------------------------------------------------------------ documents

    def _fingerprint(self, request: Request) -> bytes:
        """The request fingerprint Redis dedups pages by: an item's key by default."""
        return self.crawler.request_fingerprinter.fingerprint(request)

    # ------------------------------------------------------------------ batching

    def _queued(self) -> int:
        return len(self._buffer) + len(self._in_flight)

    def _kick(self) -> None:
        """Start a write if one is due; otherwise make sure a timer will start it."""
        if self._in_flight or self._retry is not None or not self._buffer:
            if not self._queued():
                self._fire_drained()
            return
        wait = self._buffer[0].since + self.config.buffering.flush_interval - time.monotonic()
        if (
            len(self._buffer) >= self.config.buffering.batch_size
            or wait <= 0
            or self._closing_since is not None
        ):
            self._write()
        elif self._timer is None:
            self._timer = _call_later(wait, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._kick()

    def _take(self, size: int) -> list[_Pending]:
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        batch = [self._buffer.popleft() for _ in range(min(size, len(self._buffer)))]
        self._in_flight = batch
        return batch

    def _write(self) -> None:
        assert self._writer is not None
        batch = self._take(self.config.buffering.batch_size)
        started = time.monotonic()
        d = self._io.run(self._writer.write, [p.doc for p in batch])
        d.addCallbacks(
            self._on_written,
            self._on_failed,
            callbackArgs=(batch, started),
            errbackArgs=(batch,),
        )

    def _on_written(self, result: FlushResult, batch: list[_Pending], started: float) -> None:
        elapsed = time.monotonic() - started
        self._in_flight = []
        if self._down_since is not None:
            logger.info(
                "MongoDB at %s is back after %.1fs; writing the %d items that waited",
                self.config.shown_uri,
                time.monotonic() - self._down_since,
                self._queued() + len(batch),
            )
            self._down_since = None
        self._retry_delay = 0.0
        self._report.flushed(result, [p.doc for p in batch], elapsed)
        self._notify(batch, result.outcomes)

    def _notify(self, batch: list[_Pending], outcomes: list[str]) -> None:
        """Send the keys of the stored documents (DISTCRAWL_CELERY_ITEM_TASK), then let
        their items go: a request is acknowledged only once its items' notifications are
        sent (or spilled at close), so each is sent at least once. A PageFetch's tracking
        update notifies nothing: it stores no item (a changed page's item notifies its key)."""
        stored = [
            (p.doc.collection, p.doc.key)
            for p, outcome in zip(batch, outcomes, strict=True)
            if outcome in ("upserted", "updated") and not p.doc.tracking
        ]
        if self._notifier is None or not stored:
            self._finish(batch, outcomes)
            return
        d = self._io.run(
            self._notifier.deliver,
            stored,
            lambda: self._closing_since is not None or _engine.closing(self.crawler),
            self.config.buffering.close_timeout,
        )

        def done(outcome: Any) -> None:
            if isinstance(outcome, str):
                self._report.inc(f"notifications/{outcome}", len(stored))
            else:
                logger.error("Item notifications not sent: %s", outcome.getErrorMessage())
            self._finish(batch, outcomes)

        d.addBoth(done)

    def _on_failed(self, failure: Failure, batch: list[_Pending]) -> None:
        self._in_flight = []
        self._buffer.extendleft(reversed(batch))
        self._report.inc("retries")
        exc = failure.value
        assert exc is not None  # a Failure is only made from an exception
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
            transient = is_transient(exc)
            logger.log(
                logging.WARNING if transient else logging.ERROR,
                "MongoDB at %s: write failed (%s: %s); keeping %d items and retrying "
                "with backoff up to %.0fs",
                self.config.shown_uri,
                type(exc).__name__,
                error_reason(exc, self.config.uri or ""),
                self._queued(),
                RETRY_MAX_DELAY,
                exc_info=None
                if transient or mongo_auth_refusal(exc)
                else redacted_exc_info(exc, self.config.uri),
            )
        self._retry_delay = min(RETRY_MAX_DELAY, max(RETRY_MIN_DELAY, self._retry_delay * 2))
        self._retry_at = now + self._retry_delay
        self._schedule_tick()

    def _schedule_tick(self) -> None:
        self._retry = _call_later(
            max(0.0, min(TICK, self._retry_at - time.monotonic())), self._tick
        )

    def _tick(self) -> None:
        """While MongoDB is down: retry when the backoff is over, spill when closing."""
        self._retry = None
        try:
            self._tick_once()
        except Exception:
            # this loop is what eventually returns every waiting item: it must not stop
            logger.exception("MongoDB pipeline: error in the retry loop; retrying")
            self._retry_at = time.monotonic() + RETRY_MAX_DELAY
            if self._retry is None and not self._in_flight:
                self._schedule_tick()

    def _tick_once(self) -> None:
        if not self._buffer:
            self._kick()
            return
        now = time.monotonic()
        if self._closing_since is None and _engine.closing(self.crawler):
            self._closing_since = now
        if self._closing_since is not None:
            waited = now - self._closing_since
            if not self._closing_logged:
                self._closing_logged = True
                logger.warning(
                    "MongoDB still unavailable while the crawl closes: %d items wait for "
                    "it; in %.0fs they go to the spill file",
                    self._queued(),
                    max(0.0, self.config.buffering.close_timeout - waited),
                )
            if waited >= self.config.buffering.close_timeout:
                self._spill_all()
                return
        if now >= self._retry_at:
            self._write()
        else:
            self._schedule_tick()

    def _spill_all(self) -> None:
        assert self._writer is not None
        batch = self._take(len(self._buffer))
        d = self._io.run(self._writer.spill, [p.doc for p in batch], "MongoDB unreachable at close")
        d.addCallbacks(
            self._on_spilled, self._on_spill_failed, callbackArgs=(batch,), errbackArgs=(batch,)
        )

    def _on_spilled(self, result: FlushResult, batch: list[_Pending]) -> None:
        self._in_flight = []
        self._report.count(result, [p.doc for p in batch])
        assert self._spill is not None
        self._report.spilled(len(batch), self._spill.path)
        self._finish(batch, result.outcomes)

    def _on_spill_failed(self, failure: Failure, batch: list[_Pending]) -> None:
        # Nowhere to put them: keep them (their requests stay unacknowledged, so even a
        # SIGKILL now loses nothing) and try again.
        self._in_flight = []
        self._buffer.extendleft(reversed(batch))
        logger.critical(
            "MongoDB unreachable and the spill file %s cannot be written (%s); %d items "
            "wait; their requests stay leased",
            self._spill.path if self._spill else "?",
            failure.getErrorMessage(),
            self._queued(),
        )
        self._retry_delay = RETRY_MAX_DELAY
        self._retry_at = time.monotonic() + self._retry_delay
        self._schedule_tick()

    def _finish(self, batch: list[_Pending], outcomes: list[str]) -> None:
        for pending, outcome in zip(batch, outcomes, strict=True):
            pending.done.callback(outcome)
        for _ in range(min(len(batch), len(self._space))):
            self._space.popleft().callback(None)
        self._kick()

    def _fire_drained(self) -> None:
        drained, self._drained = self._drained, []
        for d in drained:
            d.callback(None)
