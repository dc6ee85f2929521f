"""The distributed scheduler (SCHEDULER): Scrapy's side of the shared Redis frontier.

Scrapy calls a scheduler synchronously (``enqueue_request``, ``next_request``), so this
class only touches local buffers; a periodic *pump* turns them into one batch of Redis work
at a time, run on the crawler's Redis thread:

1. commit: push discovered requests and start-URL entries, and acknowledge the leases of
   requests the engine is completely done with, in one atomic script;
2. renew the leases this worker holds, and requeue other workers' expired ones;
3. lease more requests when the local buffer runs low;
4. peek at ``<spider>:start_urls`` (entries are removed only by the commit that stores the
   request made from them).

A request is acknowledged only after it left the engine, i.e. after its download, its
callback, and the handing-on of everything the callback produced; its children are
committed in the same script as its acknowledgement, so a worker killed at any moment
loses nothing: its leases expire and another worker takes them.
"""

from __future__ import annotations

import base64
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import redis
from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.misc import build_from_crawler, load_object
from twisted.internet import defer, task

from distcrawl import _engine
from distcrawl.config import DistcrawlConfig
from distcrawl.connection import RedisIO, redact_url, redis_io
from distcrawl.dupefilter import RedisDupeFilter
from distcrawl.frontier import CommitResult, Entry, Feedback, Frontier, dead_letter
from distcrawl.keys import FrontierKeys
from distcrawl.politeness import FeedbackBuffer, politeness, slot_of
from distcrawl.serialize import DecodeError, RequestCodec, SerializationError
from distcrawl.start_urls import InvalidEntry, parse_entry, request_from_entry

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: meta key a component sets to have the scheduler store a request for later (seconds)
RETRY_DELAY_META = "distcrawl_retry_delay"
BUSY_PEEK_INTERVAL = 1.0
MAX_RETRY_DELAY = 15.0


@dataclass
class _Op:
    acks: list[str] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    feedback: list[Feedback] = field(default_factory=list)
    renew: list[str] = field(default_factory=list)
    reclaim: bool = False
    want: int = 0
    peek: int = 0
    release: list[str] = field(default_factory=list)
    held: Counter[str] = field(default_factory=Counter)
    sent: list[tuple[str, int]] = field(default_factory=list)

    def empty(self) -> bool:
        return not (
            self.sent
            or self.acks
            or self.entries
            or self.feedback
            or self.renew
            or self.reclaim
            or self.want
            or self.peek
            or self.release
        )


@dataclass
class _Result:
    committed: CommitResult | None = None
    renewed: int = 0
    requeued: int = 0
    released: int = 0
    leased: list[tuple[str, Request | DecodeError, bytes, str, bool]] = field(default_factory=list)
    leased_at: int = 0
    queue_size: int | None = None
    delayed: int | None = None
    wait: float | None = None
    promoted: int = 0
    peeked: list[bytes] = field(default_factory=list)
    error: Exception | None = None


_SCHEDULERS: WeakKeyDictionary[Any, Scheduler] = WeakKeyDictionary()


def scheduler_of(crawler: Crawler) -> Scheduler | None:
    """The open distcrawl scheduler of this crawler, for components that hand it requests
    to delay or to dead-letter; None when the crawl does not use distcrawl's scheduler."""
    return _SCHEDULERS.get(crawler)


class Scheduler(BaseScheduler):
    def __init__(
        self,
        crawler: Crawler,
        config: DistcrawlConfig,
        dupefilter: RedisDupeFilter,
        io: RedisIO,
    ) -> None:
        self.crawler = crawler
        self.config = config
        self.df = dupefilter
        self.io = io
        self.stats = crawler.stats
        self.spider: Spider | None = None
        self.keys: FrontierKeys | None = None
        self.frontier: Frontier | None = None
        self.codec: RequestCodec | None = None
        self._outgoing: deque[Entry] = deque()
        self._feedback = FeedbackBuffer(config)
        #: lease id -> slot of every request this worker holds (for the fair share)
        self._slots: dict[str, str] = {}
        #: request -> (slot, server time of the lease) of held requests of slots with a
        #: delay, until they reach the downloader (past its middlewares, robots.txt included)
        self._to_send: dict[Request, tuple[str, int]] = {}
        #: the same, of those that reached it since the last batch (Frontier.sent)
        self._sent: list[tuple[str, int]] = []
        self._warned_full = 0.0
        self._acks: list[str] = []
        self._ready: deque[tuple[str, Request]] = deque()
        self._active: dict[str, Request] = {}
        self._busy = False
        self._closing = False
        self._paused = False
        self._kick_pending = False
        self._loop: task.LoopingCall | None = None
        self._remote_queue = 0
        self._remote_delayed = 0
        self._start_pending = 0
        now = time.monotonic()
        self._next_lease = self._next_peek = self._next_reclaim = now
        self._next_renew = now + config.lease_timeout / 3
        self._idle_delay = 0.0
        self._retry_at = 0.0
        self._retry_delay = 0.0
        self._last_work = now
        self._failing = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Scheduler:
        config = DistcrawlConfig.from_settings(crawler.settings)
        df_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
        if not (isinstance(df_cls, type) and issubclass(df_cls, RedisDupeFilter)):
            logger.warning(
                "DUPEFILTER_CLASS=%s does not filter against the shared seen-set; using %s",
                crawler.settings["DUPEFILTER_CLASS"],
                "distcrawl.dupefilter.RedisDupeFilter",
            )
            df_cls = RedisDupeFilter
        return cls(crawler, config, build_from_crawler(df_cls, crawler), redis_io(crawler))

    # -- Scrapy's scheduler interface ------------------------------------------------

    def open(self, spider: Spider) -> defer.Deferred[Any]:
        _engine.check(self.crawler)
        self.spider = spider
        self.keys = FrontierKeys(self.config.namespace or spider.name)
        self.codec = RequestCodec(self.config.serializer, spider)
        self.io.start()
        self.frontier = Frontier(
            self.io.client,
            self.keys,
            politeness(self.config),
            seen=self.config.seen,
            bloom_capacity=self.config.bloom_capacity,
            bloom_error_rate=self.config.bloom_error_rate,
        )
        self.crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        self.crawler.signals.connect(
            self._on_downloading, signal=signals.request_reached_downloader
        )
        # response_downloaded, not response_received: a 429 that the retry middleware turns
        # into a retry never reaches the engine as a response, and it is the one to report
        self.crawler.signals.connect(self._on_response, signal=signals.response_downloaded)
        _engine.local_delays_off(self.crawler)
        _SCHEDULERS[self.crawler] = self
        logger.info(
            "distcrawl frontier %r on %s (lease %.0fs, prefetch %d, serializer %s, seen-set "
            "%s); per %s, cluster-wide: delay %.2fs, concurrency %d%s",
            self.keys.namespace,
            redact_url(self.config.redis_url),
            self.config.lease_timeout,
            self.config.prefetch,
            self.config.serializer,
            self.config.seen,
            "IP" if self.config.slots_by_ip else "domain",
            self.config.domain_delay,
            self.config.domain_concurrency,
            ", robots.txt Crawl-delay" if self.config.robots_obey else "",
            extra={"spider": spider},
        )
        d = self.io.run(self._open_frontier)
        d.addCallbacks(self._opened, self._open_failed)
        return d

    def _open_frontier(self) -> dict[str, int]:
        assert self.frontier is not None
        if self.config.flush_on_start:
            removed = self.frontier.clear()
            logger.warning(
                "DISTCRAWL_FLUSH_ON_START: removed %d keys of %r",
                removed,
                self.frontier.keys.namespace,
            )
        self.frontier.publish_settings(max_pending=self.config.max_pending)
        return self.frontier.sizes()

    def _opened(self, sizes: dict[str, int]) -> None:
        self._remote_queue = sizes["queue"]
        self._remote_delayed = sizes["delayed"]
        logger.info(
            "Frontier: %(queue)d queued, %(leased)d leased, %(delayed)d retries waiting, "
            "%(seen)d seen, %(start_urls)d start URLs waiting, %(dead)d dead letters",
            sizes,
            extra={"spider": self.spider},
        )
        self._start_loop()

    def _open_failed(self, failure: Any) -> None:
        self._note_error(failure.value)
        self._start_loop()

    def _start_loop(self) -> None:
        self._loop = task.LoopingCall(self._pump)
        self._loop.start(self.config.flush_interval, now=True)

    def has_pending_requests(self) -> bool:
        return bool(self._ready or self._outgoing or self._acks or self._remote_queue > 0)

    def enqueue_request(self, request: Request) -> bool:
        fp = b""
        if not request.dont_filter:
            fp = self.df.fingerprint(request)
            if self.df.seen_locally(fp):
                self.df.log(request, self.spider)  # type: ignore[arg-type]
                return False
        assert self.codec is not None, "enqueue_request() before open()"
        delay = request.meta.pop(RETRY_DELAY_META, None)
        try:
            payload = self.codec.encode(request)
        except SerializationError as exc:
            logger.error("%s: dead-lettered", exc, extra={"spider": self.spider})
            self._inc("distcrawl/unserializable")
            record = dead_letter(str(exc), url=request.url, source="enqueue")
            self._outgoing.append(Entry("d", b"", 0, record))
            return False
        slot = slot_of(request, by_ip=self.config.slots_by_ip)
        if delay is not None:
            delay_ms = str(max(0, int(float(delay) * 1000))).encode()
            self._outgoing.append(Entry("l", b"", request.priority, payload, delay_ms, slot))
            self._inc("distcrawl/retry/scheduled")
        else:
            self._outgoing.append(Entry("r", fp, request.priority, payload, b"", slot))
        self._last_work = time.monotonic()
        self._inc("scheduler/enqueued/redis")
        if len(self._outgoing) >= self.config.push_batch_size:
            self._kick()
        return True

    def dead_letter(self, request: Request, reason: str, *, source: str, **extra: Any) -> None:
        """Store a request that will not be crawled, with what is needed to re-drive it.

        It is committed with the acknowledgement of the request being processed, like any
        push, so it is neither lost nor stored twice.
        """
        assert self.codec is not None
        try:
            payload: str | None = base64.b64encode(self.codec.encode(request)).decode("ascii")
        except SerializationError:
            payload = None
        record = dead_letter(
            reason,
            url=request.url,
            source=source,
            payload=payload,
            priority=request.priority,
            **extra,
        )
        self._outgoing.append(Entry("d", b"", 0, record))
        self._inc(f"distcrawl/dead/{source}")

    def pause(self) -> None:
        """Stop handing out requests; unstarted leased ones go back to the shared queue."""
        if not self._paused:
            logger.info(
                "Crawl paused: finishing the requests in progress", extra={"spider": self.spider}
            )
        self._paused = True
        self._kick()

    def resume(self) -> None:
        if self._paused:
            logger.info("Crawl resumed", extra={"spider": self.spider})
        self._paused = False
        self._next_lease = self._next_peek = time.monotonic()
        self._kick()

    @property
    def paused(self) -> bool:
        return self._paused

    def next_request(self) -> Request | None:
        if self._paused:
            return None
        if not self._ready:
            self._kick()
            return None
        lease_id, request = self._ready.popleft()
        self._active[lease_id] = request
        self._last_work = time.monotonic()
        self._inc("scheduler/dequeued/redis")
        if len(self._ready) < self.config.prefetch // 2:
            self._kick()
        return request

    def close(self, reason: str) -> defer.Deferred[None]:
        self._closing = True
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        return defer.ensureDeferred(self._close(reason))

    async def _close(self, reason: str) -> None:
        from twisted.internet import reactor

        for _ in range(int(30 / 0.05)):  # the running batch, if any, ends within a timeout
            if not self._busy:
                break
            await task.deferLater(reactor, 0.05)
        self._collect_finished()
        unfinished = list(self._active)
        self._active.clear()
        self._to_send.clear()
        release = [lease_id for lease_id, _ in self._ready] + unfinished
        self._forget(release)
        self._ready.clear()
        op = _Op(acks=self._acks, entries=list(self._outgoing), release=release)
        self._acks, self._outgoing = [], deque()
        try:
            result = await self.io.run(self._execute, op, final=True)
            if result.error is not None:
                raise result.error
            self._apply_commit(result)
            self._inc("distcrawl/released", result.released)
            logger.info(
                "Frontier closed: %d acknowledged, %d pushed, %d leases given back",
                len(op.acks),
                len(op.entries),
                result.released,
                extra={"spider": self.spider},
            )
        except redis.RedisError as exc:
            logger.error(
                "Could not save the last batch to Redis (%s): %d acknowledgements and %d "
                "pushes not stored; the leases concerned will expire and be crawled again",
                exc,
                len(op.acks),
                len(op.entries),
                extra={"spider": self.spider},
            )
        finally:
            self.io.stop()
            self.df.close(reason)

    # -- the pump ------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._kick_pending or self._closing or self._loop is None:
            return
        from twisted.internet import reactor

        self._kick_pending = True
        reactor.callLater(0, self._kicked)  # type: ignore[attr-defined,arg-type,unused-ignore]

    def _kicked(self) -> None:
        self._kick_pending = False
        self._pump()

    def _pump(self) -> None:
        self.df.flush_stats_if_due()
        if self._busy or self._closing or self.frontier is None:
            return
        now = time.monotonic()
        if now < self._retry_at:
            return
        self._collect_finished()
        op = self._build_op(now)
        if op.empty():
            return
        self._busy = True
        d = self.io.run(self._execute, op)
        d.addCallback(self._apply, op)
        d.addErrback(self._crashed, op)

    def _build_op(self, now: float) -> _Op:
        op = _Op()
        op.sent, self._sent = self._sent, []
        op.acks, self._acks = self._acks, []
        op.feedback = self._feedback.drain()
        batch = self.config.push_batch_size
        while self._outgoing and len(op.entries) < batch:
            op.entries.append(self._outgoing.popleft())
        if now >= self._next_renew:
            op.renew = [lease_id for lease_id, _ in self._ready] + list(self._active)
            self._next_renew = now + self.config.lease_timeout / 3
        if now >= self._next_reclaim:
            op.reclaim = True
            self._next_reclaim = now + self.config.reclaim_interval
        if self._paused:
            op.release = [lease_id for lease_id, _ in self._ready]
            self._forget(op.release)
            for _, request in self._ready:
                self._to_send.pop(request, None)
            self._ready.clear()
            return op
        prefetch = self.config.prefetch
        if len(self._ready) <= prefetch // 2 and now >= self._next_lease:
            op.want = prefetch - len(self._ready)
            op.held = Counter(self._slots.values())
        if self._start_pending == 0 and now >= self._next_peek and not self._full():
            op.peek = self.config.start_urls_batch
        return op

    def _execute(self, op: _Op, final: bool = False) -> _Result:
        """Runs on the Redis thread."""
        assert self.frontier is not None and self.codec is not None
        frontier, res = self.frontier, _Result()
        lease_ms = int(self.config.lease_timeout * 1000)
        try:
            if op.sent:
                frontier.sent(op.sent)
            if op.acks or op.entries or op.feedback:
                if final:
                    self._commit_in_chunks(op, res)
                else:
                    res.committed = frontier.commit(op.acks, op.entries, op.feedback)
            if op.release:
                res.released = frontier.release(op.release)
            if op.renew:
                res.renewed = frontier.renew(op.renew, lease_ms)
            if op.reclaim:
                res.requeued = frontier.requeue_expired()
            if op.want:
                lease = frontier.lease(op.want, lease_ms, held=op.held)
                res.queue_size, res.delayed, res.promoted, res.wait, res.leased_at = lease[1:]
                for item in lease.items:
                    try:
                        request = self.codec.decode(item.payload)
                        res.leased.append((item.id, request, item.payload, item.slot, item.paced))
                    except DecodeError as exc:
                        res.leased.append((item.id, exc, item.payload, item.slot, False))
            if op.peek:
                res.peeked = frontier.peek_start_urls(op.peek)
        except redis.RedisError as exc:
            res.error = exc
        return res

    def _commit_in_chunks(self, op: _Op, res: _Result) -> None:
        assert self.frontier is not None
        batch = self.config.push_batch_size
        totals = [0] * len(vars(CommitResult()))
        entries = op.entries
        for start in range(0, max(len(entries), 1), batch):
            last = start + batch >= len(entries)
            acks, feedback = (op.acks, op.feedback) if last else ([], [])
            part = self.frontier.commit(acks, entries[start : start + batch], feedback)
            totals = [a + b for a, b in zip(totals, vars(part).values(), strict=True)]
        res.committed = CommitResult(*totals)

    def _apply(self, res: _Result, op: _Op) -> None:
        self._busy = False
        now = time.monotonic()
        if res.committed is not None:
            self._start_pending -= sum(1 for e in op.entries if e.kind in "sx")
        elif op.acks or op.entries:
            # not stored: back to the front of the buffers, to be sent again
            self._acks[:0] = op.acks
            self._outgoing.extendleft(reversed(op.entries))
        if res.error is not None:
            self._note_error(res.error)
            self._handle_leased(res)
            return
        if self._failing:
            logger.info(
                "Redis is reachable again at %s",
                redact_url(self.config.redis_url),
                extra={"spider": self.spider},
            )
            self._failing = False
            self._retry_delay = 0.0
            self._inc("distcrawl/redis_reconnects")
        self._apply_commit(res)
        self._inc("distcrawl/released", res.released)
        lease_now = bool(res.committed and res.committed.queue_size and not op.want)
        if lease_now:
            # work just arrived (e.g. from a start URL): ask for it now, not at the next
            # idle poll
            self._idle_delay = 0.0
            self._next_lease = now
        if res.renewed < len(op.renew):
            logger.debug(
                "%d of %d leases had expired before renewal",
                len(op.renew) - res.renewed,
                len(op.renew),
            )
        if res.requeued:
            logger.info(
                "Requeued %d requests whose leases expired",
                res.requeued,
                extra={"spider": self.spider},
            )
            self._inc("distcrawl/lease_expired", res.requeued)
        got = self._handle_leased(res)
        if op.want:
            if got:
                self._idle_delay = 0.0
                self._next_lease = now
            else:
                self._idle_delay = min(max(self._idle_delay * 2, 0.05), self.config.idle_poll_max)
                wait = self._idle_delay
                if res.wait is not None:  # a slot's turn comes sooner: ask for it then
                    wait = min(wait, max(res.wait, self.config.flush_interval))
                self._next_lease = now + wait
        if op.peek:
            self._handle_peeked(res.peeked)
            if len(res.peeked) >= op.peek:
                self._next_peek = now
            elif not (self._ready or self._active):
                self._next_peek = self._next_lease
            else:
                self._next_peek = now + BUSY_PEEK_INTERVAL
        low = len(self._ready) <= self.config.prefetch // 2
        if self._outgoing or self._acks or ((got or lease_now) and low):
            self._kick()

    def _apply_commit(self, res: _Result) -> None:
        c = res.committed
        if c is None:
            return
        self._remote_queue = c.queue_size
        self._inc("distcrawl/pushed", c.enqueued)
        self._inc("distcrawl/duplicates", c.duplicates)
        self._inc("distcrawl/dead_letters", c.dead)
        if c.duplicates:
            self._inc("dupefilter/filtered", c.duplicates)
        if c.dropped or c.held:
            self._inc("distcrawl/backpressure/dropped", c.dropped)
            self._inc("distcrawl/backpressure/start_urls_held", c.held)
            self._next_peek = time.monotonic() + BUSY_PEEK_INTERVAL
            if time.monotonic() - self._warned_full >= 10.0:
                self._warned_full = time.monotonic()
                logger.warning(
                    "The shared queue is at DISTCRAWL_MAX_PENDING=%d: %d new requests dropped "
                    "and %d start URLs left waiting in Redis (stats: distcrawl/backpressure/)",
                    self.config.max_pending,
                    c.dropped,
                    c.held,
                    extra={"spider": self.spider},
                )

    def _handle_leased(self, res: _Result) -> int:
        got = 0
        for lease_id, item, payload, slot, paced in res.leased:
            self._slots[lease_id] = slot
            if isinstance(item, DecodeError):
                logger.error(
                    "Undecodable queue entry %s: %s; dead-lettered",
                    lease_id,
                    item,
                    extra={"spider": self.spider},
                )
                self._outgoing.append(
                    Entry("d", b"", 0, dead_letter(str(item), raw=payload, source="queue"))
                )
                self._acks.append(lease_id)
                self._slots.pop(lease_id, None)
                self._inc("distcrawl/undecodable")
                continue
            if paced:
                # its slot's turn began in Redis when it was leased: sent behind the requests
                # already waiting here, it would leave the next worker's turn closer than the
                # slot's delay; what lag remains is reported when it is sent (sent.lua)
                self._to_send[item] = (slot, res.leased_at)
                self._ready.appendleft((lease_id, item))
            else:
                self._ready.append((lease_id, item))
            got += 1
        if res.queue_size is not None:
            self._remote_queue = res.queue_size
        if res.delayed is not None:
            self._remote_delayed = res.delayed
        self._inc("distcrawl/retry/due", res.promoted)
        if got:
            self._inc("distcrawl/leased", got)
            self._last_work = time.monotonic()
            _engine.wake(self.crawler)
        return got

    def _handle_peeked(self, raws: list[bytes]) -> None:
        for raw in raws:
            self._outgoing.append(self._start_entry(raw))
            self._start_pending += 1
        if raws:
            self._inc("distcrawl/start_urls/read", len(raws))
            self._kick()

    def _start_entry(self, raw: bytes) -> Entry:
        assert self.codec is not None
        try:
            data = parse_entry(
                raw, max_bytes=self.config.start_url_max_bytes, schemes=self.config.allowed_schemes
            ).data
            make = getattr(self.spider, "make_request_from_data", None)
            request = make(data) if callable(make) else request_from_entry(data)
            if not isinstance(request, Request):
                raise InvalidEntry(f"make_request_from_data returned {type(request).__name__}")
            fp = b"" if request.dont_filter else self.df.fingerprint(request)
            slot = slot_of(request, by_ip=self.config.slots_by_ip)
            return Entry("s", fp, request.priority, self.codec.encode(request), raw, slot)
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
        return Entry("x", b"", 0, dead_letter(reason, raw=raw, source="start_urls"), raw)

    def _crashed(self, failure: Any, op: _Op) -> None:
        """A bug, not an outage: keep the work and log it loudly."""
        self._busy = False
        self._acks[:0] = op.acks
        self._outgoing.extendleft(reversed(op.entries))
        logger.error(
            "distcrawl scheduler error",
            exc_info=(failure.type, failure.value, failure.getTracebackObject()),
            extra={"spider": self.spider},
        )
        self._retry_at = time.monotonic() + 1.0

    def _note_error(self, exc: BaseException) -> None:
        self._inc("distcrawl/redis_errors")
        self._retry_delay = min(max(self._retry_delay * 2, 0.5), MAX_RETRY_DELAY)
        self._retry_at = time.monotonic() + self._retry_delay
        if not self._failing:
            logger.error(
                "Redis %s at %s (%s: %s); keeping %d pushes and %d acknowledgements and retrying",
                "refused a batch" if isinstance(exc, redis.ResponseError) else "unreachable",
                redact_url(self.config.redis_url),
                type(exc).__name__,
                exc,
                len(self._outgoing),
                len(self._acks),
                extra={"spider": self.spider},
            )
        self._failing = True

    # -- lease tracking ------------------------------------------------------------------

    def _collect_finished(self) -> None:
        if not self._active:
            return
        in_progress = _engine.in_progress(self.crawler)
        done = [lease_id for lease_id, req in self._active.items() if req not in in_progress]
        for lease_id in done:
            self._to_send.pop(self._active.pop(lease_id), None)
            self._slots.pop(lease_id, None)
        self._acks.extend(done)

    def _on_idle(self, spider: Spider) -> None:
        timeout = self.config.idle_timeout
        if (
            timeout is None
            or self._busy
            or self._failing  # cannot tell whether the shared queue is empty
            or self._paused
            or self._remote_delayed  # retries will come due
            or self.has_pending_requests()
            or self._active
        ):
            raise DontCloseSpider
        idle_for = time.monotonic() - self._last_work
        if idle_for < timeout:
            raise DontCloseSpider
        logger.info(
            "No work for %.1fs (DISTCRAWL_IDLE_TIMEOUT=%s): closing",
            idle_for,
            timeout,
            extra={"spider": spider},
        )

    def _forget(self, lease_ids: list[str]) -> None:
        for lease_id in lease_ids:
            self._slots.pop(lease_id, None)

    def _full(self) -> bool:
        cap = self.config.max_pending
        return cap is not None and self._remote_queue >= cap

    def _on_downloading(self, request: Request, spider: Spider) -> None:
        paced = self._to_send.pop(request, None)
        if paced is not None:
            self._sent.append(paced)
            self._kick()  # before the slot's next turn, which this lag pushes back

    def _on_response(self, response: Any, request: Request, spider: Spider) -> None:
        if self._feedback.add(request, response):
            self._inc("distcrawl/politeness/throttled")
            self._inc(f"distcrawl/politeness/throttled/{response.status}")
            # every worker must hold back from now on, not from this worker's next batch
            self._kick()

    def _inc(self, key: str, count: int = 1) -> None:
        if count and self.stats is not None:
            self.stats.inc_value(key, count)
