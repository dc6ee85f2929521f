"""Worker heartbeats, shared counters, pause/resume and Prometheus metrics (EXTENSIONS).

Every ``DISTCRAWL_HEARTBEAT_INTERVAL`` (a parked, idle worker every ``PARKED_BEAT_INTERVAL``,
without the frontier's sizes) a worker writes, in one pipeline on the crawler's
Redis thread: its heartbeat (``<ns>:workers``), the growth of its counters since the last
beat into the crawl-wide totals (``<ns>:stats``, HINCRBY, so totals are exact however many
workers write and survive every worker), the domains it fetched (``<ns>:domains``), and it
reads the frontier sizes and the pause flag. ``distcrawl status`` and ``watch`` read those
keys; an operator's ``distcrawl pause`` reaches every worker within one beat. The pipeline
rides with the scheduler's next batch (``Scheduler.ride``), or runs alone once it waited a
heartbeat for one.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis
from redis.cluster import RedisCluster
from scrapy import signals
from scrapy.exceptions import NotConfigured
from twisted.internet import task
from twisted.python.failure import Failure

from distcrawl.config import DistcrawlConfig
from distcrawl.engine._batch_types import Rider
from distcrawl.model._monitor_reads import (
    CRAWL_REPLIES,
    crawl_ops,
    crawl_sizes,
    part_ops,
    part_replies,
    parts_of,
    sizes_of,
    split_replies,
)
from distcrawl.model.connection import (
    RedisIO,
    execute_timed,
    is_cluster,
    node_info,
    redis_io,
    server_ms,
)
from distcrawl.model.deadrecord import worker_id
from distcrawl.model.frontier import Frontier
from distcrawl.model.history import HistoryWriter
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.ops import Op
from distcrawl.model.redact import redact_error, redact_text, url_secrets
from distcrawl.model.revisits_admin import gauges_of
from distcrawl.model.sizes import FrontierSizes
from distcrawl.scheduler import scheduler_of

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: crawl-wide counter -> the Scrapy stat whose growth it adds up
COUNTERS = {
    "pages": "response_received_count",
    "items": "item_scraped_count",
    "errors": "log_count/ERROR",
    "retries": "distcrawl/retry/scheduled",
    "dead_letters": "distcrawl/dead_letters",
    "lease_expired": "distcrawl/lease_expired",
    "download_errors": "downloader/exception_count",
    "dropped": "distcrawl/backpressure/dropped",
    "throttled": "distcrawl/politeness/throttled",
    # queue entries this worker dead-lettered because they could not be parsed or decoded
    # (lease.lua counts the ones it quarantines itself into the same field)
    "quarantined": "distcrawl/quarantined",
    "dead_worker_released": "distcrawl/dead_worker_released",
    "stale_acks": "distcrawl/ack/stale",
}
#: how often a worker reads Redis' INFO memory to warn before maxmemory is reached
MEMORY_CHECK_INTERVAL = 10.0
#: seconds between the beats of a parked (idle) worker (distcrawl/engine/idle.py): it fetches
#: nothing, so its counters stand still, and its liveness is the liveness thread's; an
#: operator's pause reaches it within this, or within one heartbeat of its waking
PARKED_BEAT_INTERVAL = 60.0
#: domains kept in ``<ns>:domains`` (the busiest, by pages fetched): a broad crawl meets
#: millions, and a line each would grow Redis for a statistic nobody reads that far down
DOMAINS_KEPT = 10_000
#: robots.txt and offsite refusals are decisions, not download errors
IGNORED = "downloader/exception_type_count/scrapy.exceptions.IgnoreRequest"


def _same(reply: Any) -> Any:
    return reply


@dataclass
class Beat:
    """What one beat sends: the counters' growth since the last beat, the pages fetched per
    domain, and the heartbeat; the counts go with the next beat when this one fails."""

    deltas: dict[str, int]
    domains: dict[str, int]
    heartbeat: dict[str, Any]


def counters(stats: Any) -> dict[str, int]:
    if stats is None:
        return dict.fromkeys(COUNTERS, 0)
    values = {name: int(stats.get_value(key, 0) or 0) for name, key in COUNTERS.items()}
    values["download_errors"] -= int(stats.get_value(IGNORED, 0) or 0)
    return values


class WorkerMonitor:
    """Extension that makes one worker visible to the crawl and steerable by operators.

    Its beats ride the scheduler's batches instead of their own round trips, so that
    hundreds of workers cost Redis little; and it is the one place a worker learns of
    ``distcrawl pause`` and of the crawl-wide sizes that ``status`` and Prometheus show.
    """

    def __init__(self, crawler: Crawler, config: DistcrawlConfig, io: RedisIO) -> None:
        self.crawler = crawler
        self.config = config
        self._next_memory_check = 0.0
        self._warned_policy = ""
        self._refused = False
        self.io = io
        self.id = worker_id()
        self.started = time.time()
        self.keys: FrontierKeys | None = None
        self.frontier: Frontier | None = None
        self.sent: Counter[str] = Counter()
        self.domains: Counter[str] = Counter()
        self.history: deque[tuple[float, int]] = deque(maxlen=120)
        #: the console's history rollups this worker writes with its beats
        self.rollups = HistoryWriter()
        self.sizes: dict[str, Any] = {}
        #: the Redis server's time at the last beat (ms) and the monotonic time it came, so
        #: that the next beat counts the revisits due by the server's clock (None: not yet
        #: asked, see _learn_server_time)
        self._server_ms: tuple[int, float] | None = None
        self._loop: task.LoopingCall | None = None
        self._busy = False
        self._metrics_port: Any = None
        #: monotonic time of the last beat sent (a parked worker's come every
        #: PARKED_BEAT_INTERVAL)
        self._last_sent = float("-inf")

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> WorkerMonitor:
        config = DistcrawlConfig.from_settings(crawler.settings)
        if not crawler.settings.getbool("DISTCRAWL_MONITOR_ENABLED", True):
            raise NotConfigured
        monitor = cls(crawler, config, redis_io(crawler))
        crawler.signals.connect(monitor.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(monitor.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(monitor.response_received, signal=signals.response_received)
        return monitor

    def spider_opened(self, spider: Spider) -> None:
        self.keys = FrontierKeys.of_crawl(spider.name, self.config.namespace)
        self.io.start()
        # the Frontier is made on the Redis thread (_publish): on a Redis Cluster, making the
        # client is I/O, and the key names depend on it
        self._loop = task.LoopingCall(self.beat)
        self._loop.start(self.config.lease.heartbeat, now=True)
        if self.config.metrics_port is not None:
            self._listen(self.config.metrics_port)

    def response_received(self, response: Any, request: Any, spider: Spider) -> None:
        self.domains[urlsplit(response.url).hostname or "?"] += 1

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._metrics_port is not None:
            await self._metrics_port.stopListening()
        if self.frontier is not None:
            try:
                from scrapy.utils.defer import maybe_deferred_to_future

                await maybe_deferred_to_future(self.io.run(self._publish, self._snapshot(reason)))
            except redis.RedisError as exc:
                logger.warning("Last heartbeat not stored: %s", redact_error(exc, self.io.url))
        self.io.stop()

    # -- the beat ------------------------------------------------------------------------

    def _snapshot(self, state: str) -> Beat:
        now = counters(self.crawler.stats)
        deltas = {k: v - self.sent[k] for k, v in now.items() if v != self.sent[k]}
        domains, self.domains = dict(self.domains), Counter()
        self.history.append((time.monotonic(), now["pages"]))
        heartbeat = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            # the key of its liveness beats in <ns>:alive, by which `distcrawl status` judges
            # it (last_beat is this host's clock, for people, not for comparing with others)
            "tag": getattr(scheduler_of(self.crawler), "tag", None),
            "started": self.started,
            "last_beat": time.time(),
            "state": state,
            "pages_per_min": self._pages_per_minute(),
            **now,
        }
        self.sent.update(deltas)
        return Beat(deltas, domains, heartbeat)

    def _pages_per_minute(self) -> float:
        if len(self.history) < 2:
            return 0.0
        (t0, p0), (t1, p1) = self.history[0], self.history[-1]
        return round((p1 - p0) * 60 / (t1 - t0), 1) if t1 > t0 else 0.0

    def beat(self) -> None:
        if self._busy or self.keys is None:
            return
        scheduler = scheduler_of(self.crawler)
        if scheduler is not None and scheduler.refused:
            return  # the crawl is closing: it never reached Redis (the scheduler said why)
        parked = scheduler is not None and scheduler.parked
        now = time.monotonic()
        if parked and now - self._last_sent < PARKED_BEAT_INTERVAL and not self._changed():
            return  # an idle worker's beat: rare, unless it has counts still to send
        self._last_sent = now
        state = "running"
        if scheduler is not None and scheduler.paused:
            state = "draining" if scheduler.draining else "paused"
        snapshot = self._snapshot(state)
        self._busy = True
        memory = not parked and now >= self._next_memory_check
        if memory:
            self._next_memory_check = now + MEMORY_CHECK_INTERVAL
        # with the scheduler's next batch: no round trip of its own. Not on a cluster: a
        # batch's pipeline is no MULTI there, and redis-py would send the counters again
        # after a lost reply (and INFO has no key)
        if self.frontier is not None and not is_cluster(self.io.client):
            # parked: the heartbeat, counters and pause flag, not the frontier's sizes
            ops = self._ops(snapshot, parts=not parked)
            if memory:
                ops.append(Op("", [], ["INFO", "memory"], _same))
            rider = Rider(
                ops, lambda replies: self._rode(replies, snapshot, memory, parts=not parked)
            )
            rider.wait = self.config.lease.heartbeat
            if scheduler is not None and scheduler.ride(rider):
                return
        d = self.io.run(self._publish, snapshot, memory)
        d.addCallbacks(self._published, self._failed, errbackArgs=(snapshot,))

    def _changed(self) -> bool:
        """Whether a counter or a domain grew since the last beat (sent at once, parked or
        not: the last pages of a crawl are counted before the worker idles for long)."""
        if self.domains:
            return True
        now = counters(self.crawler.stats)
        return any(v != self.sent[k] for k, v in now.items())

    def _ops(self, beat: Beat, parts: bool = True) -> list[Op[Any]]:
        """The beat's commands; then the reads of the pause flag and of the crawl's own
        dead letters (``CRAWL_SIZES``), then (with ``parts``) the reads of every part's
        sizes and revisit gauges (:meth:`_part_ops`)."""
        assert self.keys is not None
        k = self.keys
        ops: list[Op[Any]] = [
            Op(
                "",
                [],
                ["HSET", k.workers, self.id, json.dumps(beat.heartbeat, separators=(",", ":"))],
                _same,
            )
        ]
        ops += [Op("", [], ["HINCRBY", k.stats, n, d], _same) for n, d in beat.deltas.items()]
        ops += [Op("", [], ["ZINCRBY", k.domains, c, d], _same) for d, c in beat.domains.items()]
        if beat.domains:
            ops.append(Op("", [], ["ZREMRANGEBYRANK", k.domains, 0, -DOMAINS_KEPT - 1], _same))
        ops += self._history_ops(beat)
        ops.append(Op("", [], ["EXISTS", k.paused], _same))
        ops += crawl_ops(k)
        if parts:
            ops += self._part_ops()
        return ops

    def _history_ops(self, beat: Beat) -> list[Op[Any]]:
        """The history rollups' writes (distcrawl/model/history.py): the counters' growth
        and the queue's length as the last full beat read it, in buckets of the server's
        time as the last beat's TIME tells it (this host's clock until one came), so that
        workers on hosts whose clocks differ fill the same buckets."""
        assert self.keys is not None
        bound = self._due_bound()
        now_s = time.time() if bound is None else bound / 1000
        gauges = {"queue": int(self.sizes["queue"])} if "queue" in self.sizes else {}
        return self.rollups.ops(self.keys, now_s, beat.deltas, gauges)

    def _parts(self) -> list[FrontierKeys]:
        """The keys holding requests and revisits: every shard's (DISTCRAWL_SHARDS), or the
        crawl's."""
        assert self.keys is not None
        return parts_of(self.keys, self.config.shards)

    def _due_bound(self) -> int | None:
        """The server's time now as the last beat's TIME and the monotonic clock tell it:
        the due count is sent in the same round trip as the TIME it is read with."""
        if self._server_ms is None:
            return None
        at_ms, at = self._server_ms
        return at_ms + int((time.monotonic() - at) * 1000)

    def _learn_server_time(self) -> None:
        """Once, before the first beat: its due count needs the server's time to count by."""
        try:
            now = server_ms(self.io.client, self._parts()[0].revisits)
        except redis.RedisError:
            return  # the beat says what is wrong; the due count waits for a beat's TIME
        self._server_ms = (now, time.monotonic())

    def _part_ops(self) -> list[Op[Any]]:
        """Per part the reads of its sizes (``part_sizes``), then per part the revisit
        gauges' reads, then TIME (distcrawl/model/_monitor_reads.py): O(log n) each,
        O(shards) in all."""
        bound = self._due_bound()
        until = "-inf" if bound is None else bound
        return part_ops(self._parts(), until)

    def _read(self, replies: list[Any], parts: bool = True) -> tuple[bool, dict[str, Any]]:
        """The pause flag and the sizes; a failed read of the parts leaves its gauges out
        (and the shards' dead letters out of ``dead``)."""
        tail: list[Any] = []
        if parts:
            count = part_replies(len(self._parts()))
            replies, tail = replies[:-count], replies[-count:]
        paused = replies[-CRAWL_REPLIES - 1]
        crawl = crawl_sizes(replies[-CRAWL_REPLIES:])
        sizes: dict[str, Any] = {"dead": crawl.dead, "runnable": crawl.runnable}
        if tail:
            sizes.update(self._part_gauges(tail, crawl))
        # the lifecycle (finished) as status tells it: work seen since outranks it
        waiting = any(sizes.get(n) for n in ("queue", "leased", "delayed"))
        sizes["finished"] = int(bool(crawl.finished) and not paused and not waiting)
        return bool(paused), sizes

    def _part_gauges(self, replies: list[Any], crawl: FrontierSizes) -> dict[str, Any]:
        """The frontier sizes and the revisit gauges, every part added up, and ``crawl``'s
        own sizes (its dead letters) added to theirs."""
        n = len(self._parts())
        sizes, revisits = split_replies(replies, n)
        gauges: dict[str, Any] = {}
        if any(isinstance(r, BaseException) for r in sizes):
            logger.debug("Frontier sizes not read: %s", sizes)
        else:
            gauges.update(sizes_of(sizes, n, crawl))
        gauges.update(self._revisit_gauges(revisits))
        return gauges

    def _revisit_gauges(self, replies: list[Any]) -> dict[str, Any]:
        if any(isinstance(r, BaseException) for r in replies):
            logger.debug("Revisit gauges not read: %s", replies)
            return {}
        bound = self._due_bound()
        try:
            gauges = gauges_of(replies, len(self._parts()), bound)
            reply = replies[-1]
            self._server_ms = (int(reply[0]) * 1000 + int(reply[1]) // 1000, time.monotonic())
        except (TypeError, ValueError, IndexError) as exc:
            logger.debug("Revisit gauges not read: %r", exc)
            return {}
        return gauges

    def _cluster_parts(self, crawl: FrontierSizes) -> dict[str, Any]:
        """On a cluster the shards' keys are in other slots than the MULTI of the beat, and
        TIME names no key: the parts' reads go in a pipeline of their own, then TIME of the
        first shard's master. Reads only: a reply lost and sent again counts nothing twice."""
        client = self.io.client
        ops = self._part_ops()
        pipe = client.pipeline(transaction=False)
        for op in ops[:-1]:
            pipe.execute_command(*op.args)
        try:
            replies = execute_timed(client, pipe, self._parts()[0].revisits)
        except redis.RedisError as exc:
            logger.debug("Frontier gauges not read: %s", redact_error(exc, self.io.url))
            return {}
        return self._part_gauges(replies, crawl)

    def _publish(self, beat: Beat, memory: bool = False) -> tuple[bool, dict[str, Any]]:
        """Runs on the Redis thread: one round trip (when no scheduler batch takes it)."""
        assert self.keys is not None
        if self.frontier is None:
            client = self.io.connect()
            self.keys = self.keys.on_cluster(bool(self.io.cluster))
            self.frontier = Frontier(client, self.keys)
        if self._server_ms is None:
            self._learn_server_time()
        # on a cluster a MULTI: redis-py sends a plain pipeline's commands again after a
        # lost reply, which would count these HINCRBYs twice (one slot: MULTI is allowed)
        cluster = is_cluster(self.io.client)
        pipe = self.io.client.pipeline(transaction=cluster)
        for op in self._ops(beat, parts=not cluster):
            pipe.execute_command(*op.args)
        if memory:
            # on its own: a full Redis refuses the writes above, and this must still be said
            self._memory_info()
        paused, sizes = self._read(pipe.execute(), parts=not cluster)
        if cluster:
            sizes.update(self._cluster_parts(FrontierSizes(dead=sizes["dead"])))
        return paused, sizes

    def _rode(self, replies: list[Any], beat: Beat, memory: bool, parts: bool = True) -> None:
        """The beat rode with a scheduler batch: each command's reply, or its error.
        Without ``parts`` (a parked worker's beat) the frontier's gauges are kept as the
        last full beat read them."""
        if memory:
            info = replies.pop()
            if isinstance(info, redis.exceptions.NoPermissionError):
                self._refuse_info(info)
            elif not isinstance(info, BaseException):
                self._check_memory(info)
        # the parts' reads are not the beat's: their failure loses their gauges only
        count = part_replies(len(self._parts())) if parts else 0
        own = replies[:-count] if count else replies
        error = next((r for r in own if isinstance(r, BaseException)), None)
        if error is not None:
            self._failed(Failure(error), beat)
        elif parts:
            self._published(self._read(replies))
        else:
            paused, sizes = self._read(replies, parts=False)
            self._published((paused, {**self.sizes, **sizes}))

    def _memory_info(self) -> None:
        """An ACL user without INFO (``-@dangerous`` denies it) loses the memory check, not
        the heartbeat, the counters and pause with it."""
        try:
            assert self.keys is not None
            infos = [node_info(self.io.client, "memory", key) for key in self._memory_keys()]
        except redis.exceptions.NoPermissionError as exc:
            self._refuse_info(exc)
            return
        for info in infos:
            self._check_memory(info)

    def _memory_keys(self) -> list[str]:
        """A key on each master that holds some of the crawl: the crawl's own, and on a
        cluster one per master holding a shard (DISTCRAWL_SHARDS)."""
        assert self.keys is not None
        keys = [self.keys.queue]
        client = self.io.client
        if not isinstance(client, RedisCluster) or self.config.shards == 1:
            return keys
        seen = {client.get_node_from_key(keys[0]).name}
        for part in self.keys.parts(self.config.shards):
            key = part.queue
            node = client.get_node_from_key(key).name
            if node not in seen:
                seen.add(node)
                keys.append(key)
        return keys

    def _refuse_info(self, exc: BaseException) -> None:
        self._next_memory_check = float("inf")
        logger.warning(
            "Redis refused INFO (%s): the maxmemory check is off; grant +info to this "
            "worker's Redis user to have it (see distcrawl acl)",
            exc,
        )

    def _check_memory(self, info: dict[str, Any]) -> None:
        """Loud before Redis is full: past maxmemory, writes fail (noeviction) or, worse,
        keys are evicted, i.e. queued requests and seen fingerprints silently lost."""
        used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
        policy = str(info.get("maxmemory_policy", "noeviction"))
        if policy != "noeviction" and policy != self._warned_policy:
            self._warned_policy = policy
            logger.error(
                "Redis maxmemory-policy is %s: when Redis is full it evicts keys, which loses "
                "queued requests and seen fingerprints without a word; use noeviction",
                policy,
            )
        if limit and used >= self.config.maxmemory_warn * limit:
            logger.error(
                "Redis memory at %.0f%% of maxmemory (%d of %d bytes; DISTCRAWL_MAXMEMORY_WARN="
                "%s): set DISTCRAWL_MAX_PENDING, use DISTCRAWL_SEEN='bloom', or give Redis more "
                "memory before it refuses writes",
                100 * used / limit,
                used,
                limit,
                self.config.maxmemory_warn,
            )

    def _published(self, result: tuple[bool, dict[str, Any]]) -> None:
        self._busy = False
        paused, self.sizes = result
        scheduler = scheduler_of(self.crawler)
        if scheduler is not None and paused != scheduler.paused:
            scheduler.pause() if paused else scheduler.resume()

    def _failed(self, failure: Any, beat: Beat) -> None:
        """Redis is away: the counts are sent with the next beat instead."""
        self._busy = False
        for name, delta in beat.deltas.items():
            self.sent[name] -= delta
        self.domains.update(beat.domains)
        if failure.check(redis.exceptions.NoPermissionError):
            # not an outage that passes: the heartbeat, totals and pause never work
            if not self._refused:
                self._refused = True
                logger.error(
                    "Heartbeat refused by Redis (%s): the Redis user of REDIS_URL lacks a "
                    "command or key the monitor needs (see distcrawl acl)",
                    redact_text(failure.getErrorMessage(), url_secrets(self.io.url)),
                )
        elif not failure.check(redis.RedisError):
            logger.error(
                "Heartbeat failed: %s",
                redact_text(failure.getErrorMessage(), url_secrets(self.io.url)),
            )

    # -- Prometheus ----------------------------------------------------------------------

    def metrics(self) -> str:
        """This worker's counters and the frontier sizes, in Prometheus' text format."""
        lines = []
        for name, value in counters(self.crawler.stats).items():
            lines += [f"# TYPE distcrawl_{name}_total counter", f"distcrawl_{name}_total {value}"]
        for name, value in sorted(self.sizes.items()):
            lines += [f"# TYPE distcrawl_{name} gauge", f"distcrawl_{name} {value}"]
        scheduler = scheduler_of(self.crawler)
        paused = int(scheduler is not None and scheduler.paused)
        lines += ["# TYPE distcrawl_paused gauge", f"distcrawl_paused {paused}"]
        return "\n".join(lines) + "\n"

    def _listen(self, ports: tuple[int, int]) -> None:
        """Serve /metrics on the first free port of ``ports``; when none is free, say so in
        one line and crawl on without it (a second worker on a host with one fixed port used
        to log a traceback from the spider_opened handler)."""
        from scrapy.utils.reactor import listen_tcp
        from twisted.internet import error
        from twisted.web import resource, server

        monitor = self

        class Metrics(resource.Resource):
            isLeaf = True

            def render_GET(self, request: Any) -> bytes:
                request.setHeader(b"content-type", b"text/plain; version=0.0.4")
                return monitor.metrics().encode()

        # Resource.__init__ is unannotated, and untyped_calls_exclude does not reach a
        # subclass's constructor
        site = server.Site(Metrics())  # type: ignore[no-untyped-call]
        site.noisy = False
        host = self.crawler.settings.get("DISTCRAWL_METRICS_HOST", "127.0.0.1")
        first, last = ports
        try:
            self._metrics_port = listen_tcp([first, last], host, site)  # type: ignore[arg-type,unused-ignore]
        except error.CannotListenError as exc:
            shown = str(first) if first == last else f"{first}-{last}"
            logger.error(
                "Prometheus metrics not served: no free port in DISTCRAWL_METRICS_PORT=%s on "
                "%s (%s); give each worker on a host its own port, or a range such as "
                "[%d, %d]; the crawl goes on without them",
                shown,
                host,
                getattr(exc, "socketError", exc),
                first,
                first + 50,
            )
            return
        logger.info(
            "Prometheus metrics on http://%s:%d/metrics", host, self._metrics_port.getHost().port
        )
