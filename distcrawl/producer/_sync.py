"""The synchronous :class:`Producer`: its settings and spider, connection, pushing to either
target, and watching the crawl (status, idleness, dead letters)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request, Spider
from scrapy.settings import BaseSettings, Settings
from scrapy.spiderloader import get_spider_loader
from scrapy.utils.project import get_project_settings

from distcrawl.codec import deadletter
from distcrawl.codec.entries import (
    EntryLike,
    EntryMaker,
    EntryOptions,
    Made,
    Refused,
    check_raw,
    entry_bytes,
    fields_of,
    push_key,
)
from distcrawl.codec.serialize import RequestCodec
from distcrawl.codec.start_urls import validate_url
from distcrawl.config import DistcrawlConfig
from distcrawl.dupefilter import FINGERPRINT_BYTES
from distcrawl.model import dashboard
from distcrawl.model.connection import is_cluster, make_redis
from distcrawl.model.frontier import Frontier, shard_frontiers
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.shards import Shards, shard_of_url
from distcrawl.producer._commit import Committer
from distcrawl.producer._results import (
    Outcome,
    ProducerError,
    PushResult,
    RedriveResult,
    _url_of,
    dead_record,
)

if TYPE_CHECKING:
    from scrapy.utils.request import RequestFingerprinterProtocol
    from typing_extensions import Self, Unpack

#: the package's name, as before it was split (logging configurations name it)
logger = logging.getLogger("distcrawl.producer")

TARGETS = ("queue", "start_urls")
#: entries per LPUSH inside the one start_urls pipeline
LPUSH_CHUNK = 1000


def _settings(settings: BaseSettings | Mapping[str, Any] | None) -> Settings:
    """The project's settings, or those given: a mapping goes over Scrapy's defaults (not
    the project's), a BaseSettings keeps its values and their priorities."""
    if settings is None:
        return get_project_settings()
    if isinstance(settings, Settings):
        return settings
    if isinstance(settings, BaseSettings):
        out = Settings()
        out.update(settings)
        return out
    return Settings(dict(settings))


def _spider_class(settings: BaseSettings, name: str) -> tuple[type[Spider] | None, str]:
    """The spider class ``name`` of the settings' SPIDER_MODULES, or None and why not."""
    modules = ", ".join(settings.getlist("SPIDER_MODULES")) or "none"
    try:
        return get_spider_loader(settings).load(name), ""
    except KeyError:
        return None, f"spider {name!r} is not in SPIDER_MODULES ({modules})"
    except Exception as exc:  # a spider module that does not import here
        return None, f"cannot load the spiders of SPIDER_MODULES ({modules}): {exc!r}"


class Producer:
    """Push entries to one crawl and watch it; synchronous (see :class:`AsyncProducer`).

    ``client`` is a redis-py client, or a function that makes one on first use (no I/O
    happens here). ``spider`` names the spider (its ``custom_settings`` apply and, for the
    "queue" target, its ``make_request_from_data`` runs); ``namespace`` overrides
    DISTCRAWL_NAMESPACE, which defaults to the spider name. ``spider_kwargs`` are the
    spider's arguments (``scrapy crawl -a``), when its hook depends on them.
    """

    def __init__(
        self,
        client: redis.Redis | Callable[[], redis.Redis],
        spider: str = "site",
        settings: BaseSettings | Mapping[str, Any] | None = None,
        *,
        target: str = "queue",
        namespace: str | None = None,
        spider_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if target not in TARGETS:
            raise ValueError(f"target={target!r}: expected one of {', '.join(TARGETS)}")
        self.target = target
        self.spider_name = spider
        base = _settings(settings)
        self._spidercls, why = _spider_class(base, spider)
        if self._spidercls is None and target == "queue":
            raise ProducerError(
                f"{why}: the 'queue' target makes requests with the spider's own code; set "
                "SCRAPY_SETTINGS_MODULE to the project's settings, or push with "
                "target='start_urls'"
            )
        if self._spidercls is None:
            # the workers apply the spider's custom_settings; this producer cannot
            logger.debug("%s: pushing with the settings alone", why)
        self.settings = base.copy()
        if self._spidercls is not None:
            self._spidercls.update_settings(self.settings)
        #: the crawl's settings, parsed once (ConfigError names a bad setting)
        self.config = DistcrawlConfig.from_settings(self.settings)
        self.keys = FrontierKeys.of_crawl(spider, namespace or self.config.namespace)
        self._spider_kwargs = dict(spider_kwargs or {})
        self._connect = client if callable(client) else (lambda: client)
        self._client: redis.Redis | None = None
        self._frontier: Frontier | None = None
        self._parts: list[Frontier] | None = None
        self._watching: Shards | None = None
        self._maker: EntryMaker | None = None
        self._objects: EntryMaker | None = None
        self._committer = Committer(self.config, lambda: self.frontier, lambda: self.parts)
        #: the room the pending cap left at the last push to start_urls (None: no cap)
        self.last_room: int | None = None

    @classmethod
    def from_url(
        cls,
        redis_url: str | None = None,
        spider: str = "site",
        settings: BaseSettings | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Producer:
        """A producer with its own client for ``redis_url`` (default: the REDIS_URL
        setting), made on first use with DISTCRAWL_SOCKET_TIMEOUT and
        DISTCRAWL_REDIS_CLUSTER as a worker makes it."""
        holder: list[Producer] = []

        def connect() -> redis.Redis:
            config = holder[0].config
            return make_redis(
                redis_url or config.redis_url,
                socket_timeout=config.socket_timeout,
                cluster=config.redis_cluster,
            )

        producer = cls(connect, spider, settings, **kwargs)
        holder.append(producer)
        return producer

    # -- connection ------------------------------------------------------------------

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = self._connect()
        return self._client

    @property
    def frontier(self) -> Frontier:
        if self._frontier is None:
            client = self.client
            keys = self.keys.on_cluster(is_cluster(client))
            self._frontier = Frontier(
                client,
                keys,
                seen=self.config.seen,
                bloom_capacity=self.config.bloom_capacity,
                bloom_error_rate=self.config.bloom_error_rate,
            )
        return self._frontier

    @property
    def parts(self) -> list[Frontier]:
        """The Frontier of each shard requests are pushed to, by DISTCRAWL_SHARDS (checked
        against the crawl's layout record before the first push): ``[frontier]`` with one
        shard, whose keys are the crawl's own."""
        if self._parts is None:
            self._parts = shard_frontiers(self.frontier, self.config.shards)
        return self._parts

    def _watched(self) -> Shards:
        """The crawl's keys and the shards its layout record names, for watching it: a
        producer of start URLs need not be given DISTCRAWL_SHARDS. Kept once the record
        names shards (their count never changes while the crawl lasts)."""
        if self._watching is None:
            parts = shard_frontiers(self.frontier)
            if len(parts) == 1:
                return Shards.single(self.frontier)
            self._watching = Shards(self.frontier, parts)
        return self._watching

    def close(self) -> None:
        self._committer.close()
        if self._client is not None:
            self._client.close()
        self._client = self._frontier = None
        self._parts = self._watching = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pushing ---------------------------------------------------------------------

    def push(
        self,
        url: str,
        priority: int = 0,
        meta: Mapping[str, Any] | None = None,
        callback: str | None = None,
        *,
        push_id: str | None = None,
        **options: Unpack[EntryOptions],
    ) -> PushResult:
        """Push one URL; ``priority`` is the request's (higher first, as in Scrapy),
        ``callback`` the name of a spider method (target "queue" only). Raises
        ``redis.RedisError`` when Redis cannot be reached: pushing again is safe.

        ``push_id`` names this push, so that sending it again is a no-op even for a
        ``dont_filter`` request (see :meth:`push_many`)."""
        fields = fields_of(url, priority=priority, meta=meta, callback=callback, **options)
        return self.push_many([fields], push_id=push_id)[0]

    def push_many(
        self, entries: Iterable[EntryLike], *, atomic: bool = False, push_id: str | None = None
    ) -> list[PushResult]:
        """Push entries (each a start_urls entry's text or bytes, or its fields as a mapping),
        in batches of DISTCRAWL_PUSH_BATCH_SIZE sent in one pipeline; a result per entry, in
        order. A ``redis.RedisError`` leaves earlier batches stored: pushing everything again
        stores nothing twice.

        A ``dont_filter`` request has no fingerprint: as in Scrapy, each push of it is a
        request of its own (a deliberate fetch again). ``push_id`` (a task id, any string
        unique to this push) tells a push sent again from a new one: the same entries at the
        same positions under the same ``push_id`` are stored once, their second sending
        reported SEEN; the Celery tasks pass their task id. Target "queue" only: the
        "start_urls" target has no seen check at the producer.

        ``atomic`` (target "start_urls" only): either every valid entry is pushed or, when
        the pending cap leaves too little room for all of them, none (``distcrawl push``)."""
        if atomic and self.target != "start_urls":
            raise ValueError("atomic=True is for the 'start_urls' target")
        if self.target == "start_urls":
            return self._push_start_urls(entries, atomic)
        maker = self._entry_maker()

        def made() -> Iterator[Made | PushResult]:
            for at, item in enumerate(entries):
                try:
                    raw, callback = entry_bytes(item)
                    once = None if push_id is None else push_key(push_id, at, raw, callback)
                    yield maker.make(raw, callback, once)
                except Refused as exc:
                    yield PushResult(Outcome.REFUSED, _url_of(item), str(exc))

        return self._committer.store(made())

    def push_requests(
        self,
        requests: Iterable[Mapping[str, Any]],
        once: Sequence[bytes] | None = None,
    ) -> list[PushResult]:
        """Store requests given as dicts of Scrapy's ``Request.to_dict`` (another frontier's
        queue: ``distcrawl import scrapy-redis``), target "queue" only; a result per request.

        Each is rebuilt by the rules a worker applies to a payload read from Redis (its
        callback and errback by DISTCRAWL_ALLOWED_CALLBACKS, its class only if loaded), then
        stored like a pushed entry: its fingerprint checked against the seen-set atomically
        with the push, so storing the same requests again stores nothing twice (but those
        with ``dont_filter``, which have no fingerprint). ``once``, one per request, stands
        in the seen-set for the fingerprint of a request that has none, as push_many's
        ``push_id`` does: the same requests stored again with the same ``once`` store nothing
        twice, ``dont_filter`` or not (the import sends a page again after a lost reply)."""
        if self.target != "queue":
            raise ValueError("push_requests is for the 'queue' target")
        maker = self._entry_maker()

        def made() -> Iterator[Made | PushResult]:
            for at, data in enumerate(requests):
                try:
                    yield maker.make_from_dict(data, None if once is None else once[at])
                except Refused as exc:
                    yield PushResult(Outcome.REFUSED, _url_of(data), str(exc))

        return self._committer.store(made())

    @property
    def fingerprinter(self) -> RequestFingerprinterProtocol:
        """The crawl's REQUEST_FINGERPRINTER_CLASS, made with the spider's settings as a
        worker makes it; the seen-set holds the first FINGERPRINT_BYTES of its fingerprints."""
        return self._spider_objects().fingerprinter

    def fingerprint(self, request: Request) -> bytes:
        """What the seen-set holds for ``request``, as a worker computes it (no Redis)."""
        return self.fingerprinter.fingerprint(request)[:FINGERPRINT_BYTES]

    def mark_seen(self, urls: Iterable[str]) -> int:
        """Add the fingerprints of GETs of ``urls`` to the seen-set without queueing them:
        pages crawled elsewhere (by the crawler this one replaces), which the workers must
        then drop as duplicates when a link leads there again. Returns how many were new.
        Each goes to the seen-set of its URL's shard, where the workers check that URL."""
        self._entry_maker()  # the layout checked: these fingerprints are the crawl's
        parts = self.parts
        by_shard: dict[int, list[bytes]] = {}
        for url in urls:
            fp = self.fingerprint(Request(url))
            by_shard.setdefault(shard_of_url(url, len(parts)), []).append(fp)
        return sum(sum(parts[shard].add_seen(fps)) for shard, fps in sorted(by_shard.items()))

    def _spider_objects(self) -> EntryMaker:
        """The spider, fingerprinter and codec, made once (nothing written to Redis)."""
        if self._objects is None:
            if self._spidercls is None:
                raise ProducerError(f"spider {self.spider_name!r} is not in SPIDER_MODULES")
            self._objects = EntryMaker(
                self._spidercls, self.settings, self.config, self._spider_kwargs
            )
        return self._objects

    def _entry_maker(self) -> EntryMaker:
        """The spider, fingerprinter and codec, made once; the layout checked once."""
        if self._maker is None:
            maker = self._spider_objects()
            frontier = self.frontier
            mine = maker.layout()
            differences = mine.differences(frontier.record_layout(mine.fields()))
            if differences:
                raise ProducerError(
                    f"this producer's settings disagree with the frontier "
                    f"{frontier.keys.namespace!r}: {'; '.join(differences)}. Give it the "
                    "crawl's settings (SCRAPY_SETTINGS_MODULE, or settings=...)"
                )
            self._maker = maker
        return self._maker

    def _push_start_urls(self, entries: Iterable[EntryLike], atomic: bool) -> list[PushResult]:
        results: list[PushResult] = []
        valid: list[tuple[int, bytes]] = []
        for item in entries:
            try:
                raw, callback = entry_bytes(item)
                if callback is not None:
                    raise Refused("a start_urls entry cannot name a callback (use target 'queue')")
                url = check_raw(raw, self.config)
            except Refused as exc:
                results.append(PushResult(Outcome.REFUSED, _url_of(item), str(exc)))
                continue
            valid.append((len(results), raw))
            results.append(PushResult(Outcome.ACCEPTED, url))
        if not valid:
            return results
        room = self.last_room = self.frontier.pending_room()
        take = len(valid) if room is None else min(room, len(valid))
        if atomic and take < len(valid):
            take = 0
        for at, _ in valid[take:]:
            results[at] = PushResult(Outcome.FULL, results[at].url, "DISTCRAWL_MAX_PENDING reached")
        raws = [raw for _, raw in valid[:take]]
        if raws:
            # LPUSH in input order: workers take the oldest (tail) first. MULTI/EXEC: either
            # every entry is pushed or none.
            pipe = self.frontier.client.pipeline(transaction=True)
            for i in range(0, len(raws), LPUSH_CHUNK):
                pipe.lpush(self.frontier.keys.start_urls, *raws[i : i + LPUSH_CHUNK])
            pipe.execute()
        return results

    def pending_room(self) -> int | None:
        """How many more entries the pending cap allows (None: no cap published)."""
        return self.frontier.pending_room()

    # -- watching --------------------------------------------------------------------

    def status(self, stale_after: float = dashboard.STALE_AFTER) -> dict[str, Any]:
        """The data of ``distcrawl status --json``: sizes, totals, workers, domains."""
        return dashboard.snapshot(self.frontier, stale_after)

    def idle(self) -> bool:
        """No start URL waiting or claimed, nothing queued, leased or waiting to be retried:
        every worker is idle (a worker holds the leases of what it works on until everything
        it produced is stored). One transaction, so its reads agree; in a sharded crawl one
        per shard, read as the workers read them before they close (Shards.drained)."""
        d = self._watched().drained()
        waiting = d.next_retry_ms is not None  # a retry waits in ``delayed``, due or not
        return not (d.start_urls or d.claimants or d.queued or d.leased or waiting)

    def wait_until_idle(self, timeout: float, poll: float = 0.25) -> None:
        """Return once the crawl is idle (:meth:`idle`) in two looks ``poll`` apart;
        TimeoutError after ``timeout`` seconds, the sizes in its message."""
        deadline = time.monotonic() + timeout
        before = False
        while True:
            now = self.idle()
            if now and before:
                return
            before = now
            left = deadline - time.monotonic()
            if left <= 0:
                sizes = self._watched().sizes()
                raise TimeoutError(
                    f"crawl {self.keys.namespace!r} not idle after {timeout}s: {sizes}"
                )
            time.sleep(min(poll, left))

    def dead_letters(self, limit: int = 20) -> list[dict[str, Any]]:
        """Dead-letter records, newest first (``limit`` 0: all), as ``distcrawl dead list
        --json`` shows them; what is not a record comes back as ``{"raw": text, ...}``."""
        key = self.frontier.keys.dead
        raws: list[bytes] = self.frontier.client.lrange(key, 0, limit - 1 if limit else -1)  # type: ignore[assignment]
        return [dead_record(raw) for raw in raws]

    def dead_count(self) -> int:
        return int(self.frontier.client.llen(self.frontier.keys.dead))

    def redrive(
        self,
        *,
        error: str | None = None,
        domain: str | None = None,
        source: str | None = None,
        serializer: str | None = None,
    ) -> RedriveResult:
        """Put the matching dead letters back to work (deadletter.py); ``serializer``
        defaults to DISTCRAWL_SERIALIZER. A record holding only its URL becomes the
        request the spider makes of that URL (its ``make_request_from_data``, as for a start
        URL) when this producer has the spider's code; else a plain GET of the URL.

        In a sharded crawl (the shards its layout record names) each request goes back to
        the shard of its URL, in two steps per page: see :func:`deadletter.redrive`."""
        serializer = serializer or self.config.serializer
        if self._spidercls is None:
            codec = RequestCodec(serializer)
            rebuild = None
        else:
            maker = self._spider_objects()
            codec = RequestCodec(
                serializer, maker.spider, allowed_callbacks=self.config.allowed_callbacks
            )
            schemes = self.config.allowed_schemes

            def rebuild(data: dict[str, Any]) -> Request:
                # a record's URL is a request's, but the record is text anyone could LPUSH
                return maker.request_of({**data, "url": validate_url(data["url"], schemes)})

        moved, unusable = deadletter.redrive(
            self.frontier,
            codec,
            error=error,
            domain=domain,
            source=source,
            rebuild=rebuild,
            shards=shard_frontiers(self.frontier),
        )
        return RedriveResult(moved, unusable)
