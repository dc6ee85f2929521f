"""Every distcrawl setting, read once into a frozen object.

Components never read ``crawler.settings`` for distcrawl values themselves: they get a
:class:`DistcrawlConfig`, so a bad value fails once, at start-up, with the name of the
setting that holds it, instead of half-way through a crawl in whichever component
happened to read it first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from scrapy.settings import BaseSettings

from distcrawl.config._convert import (
    ConfigError,
    _at_least,
    _bool,
    _fraction,
    _get,
    _integer,
    _optional_float,
    _optional_names,
    _positive,
    _probability,
    _seconds,
    cluster_mode,
)
from distcrawl.config.backoff import RetrySettings, retry_settings
from distcrawl.config.recrawl import RecrawlSettings, recrawl_settings
from distcrawl.model.lua import SEEN_MODES
from distcrawl.model.names import MAX_SHARDS, NamespaceError, check_namespace
from distcrawl.model.redact import redact_url
from distcrawl.model.seen import DEFAULT_CAPACITY, DEFAULT_ERROR_RATE

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: the time a page takes at the site (s) that a worker's prefetch is sized for: its engine
#: sends CONCURRENT_REQUESTS x DISTCRAWL_FLUSH_INTERVAL / PAGE_TIME requests between two
#: batches (two engines' worth at the default 0.2 s). A faster site makes the worker
#: CPU-bound, where its engine, not Redis, sets the pace
PAGE_TIME = 0.1
SERIALIZERS = ("msgpack", "json", "pickle")

#: where a frozen settings object keeps the config parsed from it
_CACHE_ATTRIBUTE = "_distcrawl_config"


def _shard_count(raw: Any) -> int:
    value = int(raw)
    if not 1 <= value <= MAX_SHARDS:
        raise ValueError(f"must be 1 to {MAX_SHARDS}")
    return value


def _port_range(raw: Any) -> tuple[int, int]:
    """A port, or a range ``[first, last]`` tried in order as Scrapy's TELNETCONSOLE_PORT
    is (so that several workers on one host each find one); ``"9410,9420"`` from ``-s``."""
    if isinstance(raw, str):  # "9410", "9410,9420", "[9410, 9420]"
        raw = [part for part in raw.strip("[]() ").replace(" ", "").split(",") if part]
    values = [int(raw)] if not isinstance(raw, list | tuple) else [int(v) for v in raw]
    if len(values) == 1:
        values *= 2
    if len(values) != 2 or not 0 <= values[0] <= values[1] <= 65535:
        raise ValueError("expected a port or a range [first, last] of ports 0-65535")
    return values[0], values[1]


def webhook_url(settings: BaseSettings) -> str | None:
    """DISTCRAWL_FINISH_WEBHOOK: an http(s) URL, or None. Shown redacted in the error."""
    raw = settings.get("DISTCRAWL_FINISH_WEBHOOK")
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str) or urlsplit(raw).scheme not in ("http", "https"):
        shown = redact_url(raw) if isinstance(raw, str) else repr(raw)
        raise ConfigError(f"DISTCRAWL_FINISH_WEBHOOK={shown}: expected an http(s) URL")
    return raw


def allowed_schemes(settings: BaseSettings) -> tuple[str, ...]:
    """DISTCRAWL_ALLOWED_SCHEMES, lower-cased; a function of its own because the add-on
    needs it before the config is built (to keep only the download handlers allowed)."""
    raw = settings.get("DISTCRAWL_ALLOWED_SCHEMES")
    schemes = settings.getlist("DISTCRAWL_ALLOWED_SCHEMES", list(DistcrawlConfig.allowed_schemes))
    if not schemes:
        raise ConfigError("DISTCRAWL_ALLOWED_SCHEMES=[]: at least one scheme is needed")
    if not all(isinstance(s, str) and s.strip() for s in schemes):
        raise ConfigError(f"DISTCRAWL_ALLOWED_SCHEMES={raw!r}: expected a list of schemes")
    return tuple(s.strip().lower() for s in schemes)


@dataclass(frozen=True)
class LeaseSettings:
    """How long a worker holds the requests it leased, and when they are given back: a lease
    not renewed within ``timeout`` expires (expired ones are reclaimed every
    ``reclaim_interval``), and a worker whose liveness beats (every ``heartbeat`` seconds)
    are older than ``worker_timeout`` is dead, its leases given back at once. One record
    because each bound is checked against another."""

    timeout: float = 30.0
    reclaim_interval: float = 2.0
    heartbeat: float = 1.0
    worker_timeout: float = 10.0


def lease_settings(settings: BaseSettings) -> LeaseSettings:
    """DISTCRAWL_LEASE_TIMEOUT, _RECLAIM_INTERVAL, _HEARTBEAT_INTERVAL, _WORKER_TIMEOUT."""
    timeout = _get(settings, "DISTCRAWL_LEASE_TIMEOUT", LeaseSettings.timeout, _positive(float))
    heartbeat = _get(
        settings, "DISTCRAWL_HEARTBEAT_INTERVAL", LeaseSettings.heartbeat, _positive(float)
    )
    worker_timeout = _get(
        settings, "DISTCRAWL_WORKER_TIMEOUT", LeaseSettings.worker_timeout, _positive(float)
    )
    if worker_timeout < 3 * heartbeat:
        raise ConfigError(
            f"DISTCRAWL_WORKER_TIMEOUT={worker_timeout!r}: must be at least 3 times "
            f"DISTCRAWL_HEARTBEAT_INTERVAL ({heartbeat!r}), or live workers would be "
            "taken for dead"
        )
    reclaim = _get(
        settings,
        "DISTCRAWL_RECLAIM_INTERVAL",
        min(LeaseSettings.reclaim_interval, timeout),
        _positive(float),
    )
    return LeaseSettings(timeout, reclaim, heartbeat, worker_timeout)


@dataclass(frozen=True)
class RobotsSettings:
    """robots.txt, read once per cluster (robots.py) and its Crawl-delay applied cluster-wide
    (politeness.py): whether to obey it, how long a copy is kept, how long the other workers
    wait for the one downloading it, and the longest Crawl-delay taken from it."""

    obey: bool = False
    ttl: float = 86400.0
    probe_timeout: float = 60.0
    crawl_delay_max: float = 30.0


def robots_settings(settings: BaseSettings) -> RobotsSettings:
    """ROBOTSTXT_OBEY, DISTCRAWL_ROBOTS_TTL, _ROBOTS_PROBE_TIMEOUT, _CRAWL_DELAY_MAX."""
    return RobotsSettings(
        obey=_get(settings, "ROBOTSTXT_OBEY", RobotsSettings.obey, _bool),
        ttl=_get(settings, "DISTCRAWL_ROBOTS_TTL", RobotsSettings.ttl, _positive(float)),
        probe_timeout=_get(
            settings,
            "DISTCRAWL_ROBOTS_PROBE_TIMEOUT",
            RobotsSettings.probe_timeout,
            _positive(float),
        ),
        crawl_delay_max=_get(
            settings,
            "DISTCRAWL_CRAWL_DELAY_MAX",
            RobotsSettings.crawl_delay_max,
            _seconds,
        ),
    )


@dataclass(frozen=True)
class ThrottleSettings:
    """The cluster-wide AutoThrottle (commit.lua): a slot whose share of ``codes`` answers
    passes ``share`` slows down, from ``start_delay`` up to ``max_delay``."""

    #: a set: a response is judged by membership
    codes: frozenset[int] = frozenset((429, 503))
    start_delay: float = 1.0
    max_delay: float = 60.0
    #: answers a slot's throttled share is averaged over (an exponential moving average)
    window: int = 30
    #: above this share of 429/503 among its recent answers, a slot is overloaded
    share: float = 0.3
    #: AUTOTHROTTLE_TARGET_CONCURRENCY when AUTOTHROTTLE_ENABLED, else 0 (no latency rule)
    target_concurrency: float = 0.0


def throttle_settings(settings: BaseSettings) -> ThrottleSettings:
    """DISTCRAWL_THROTTLE_*, defaulting to Scrapy's AUTOTHROTTLE_* where it has one."""
    codes = settings.getlist("DISTCRAWL_THROTTLE_HTTP_CODES", sorted(ThrottleSettings.codes))
    try:
        status_codes = frozenset(int(c) for c in codes)
    except (TypeError, ValueError):
        raise ConfigError(
            f"DISTCRAWL_THROTTLE_HTTP_CODES={codes!r}: expected status codes"
        ) from None
    autothrottle = _get(settings, "AUTOTHROTTLE_ENABLED", False, _bool)
    return ThrottleSettings(
        codes=status_codes,
        start_delay=_get(
            settings, "DISTCRAWL_THROTTLE_START_DELAY", ThrottleSettings.start_delay, _seconds
        ),
        max_delay=_get(
            settings,
            "DISTCRAWL_THROTTLE_MAX_DELAY",
            _get(settings, "AUTOTHROTTLE_MAX_DELAY", 60.0, _seconds),
            _seconds,
        ),
        window=_get(settings, "DISTCRAWL_THROTTLE_WINDOW", ThrottleSettings.window, _positive(int)),
        share=_get(settings, "DISTCRAWL_THROTTLE_SHARE", ThrottleSettings.share, _fraction),
        target_concurrency=(
            _get(settings, "AUTOTHROTTLE_TARGET_CONCURRENCY", 1.0, _positive(float))
            if autothrottle
            else 0.0
        ),
    )


def pages_per_place(flush_interval: float) -> int:
    """How many pages one place at a site answers between two batches, at PAGE_TIME a page
    (at least one): the default prefetch is that many engines' worth."""
    return max(1, math.ceil(round(flush_interval / PAGE_TIME, 6)))


@dataclass(frozen=True)
class DistcrawlConfig:
    """The parsed settings; see docs/settings.md for what each one does."""

    redis_url: str = DEFAULT_REDIS_URL
    #: DISTCRAWL_REDIS_CLUSTER: whether REDIS_URL is a node of a Redis Cluster (None: auto)
    redis_cluster: bool | None = None
    namespace: str | None = None
    serializer: str = "msgpack"
    prefetch: int = 32
    #: CONCURRENT_REQUESTS: how many requests the engine downloads at once
    concurrency: int = 16
    #: leases a worker holds at most: prefetched (reserves included), CONCURRENT_REQUESTS in
    #: its engine, and a prefetch more done and waiting for their acknowledgement to be stored
    #: (it goes with the next batch), so that requests whose items cannot be stored (MongoDB
    #: down) hold leasing back
    max_held: int = 80
    #: DISTCRAWL_FLUSH_INTERVAL: seconds between two batches of a busy worker; what a batch
    #: costs Redis is mostly its own (three script calls), not its pages', so a longer one is
    #: less Redis CPU a page and slower news of a place freed or a request queued
    flush_interval: float = 0.2
    push_batch_size: int = 500
    idle_poll_max: float = 1.0
    idle_timeout: float | None = None
    #: seconds a worker stopping on SIGTERM lets its requests in progress finish
    drain_timeout: float = 20.0
    #: DISTCRAWL_FINISH_WEBHOOK: where the crawl's completion event is POSTed (None: nowhere)
    finish_webhook: str | None = None
    flush_on_start: bool = False
    start_urls_batch: int = 100
    start_url_max_bytes: int = 8192
    allowed_schemes: tuple[str, ...] = ("http", "https")
    #: callback and errback names a request read from Redis may name (None: every public
    #: method of the spider, see serialize.py)
    allowed_callbacks: tuple[str, ...] | None = None
    #: meta keys that Scrapy or distcrawl interpret and a start_urls entry may still set
    start_meta_keys: tuple[str, ...] = ()
    local_seen_cache: int = 100_000
    seen: str = "set"
    #: how many shards the frontier is split into (shards.py)
    shards: int = 1
    #: replicas a commit's children must reach before their parent is acknowledged in
    #: another shard, and how long (s) to wait for them at most (sharded_batch.py)
    wait_replicas: int = 0
    wait_replicas_timeout: float = 1.0
    bloom_capacity: int = DEFAULT_CAPACITY
    bloom_error_rate: float = DEFAULT_ERROR_RATE
    socket_timeout: float = 10.0
    #: DISTCRAWL_METRICS_PORT: the ports tried in order, (first, last); None: off
    metrics_port: tuple[int, int] | None = None
    # cluster-wide politeness (see politeness.py)
    domain_delay: float = 0.0
    domain_concurrency: int = 8
    slots_by_ip: bool = False
    #: DOWNLOAD_SLOTS as ((slot, delay or None, concurrency or None), ...)
    slot_overrides: tuple[tuple[str, float | None, int | None], ...] = ()
    max_pending: int | None = None
    max_pending_per_slot: int | None = None
    max_pending_keep_priority: int | None = None
    maxmemory_warn: float = 0.8
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    retry: RetrySettings = field(default_factory=RetrySettings)
    robots: RobotsSettings = field(default_factory=RobotsSettings)
    throttle: ThrottleSettings = field(default_factory=ThrottleSettings)
    #: DISTCRAWL_RECRAWL_*: None when pages are not revisited (recrawl.py)
    recrawl: RecrawlSettings | None = None

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> DistcrawlConfig:
        """The config of ``settings``, parsed once per crawler: a crawler's settings are
        frozen before its components are built, so every component (scheduler, dupefilter,
        middlewares, extension) gets the one object parsed for them."""
        frozen = getattr(settings, "frozen", False)
        cached = getattr(settings, _CACHE_ATTRIBUTE, None) if frozen else None
        if isinstance(cached, cls):
            return cached
        config = cls._parse(settings)
        if frozen:
            setattr(settings, _CACHE_ATTRIBUTE, config)
        return config

    @property
    def reserves_per_place(self) -> int:
        """The reserves a worker may hold per place it holds in a slot (lease.lua): one
        request is in the place, and the reserves are sent in it as it frees until the next
        batch. 2 x pages_per_place - 1 (1 at a 0.1 s interval, 3 at 0.2 s) keeps what a place
        may send a second where the 0.1 s interval had it, 20 pages (one in flight and one
        reserve an interval): a worker holding half a contended slot at 0 ms a page used it."""
        return 2 * pages_per_place(self.flush_interval) - 1

    @classmethod
    def _parse(cls, settings: BaseSettings) -> DistcrawlConfig:
        serializer = _get(settings, "DISTCRAWL_SERIALIZER", cls.serializer, str).lower()
        if serializer not in SERIALIZERS:
            raise ConfigError(
                f"DISTCRAWL_SERIALIZER={serializer!r}: expected one of {', '.join(SERIALIZERS)}"
            )
        seen = _get(settings, "DISTCRAWL_SEEN", cls.seen, str).lower()
        if seen not in SEEN_MODES:
            raise ConfigError(f"DISTCRAWL_SEEN={seen!r}: expected one of {', '.join(SEEN_MODES)}")
        concurrency = _get(settings, "CONCURRENT_REQUESTS", 16, _positive(int))
        flush_interval = _get(
            settings, "DISTCRAWL_FLUSH_INTERVAL", cls.flush_interval, _positive(float)
        )
        # a batch an interval must bring what the engine sends until the next one
        prefetch = _get(
            settings,
            "DISTCRAWL_PREFETCH",
            concurrency * pages_per_place(flush_interval),
            _positive(int),
        )
        namespace = settings.get("DISTCRAWL_NAMESPACE")
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            raise ConfigError(f"DISTCRAWL_NAMESPACE={namespace!r}: expected a non-empty string")
        if namespace is not None:
            try:
                check_namespace(namespace, "DISTCRAWL_NAMESPACE")
            except NamespaceError as exc:
                raise ConfigError(str(exc)) from None
        return cls(
            redis_url=_get(settings, "REDIS_URL", cls.redis_url, str),
            redis_cluster=_get(
                settings, "DISTCRAWL_REDIS_CLUSTER", cls.redis_cluster, cluster_mode
            ),
            namespace=namespace,
            serializer=serializer,
            prefetch=prefetch,
            concurrency=concurrency,
            max_held=2 * prefetch + concurrency,
            flush_interval=flush_interval,
            push_batch_size=_get(
                settings, "DISTCRAWL_PUSH_BATCH_SIZE", cls.push_batch_size, _positive(int)
            ),
            idle_poll_max=_get(
                settings, "DISTCRAWL_IDLE_POLL_MAX", cls.idle_poll_max, _positive(float)
            ),
            idle_timeout=_optional_float(settings, "DISTCRAWL_IDLE_TIMEOUT"),
            drain_timeout=_get(
                settings, "DISTCRAWL_DRAIN_TIMEOUT", cls.drain_timeout, _at_least(0.0, float)
            ),
            finish_webhook=webhook_url(settings),
            flush_on_start=_get(settings, "DISTCRAWL_FLUSH_ON_START", cls.flush_on_start, _bool),
            start_urls_batch=_get(
                settings, "DISTCRAWL_START_URLS_BATCH", cls.start_urls_batch, _positive(int)
            ),
            start_url_max_bytes=_get(
                settings, "DISTCRAWL_START_URL_MAX_BYTES", cls.start_url_max_bytes, _positive(int)
            ),
            allowed_schemes=allowed_schemes(settings),
            allowed_callbacks=_optional_names(settings, "DISTCRAWL_ALLOWED_CALLBACKS"),
            start_meta_keys=_optional_names(settings, "DISTCRAWL_START_META_KEYS") or (),
            local_seen_cache=_get(
                settings, "DISTCRAWL_LOCAL_SEEN_CACHE", cls.local_seen_cache, int
            ),
            seen=seen,
            shards=_get(settings, "DISTCRAWL_SHARDS", cls.shards, _shard_count),
            wait_replicas=_get(
                settings, "DISTCRAWL_WAIT_REPLICAS", cls.wait_replicas, _at_least(0, int)
            ),
            wait_replicas_timeout=_get(
                settings,
                "DISTCRAWL_WAIT_REPLICAS_TIMEOUT",
                cls.wait_replicas_timeout,
                _positive(float),
            ),
            bloom_capacity=_get(
                settings, "DISTCRAWL_BLOOM_CAPACITY", cls.bloom_capacity, _positive(_integer)
            ),
            bloom_error_rate=_get(
                settings, "DISTCRAWL_BLOOM_ERROR_RATE", cls.bloom_error_rate, _probability
            ),
            socket_timeout=_get(
                settings, "DISTCRAWL_SOCKET_TIMEOUT", cls.socket_timeout, _positive(float)
            ),
            metrics_port=_get(settings, "DISTCRAWL_METRICS_PORT", cls.metrics_port, _port_range),
            maxmemory_warn=_get(
                settings, "DISTCRAWL_MAXMEMORY_WARN", cls.maxmemory_warn, _fraction
            ),
            lease=lease_settings(settings),
            retry=retry_settings(settings),
            robots=robots_settings(settings),
            throttle=throttle_settings(settings),
            recrawl=recrawl_settings(settings),
            **_politeness(settings),
        )


def _slot_overrides(settings: BaseSettings) -> tuple[tuple[str, float | None, int | None], ...]:
    out = []
    for slot, values in settings.getdict("DOWNLOAD_SLOTS").items():
        if not isinstance(values, dict):
            raise ConfigError(f"DOWNLOAD_SLOTS[{slot!r}]={values!r}: expected a dict")
        try:
            delay = values.get("delay")
            conc = values.get("concurrency")
            delay = None if delay is None else float(delay)
            conc = None if conc is None else int(conc)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"DOWNLOAD_SLOTS[{slot!r}]={values!r}: {exc}") from None
        if (delay is not None and delay < 0) or (conc is not None and conc < 1):
            raise ConfigError(
                f"DOWNLOAD_SLOTS[{slot!r}]={values!r}: delay must be >= 0, concurrency >= 1"
            )
        out.append((str(slot), delay, conc))
    return tuple(out)


def _politeness(settings: BaseSettings) -> dict[str, Any]:
    """Scrapy's own per-slot settings become cluster-wide limits, with DISTCRAWL_ names
    to override them for distcrawl alone."""
    per_ip = _get(settings, "CONCURRENT_REQUESTS_PER_IP", 0, _at_least(0, int))
    per_domain = _get(settings, "CONCURRENT_REQUESTS_PER_DOMAIN", 8, _positive(int))
    return {
        "domain_delay": _get(
            settings,
            "DISTCRAWL_DOMAIN_DELAY",
            _get(settings, "DOWNLOAD_DELAY", 0.0, _seconds),
            _seconds,
        ),
        "domain_concurrency": _get(
            settings, "DISTCRAWL_DOMAIN_CONCURRENCY", per_ip or per_domain, _positive(int)
        ),
        "slots_by_ip": per_ip > 0,
        "slot_overrides": _slot_overrides(settings),
        "max_pending": _get(
            settings, "DISTCRAWL_MAX_PENDING", DistcrawlConfig.max_pending, _positive(int)
        ),
        "max_pending_per_slot": _get(
            settings,
            "DISTCRAWL_MAX_PENDING_PER_SLOT",
            DistcrawlConfig.max_pending_per_slot,
            _positive(int),
        ),
        "max_pending_keep_priority": _get(
            settings,
            "DISTCRAWL_MAX_PENDING_KEEP_PRIORITY",
            DistcrawlConfig.max_pending_keep_priority,
            int,
        ),
    }
