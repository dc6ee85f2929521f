"""What a worker settles before it joins a crawl: its duplicate filter, its connection to
Redis, the frontier's layout, and whether Redis keeps what the crawl stores.

Each is a refusal or a warning that must come before the first lease: a worker that filters
against another set, or lays the frontier out otherwise, corrupts the crawl quietly instead of
failing (layout.py), and a Redis without an append-only file loses the frontier on a restart
with nothing said until then.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import redis
from redis.cluster import RedisCluster
from scrapy import Spider
from scrapy.dupefilters import BaseDupeFilter
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.misc import build_from_crawler, load_object

from distcrawl.codec.politeness import politeness
from distcrawl.codec.serialize import RequestCodec
from distcrawl.config import DistcrawlConfig
from distcrawl.config._convert import ConfigError
from distcrawl.dupefilter import RedisDupeFilter
from distcrawl.engine.batch import Runner
from distcrawl.engine.idle import IDLE_REAP_INTERVAL
from distcrawl.engine.liveness import Liveness
from distcrawl.model import lua
from distcrawl.model.connection import RedisIO, node_info, redact_url
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.layout import (
    GENERATION,
    LEGACY_SCRAPY_REDIS,
    LEGACY_SEEN,
    Joined,
    Layout,
    LayoutMismatch,
    class_path,
)
from distcrawl.model.shards import Shards

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

#: the liveness thread beats once no batch carried a beat for this many heartbeat intervals
#: (the worker timeout is at least three)
OWN_BEAT_AFTER = 1.5

#: the scheduler's logger: these are its messages, filtered and configured as such
logger = logging.getLogger("distcrawl.scheduler")

REDIS_DUPEFILTER = "distcrawl.dupefilter.RedisDupeFilter"


def dupefilter_for(crawler: Crawler) -> RedisDupeFilter | BaseDupeFilter:
    """DUPEFILTER_CLASS as Scrapy users mean it: distcrawl's (or a subclass) filters
    against the shared seen-set, ``BaseDupeFilter`` turns filtering off, Scrapy's default
    left in place means distcrawl's; any other class cannot see what other workers saw."""
    settings = crawler.settings
    path = settings["DUPEFILTER_CLASS"]
    cls = load_object(path)
    if isinstance(cls, type) and issubclass(cls, RedisDupeFilter):
        return build_from_crawler(cls, crawler)
    if cls is BaseDupeFilter:
        return BaseDupeFilter()
    if settings.getpriority("DUPEFILTER_CLASS") == SETTINGS_PRIORITIES["default"]:
        return build_from_crawler(RedisDupeFilter, crawler)
    raise ConfigError(
        f"DUPEFILTER_CLASS={path!r}: distcrawl's scheduler filters duplicates against the "
        f"shared seen-set with {REDIS_DUPEFILTER} (or a subclass of it); set "
        "scrapy.dupefilters.BaseDupeFilter to turn filtering off"
    )


def politeness_bound(config: DistcrawlConfig, settings: Any) -> str:
    """The start-up line's word on politeness: the bound it sets for the whole cluster.

    Scrapy's DOWNLOAD_DELAY and CONCURRENT_REQUESTS_PER_DOMAIN hold per process; with
    distcrawl they hold for all workers together, so the ``DOWNLOAD_DELAY = 1`` and
    ``CONCURRENT_REQUESTS_PER_DOMAIN = 1`` of ``scrapy startproject``'s template make a
    cluster of any size crawl a site at one page a second. Said in pages per second, with
    the settings it comes from, so nobody has to find that out from a slow crawl.
    """
    unit = "IP" if config.slots_by_ip else "domain"
    delay_from = (
        "DISTCRAWL_DOMAIN_DELAY"
        if settings.get("DISTCRAWL_DOMAIN_DELAY") is not None
        else "DOWNLOAD_DELAY"
    )
    if settings.get("DISTCRAWL_DOMAIN_CONCURRENCY") is not None:
        concurrency_from = "DISTCRAWL_DOMAIN_CONCURRENCY"
    elif config.slots_by_ip:
        concurrency_from = "CONCURRENT_REQUESTS_PER_IP"
    else:
        concurrency_from = "CONCURRENT_REQUESTS_PER_DOMAIN"
    sources = (
        f"{delay_from}={config.domain_delay:g}, {concurrency_from}={config.domain_concurrency}"
    )
    if config.domain_delay > 0:
        rate = 1.0 / config.domain_delay
        shown = f"{rate:.1f}" if rate >= 1 else f"{rate:.2g}"
        bound = f"at most {shown} page/s per {unit}"
    else:
        bound = f"at most {config.domain_concurrency} requests at a time per {unit}"
    slower = []
    if config.robots.obey:
        slower.append("a robots.txt Crawl-delay")
    if config.throttle.target_concurrency:
        slower.append("AutoThrottle")
    more = f"; {' or '.join(slower)} may lower it" if slower else ""
    if config.slot_overrides:
        more += f"; DOWNLOAD_SLOTS sets its own for {len(config.slot_overrides)} slot(s)"
    return f"politeness is cluster-wide: {bound} for all workers together ({sources}){more}"


def check_layout(frontier: Frontier, config: DistcrawlConfig, crawler: Crawler) -> Joined:
    """Join the crawl only if this worker lays the frontier out as the crawl does
    (distcrawl/model/layout.py); on the Redis thread, before anything is leased. Returns the crawl
    joined, whose generation the batches then watch, and whether it has a legacy seen-set
    (``<ns>:meta``, written by ``distcrawl import``), read in the same round trip: decided
    once, so that a crawl without one pays nothing per request."""
    mine = Layout(
        shards=config.shards,
        seen=config.seen,
        serializer=config.serializer,
        fingerprinter=class_path(crawler.request_fingerprinter),
    )
    stored = frontier.record_layout(mine.fields())
    differences = mine.differences(stored)
    if differences:
        raise LayoutMismatch(frontier.keys.namespace, differences)
    legacy = stored.get(LEGACY_SEEN)
    if legacy is not None and legacy != LEGACY_SCRAPY_REDIS:
        logger.warning(
            "%s: unknown legacy seen-set %r (this version knows %r): not checked",
            frontier.keys.meta,
            legacy[:100],
            LEGACY_SCRAPY_REDIS,
        )
    if legacy == LEGACY_SCRAPY_REDIS:
        logger.info(
            "Frontier %r has a legacy seen-set (%s, scrapy-redis fingerprints): requests "
            "crawled before the import are not fetched again",
            frontier.keys.namespace,
            frontier.keys.legacy_seen,
        )
    return Joined(mine, stored.get(GENERATION), legacy_seen=legacy == LEGACY_SCRAPY_REDIS)


def check_scripts(frontier: Frontier, spider: Spider | None) -> None:
    """Settle how this worker runs the frontier's scripts, before anything is leased: FCALL
    when Redis holds distcrawl's function library of this version (``distcrawl setup``),
    EVALSHA when it holds none; said once. Raises lua.LibraryMismatch for another version,
    whose functions would treat the frontier as another distcrawl does, and
    lua.ScriptsRefused when neither way is open to this user (a ``distcrawl acl`` worker
    before ``distcrawl setup``)."""
    if frontier.scripts.mode.resolve(frontier.client):
        logger.info(
            "Lua: distcrawl's function library %s (FCALL)",
            lua.library_version(),
            extra={"spider": spider},
        )
    else:
        lua.check_evalsha(frontier.client)
        logger.info(
            "Lua: scripts sent with EVALSHA (Redis holds no function library of distcrawl; "
            "on Redis 7+ `distcrawl setup` loads it, so that workers need no EVALSHA)",
            extra={"spider": spider},
        )


def check_durability(
    client: redis.Redis,
    keys: FrontierKeys,
    redis_url: str,
    spider: Spider | None,
    shards: Sequence[FrontierKeys] = (),
) -> None:
    """Say at start when Redis keeps no append-only file: a restart then rolls the
    frontier back to its last snapshot (or empties it), which loses the requests queued
    since and brings back pages already acknowledged. Nothing else warns about it
    until it happens. On a cluster, every master that holds a shard of the crawl is asked."""
    nodes: dict[str, FrontierKeys] = {}
    for of in (keys, *shards):
        name = client.get_node_from_key(of.queue).name if isinstance(client, RedisCluster) else ""
        nodes.setdefault(name, of)
    try:
        off = [
            of
            for of in nodes.values()
            if node_info(client, "persistence", of.queue).get("aof_enabled") in (0, "0")
        ]
    except redis.ResponseError:  # INFO not granted: nothing to say
        return
    if off:
        logger.warning(
            "Redis at %s keeps no append-only file (appendonly no): if it restarts, the "
            "frontier goes back to its last snapshot, or is empty without one; requests "
            "queued since are lost. Set appendonly yes (appendfsync everysec) for a crawl "
            "you cannot start over",
            redact_url(redis_url),
            extra={"spider": spider},
        )


class Connected(NamedTuple):
    """What a worker can make only once Redis answers: the key names depend on whether
    REDIS_URL is a cluster."""

    keys: FrontierKeys
    frontier: Frontier
    liveness: Liveness
    runner: Runner
    #: the frontier's shards (``frontier`` is the crawl's own keys; with one shard, both)
    shards: Shards


def connect(
    io: RedisIO,
    keys: FrontierKeys,
    codec: RequestCodec,
    config: DistcrawlConfig,
    tag: str,
    spider: Spider | None,
) -> Connected:
    """Make the client (a RedisCluster when REDIS_URL is a cluster node: it loads the
    slot map), the keys named for it, the Frontier, the liveness beat and the batch runner;
    on the Redis thread, never the reactor's."""
    client = io.connect()
    keys = keys.on_cluster(bool(io.cluster)).sharded(config.shards)
    if keys.cluster:
        logger.info(
            "%s is a Redis Cluster node: every key of %r is in the hash slot of %s",
            redact_url(config.redis_url),
            keys.namespace,
            keys.start_urls,
            extra={"spider": spider},
        )
    limits = politeness(config)
    if config.shards > 1:
        # each shard holds a share of the queue and of the seen URLs: the pending cap and
        # the Bloom filter's capacity are the crawl's, divided among them
        limits = dataclasses.replace(limits, max_pending=-(-limits.max_pending // config.shards))

    def frontier_of(of: FrontierKeys) -> Frontier:
        return Frontier(
            client,
            of,
            limits,
            seen=config.seen,
            bloom_capacity=-(-config.bloom_capacity // config.shards),
            bloom_error_rate=config.bloom_error_rate,
            tag=tag,
        )

    frontier = frontier_of(keys)
    if config.shards == 1:
        shards = Shards.single(frontier)
    else:
        shards = Shards(frontier, [frontier_of(part) for part in keys.parts(config.shards)])
    liveness = Liveness(
        config.redis_url,
        keys,
        tag,
        interval=config.lease.heartbeat,
        socket_timeout=config.socket_timeout,
        cluster=io.cluster,
        # batches carry the beats (Batch.beat): the thread is the fallback
        own_after=OWN_BEAT_AFTER * config.lease.heartbeat,
        shards=[f.keys for f in shards.parts],
        # parked (idle.py): three beats within the worker timeout, plain ZADDs
        idle_interval=config.lease.worker_timeout / 3,
    )
    options: dict[str, Any] = {
        "lease_ms": int(config.lease.timeout * 1000),
        "worker_timeout_ms": int(config.lease.worker_timeout * 1000),
        "schemes": config.allowed_schemes,
        "liveness": liveness,
        "reclaim_ms": int(config.lease.reclaim_interval * 1000),
        "idle_reap_ms": int(IDLE_REAP_INTERVAL * 1000),
        "webhook": config.finish_webhook is not None,
    }
    if config.wait_replicas and not shards.sharded:
        logger.warning(
            "DISTCRAWL_WAIT_REPLICAS=%d has no effect with one shard: a commit is one "
            "script, replicated whole, acknowledgement and children together",
            config.wait_replicas,
            extra={"spider": spider},
        )
    runner = Runner(
        frontier,
        codec,
        shards=shards,
        wait_replicas=config.wait_replicas if shards.sharded else 0,
        wait_replicas_ms=int(config.wait_replicas_timeout * 1000),
        **options,
    )
    return Connected(keys, frontier, liveness, runner, shards)
