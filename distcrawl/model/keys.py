"""Every Redis key distcrawl uses, built in this one place.

All keys of one crawl share the ``<namespace>:`` prefix (the spider name by default), so
that ``distcrawl reset`` can remove exactly one crawl and nothing else, and so that the
Lua scripts never build a key themselves: they receive every key through KEYS.

On a Redis Cluster (``cluster=True``) a script may only touch keys of one hash slot, so every
key but ``<ns>:start_urls`` is named ``{<ns>:start_urls}:<suffix>``: Redis hashes only the
part in braces, and a name without braces whole, so all of them land in the slot of
``<ns>:start_urls``, whose name stays the one producers already LPUSH to
(``redis-cli -c lpush <ns>:start_urls URL``). On a single server the names stay
``<ns>:<suffix>``, so existing crawls need no migration.

A crawl with ``DISTCRAWL_SHARDS`` above 1 splits its frontier: each shard's queue, records,
leases, retries, slot state and seen-set are named ``{<tag>}:<suffix>``, one hash tag per
shard (:func:`~distcrawl.model.names.shard_tag`), on a single server as on a cluster, so
that each shard's scripts touch one slot and the shards spread over a cluster's masters. The
crawl-wide keys (start URLs and their claims, dead letters, stats, workers, settings, pause)
keep the crawl's names.

What a crawl may be named, and how a shard's hash tag is chosen, are the rules of
distcrawl/model/names.py: the settings and the ACL check names against them without the keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import overload

from distcrawl.model import lua
from distcrawl.model.names import MAX_SHARDS, check_namespace, glob_escape, shard_tag


class _Key:
    """A fixed key of the crawl, named by the keys' ``prefix`` and its ``suffix``. One
    descriptor serves every such key, so that each is declared by its suffix and what it
    holds (its docstring) alone, and ``script_keys`` tells them from the per-worker or
    per-host keys, which are methods."""

    def __init__(self, suffix: str, doc: str) -> None:
        self.suffix = suffix
        self.__doc__ = doc

    @overload
    def __get__(self, keys: None, owner: type) -> _Key: ...

    @overload
    def __get__(self, keys: FrontierKeys, owner: type) -> str: ...

    def __get__(self, keys: FrontierKeys | None, owner: type) -> _Key | str:
        return self if keys is None else keys._key(self.suffix)


@dataclass(frozen=True)
class FrontierKeys:
    namespace: str
    #: whether the names are those of a Redis Cluster (hash-tagged, see the module docstring)
    cluster: bool = False
    #: the shard these keys name, of ``shards`` (None: the crawl's own keys; see the module
    #: docstring)
    shard: int | None = None
    shards: int = 1

    def __post_init__(self) -> None:
        check_namespace(self.namespace)
        if not 1 <= self.shards <= MAX_SHARDS:
            raise ValueError(f"invalid shard count {self.shards}: 1 to {MAX_SHARDS}")
        if self.shard is not None and not 0 <= self.shard < self.shards:
            raise ValueError(f"invalid shard {self.shard} of {self.shards}")

    @classmethod
    def of_crawl(cls, spider: str, namespace: str | None = None) -> FrontierKeys:
        """The keys of a spider's crawl: DISTCRAWL_NAMESPACE when set, else the spider's
        name; a name refused says which of the two it is."""
        if namespace is not None:
            return cls(check_namespace(namespace, "DISTCRAWL_NAMESPACE"))
        hint = "; set DISTCRAWL_NAMESPACE to a name without them"
        return cls(check_namespace(spider, "spider name", hint))

    def on_cluster(self, cluster: bool) -> FrontierKeys:
        """The same crawl's keys as named on a Redis Cluster (True) or a single server."""
        return self if cluster == self.cluster else dataclasses.replace(self, cluster=cluster)

    def sharded(self, shards: int) -> FrontierKeys:
        """The crawl's own keys, for a frontier of ``shards`` shards."""
        return dataclasses.replace(self, shard=None, shards=shards)

    def of_shard(self, shard: int) -> FrontierKeys:
        """The keys of shard ``shard``; with one shard they are the crawl's own keys, so
        that a crawl of one shard keeps today's names."""
        if self.shards == 1:
            if shard != 0:
                raise ValueError(f"invalid shard {shard} of 1")
            return dataclasses.replace(self, shard=None)
        return dataclasses.replace(self, shard=shard)

    def parts(self, shards: int) -> list[FrontierKeys]:
        """The keys of every shard of this crawl at ``shards`` shards, in shard order: the
        one builder of a crawl's parts (one shard: the crawl's own keys)."""
        crawl = self.sharded(shards)
        return [crawl.of_shard(i) for i in range(shards)]

    @property
    def prefix(self) -> str:
        """What every key of the crawl but ``start_urls`` starts with: ``<ns>:``, or
        ``{<ns>:start_urls}:`` on a cluster; a shard's keys start with its hash tag."""
        if self.shard is not None:
            return f"{{{shard_tag(self.namespace, self.shard, self.shards)}}}:"
        if self.cluster:
            return f"{{{self.namespace}:start_urls}}:"
        return f"{self.namespace}:"

    def _key(self, suffix: str) -> str:
        return f"{self.prefix}{suffix}"

    def _worker_key(self, kind: str, tag: str) -> str:
        """``<prefix><kind>:<tag>``: a key of one worker, whose tag must be a word."""
        if not tag or any(c.isspace() for c in tag):
            raise ValueError(f"invalid worker tag {tag!r}")
        return self._key(f"{kind}:{tag}")

    @property
    def start_urls(self) -> str:
        """LIST anyone may LPUSH to: plain URLs or JSON objects. Never hash-tagged: on a
        cluster its whole name is hashed, which gives the slot of every other key."""
        return f"{self.namespace}:start_urls"

    def claims(self, tag: str) -> str:
        """LIST of the ``start_urls`` entries worker ``tag`` claimed (lua/claim.lua) and has
        not stored yet: each entry leaves it only in the commit that stores what was made of
        it, or goes back to ``start_urls`` when the worker closes or is found dead."""
        return self._worker_key("claims", tag)

    wake = _Key(
        "wake",
        """LIST of wake-up tokens (short-lived): a commit that queues requests pushes some,
        and an idle worker waits for one (``BLPOP``) inside its lease poll, so that work
        one worker discovers reaches an idle one at once, not at its next poll.""",
    )

    @property
    def holds(self) -> str:
        """Pub/sub channel, not a key: a worker that read a ``Retry-After`` publishes the slot
        and how long to hold it, and every worker gives back the requests of that slot it
        holds (engine/holds.py). Named in the crawl's prefix, so the worker ACL user's
        channel rule is one name (admin/acl.py)."""
        return self.sharded(self.shards)._key("holds")

    def wake_of(self, tag: str) -> str:
        """LIST of wake-up tokens for worker ``tag`` alone (short-lived): its own claim of
        start URLs ends the wait that follows it in the same batch (lua/claim.lua)."""
        return self._worker_key("wake", tag)

    claimants = _Key(
        "claimants",
        """SET of the worker tags whose ``claims`` list may hold entries, so that the reaper
        and ``distcrawl reset`` find every claim list without scanning the keyspace.""",
    )

    queue = _Key(
        "queue",
        """ZSET of queue entries ``<slot>\\0<priority><seq><payload>``, all scores 0, so that
        one slot's requests are a lexicographic range, best priority first (lua/lib.lua).""",
    )

    requests = _Key(
        "requests",
        """HASH request id -> record: an 8-byte token, then the queue entry. A leased
        request's token names its lease (4 bytes: the holder's worker tag, 4 random bytes),
        and acknowledgements, renewals and give-backs must present it; a retry waiting in
        ``delayed`` has a token of eight zero bytes.""",
    )

    leases = _Key(
        "leases",
        """ZSET of leased request ids, score = lease deadline (Redis server time, ms).""",
    )

    delayed = _Key(
        "delayed",
        """ZSET of request ids waiting for a retry, score = due time (Redis server time, ms).""",
    )

    revisits = _Key(
        "revisits",
        """ZSET of request ids of pages to fetch again (DISTCRAWL_RECRAWL_INTERVAL), score =
        due time (Redis server time, ms); their records wait in ``requests``, as retries'.""",
    )

    revisit_queue = _Key(
        "revisit_queue",
        """ZSET of due revisits' queue entries, all scores 0, laid out as ``queue``: a slot's
        turns are taken from both, DISTCRAWL_RECRAWL_SHARE of them from this one, so that
        neither revisits nor new URLs starve the other (lua/lease.lua).""",
    )

    revisit_of = _Key(
        "revisit_of",
        """HASH binary fingerprint -> id of the page's scheduled revisit: a page fetched
        again however (``distcrawl recrawl now``, a link found again) keeps one revisit.""",
    )

    seen = _Key(
        "seen",
        """SET of binary request fingerprints.""",
    )

    legacy_seen = _Key(
        "seen:legacy",
        """SET of the first 12 bytes of another crawler's fingerprints of the pages it
        crawled before this crawl took over: scrapy-redis 0.9.1's dupefilter, kept by
        ``distcrawl import scrapy-redis`` (its fingerprints do not convert into the seen-set,
        :func:`distcrawl.dupefilter.scrapy_redis_fingerprint`). Never written by the
        workers: commit.lua drops a new request whose fingerprint of that kind is in it,
        when ``meta``'s ``legacy_seen`` says the crawl has one.""",
    )

    bloom = _Key(
        "bloom",
        """HASH describing the Bloom-filter seen-set (``DISTCRAWL_SEEN = "bloom"``): its
        layers, their sizes and how many URLs each holds; see ``distcrawl/model/seen.py``.""",
    )

    def bloom_part(self, layer: int, part: int) -> str:
        """STRING bitmap holding part ``part`` of Bloom layer ``layer`` (both from 0)."""
        if layer < 0 or part < 0:
            raise ValueError(f"invalid Bloom layer {layer} part {part}")
        return self._key(f"bloom:{layer}:{part}")

    seq = _Key(
        "seq",
        """Counter that numbers requests so that equal priorities pop first-in first-out.""",
    )

    dead = _Key(
        "dead",
        """LIST of JSON dead-letter records (newest first).""",
    )

    workers = _Key(
        "workers",
        """HASH worker id -> JSON heartbeat (host, pid, counters, last beat); kept after exit.""",
    )

    alive = _Key(
        "alive",
        """ZSET worker tag -> time of its last liveness beat (Redis server time, ms),
        written by a thread of its own; a tag that lapses has its leases given back.""",
    )

    commits = _Key(
        "commits",
        """HASH worker tag -> id of the last commit that worker ran, so that a commit
        replayed after its reply was lost changes nothing.""",
    )

    stats = _Key(
        "stats",
        """HASH of counters summed over all workers (HINCRBY): pages, items, errors, ...""",
    )

    domains = _Key(
        "domains",
        """ZSET domain -> pages fetched, for the busiest domains.""",
    )

    history_minutes = _Key(
        "history:1m",
        """HASH ``<minute>:<series>`` -> count: the crawl's pages, items and errors per
        minute, and the queue's length at its last beat in the minute, written by every
        worker's heartbeat for the web console's charts; kept for the last hour, older
        fields deleted by the beats and the key expiring when no worker writes
        (distcrawl/model/history.py).""",
    )

    history_ten_minutes = _Key(
        "history:10m",
        """HASH ``<ten-minute bucket>:<series>`` -> count: as ``history:1m`` per ten
        minutes, kept for the last day (distcrawl/model/history.py).""",
    )

    ready = _Key(
        "ready",
        """ZSET politeness slot -> when its next request may be leased (server ms); holds
        exactly the slots with queued requests.""",
    )

    slots = _Key(
        "slots",
        """HASH slot -> earliest time of the slot's next request (server ms).""",
    )

    inflight = _Key(
        "inflight",
        """HASH slot -> requests leased to some worker whose response has not arrived and
        that are not acknowledged yet: the requests at the site, or about to be.""",
    )

    placeless = _Key(
        "placeless",
        """SET of ids of leased requests that hold no place in their slot's ``inflight``:
        those that left the downloader (their place was given back then, not at the
        acknowledgement) and reserves, leased ahead of a place (lua/places.lua).""",
    )

    throttle = _Key(
        "throttle",
        """HASH slot -> adaptive delay (ms) raised by 429/503 answers and slow responses.""",
    )

    throttle_raised = _Key(
        "throttle:raised",
        """HASH slot -> when its adaptive delay was last raised (server ms): answers to
        requests sent before a raise do not raise it again.""",
    )

    throttle_state = _Key(
        "throttle:state",
        """HASH slot -> ``<cap>:<share>:<hold>``: the slot's adaptive concurrency cap (0:
        none), the share of 429/503 among its recent answers (a moving average over
        ``DISTCRAWL_THROTTLE_WINDOW`` answers) and how many more answers must come before the
        cap may be cut again; written by commit.lua, the cap read by lease.lua.""",
    )

    hungry = _Key(
        "hungry",
        """HASH slot -> when a worker last found it full while holding less than its share.""",
    )

    limits = _Key(
        "limits",
        """HASH slot -> ``<delay ms>:<concurrency>``, set by ``distcrawl limit`` while the
        crawl runs; it wins over the settings.""",
    )

    robots = _Key(
        "robots",
        """HASH slot -> robots.txt Crawl-delay (ms); negative while one worker reads it.""",
    )

    robotstxt = _Key(
        "robotstxt",
        """HASH netloc -> robots.txt, where versions before the layout record kept them
        (without expiry); only ``distcrawl reset`` still touches it.""",
    )

    def robots_txt(self, netloc: str) -> str:
        """STRING ``<fetched> <status>\n<body>``: a netloc's robots.txt as downloaded once
        for the cluster, with a TTL of DISTCRAWL_ROBOTS_TTL, so that a broad crawl keeps
        only the robots.txt of the hosts it still visits."""
        return self._key(f"robotstxt:{netloc}")

    @property
    def robots_txt_pattern(self) -> str:
        """SCAN pattern of every per-netloc robots.txt key and download lock, for reset; the
        prefix escaped, so that it matches this crawl's keys only."""
        return f"{glob_escape(self.prefix)}robotstxt:*"

    def robots_lock(self, netloc: str) -> str:
        """STRING held (with a TTL) by the one worker downloading this netloc's robots.txt."""
        return self._key(f"robotstxt:lock:{netloc}")

    settings = _Key(
        "settings",
        """HASH of values workers publish for producers, e.g. the pending cap.""",
    )

    sweep = _Key(
        "sweep",
        """HASH per-slot key name -> HSCAN cursor: where the sweep of finished slots goes on
        (lua/sweep.lua).""",
    )

    meta = _Key(
        "meta",
        """HASH recording the frontier's layout (format version, shards, seen-set,
        serializer, fingerprinter): written by the first worker, checked by every other
        (distcrawl/model/layout.py).""",
    )

    reaper = _Key(
        "reaper",
        """STRING the tag of the worker elected (``SET NX PX``) to reap expired leases, dead
        workers' leases and claims and finished slots for one ``DISTCRAWL_RECLAIM_INTERVAL``:
        one reaper per interval for the crawl, not one per worker (distcrawl/engine/batch.py).""",
    )

    reaper_idle = _Key(
        "reaper:idle",
        """STRING the tag of the parked (idle) worker elected to look for dead workers' work
        for one idle interval (distcrawl/engine/idle.py): parked workers, who hold nothing,
        look rarely, and never delay a busy reaper's turn.""",
    )

    paused = _Key(
        "paused",
        """STRING present while the crawl is paused (``distcrawl pause``).""",
    )

    lifecycle = _Key(
        "lifecycle",
        """HASH the crawl's lifecycle (lua/finish.lua): ``state`` ('running' or 'finished'),
        ``since`` (ms), ``seq`` (the finished run's signature), ``runs`` (runs finished),
        ``event`` (the last completion event's id in ``events``) and ``webhook`` (that id
        while its webhook is not delivered).""",
    )

    webhook_lock = _Key(
        "lifecycle:webhook",
        """STRING the tag of the worker posting the pending completion event's webhook
        (``SET NX PX``, distcrawl/engine/webhook.py): one worker at a time.""",
    )

    events = _Key(
        "events",
        """STREAM of the crawl's events: one ``finished`` entry per run, added atomically with
        the decision (lua/finish.lua), capped at about 1,000 entries.""",
    )

    runnable = _Key(
        "runnable",
        """LIST of one-byte elements, as many as the requests the crawl could run now within
        its politeness (lua/runnable.lua, written by the reaper every reclaim interval): the
        autoscaling signal, a LIST because KEDA's stock Redis scaler reads a list's length.""",
    )

    import_queue = _Key(
        "import:queue",
        """ZSET or LIST: a scrapy-redis queue that ``distcrawl import scrapy-redis --move`` is
        importing, renamed here first: scrapy-redis' default queue key ``<spider>:requests``
        is distcrawl's :attr:`requests`, and an interrupted move resumes from here.""",
    )

    imported = _Key(
        "import:done",
        """SET of digests of the scrapy-redis queue members already imported (queued or found
        seen), so that an import run again skips them: a ``dont_filter`` request has no
        fingerprint for the seen-set to stop; and of those dead-lettered (``dead:`` +
        digest), so that a run again writes no second dead letter.""",
    )

    migration = _Key(
        "migration",
        """HASH written by ``distcrawl migrate`` (distcrawl/admin/migrate.py): on the source, the
        migration's id, where it goes and whether it was verified (``state``); on the target,
        the same id and where it came from. A run again after an interruption resumes only
        into a target whose record names the same id, so that it never overwrites another
        crawl of the same name. Never copied itself.""",
    )

    def same_key_in(self, key: str, other: FrontierKeys) -> str:
        """The name ``key`` (one of this crawl's keys) has in ``other``'s naming, for
        ``distcrawl migrate``: ``start_urls`` keeps its name, every other key keeps its suffix
        behind the other prefix (``site:queue`` <-> ``{site:start_urls}:queue``)."""
        if key == self.start_urls:
            return other.start_urls
        if not key.startswith(self.prefix):
            raise ValueError(f"{key!r} is not a key of the crawl {self.namespace!r}")
        return other.prefix + key[len(self.prefix) :]

    def all(self) -> tuple[str, ...]:
        """Every fixed key of this crawl, for an explicit reset; the Bloom filter's bitmaps
        (``bloom_part``) are listed in its ``bloom`` HASH and the workers' claim lists
        (``claims``) in ``claimants``, see ``FrontierAdmin.clear``."""
        return (
            self.start_urls,
            self.claimants,
            self.queue,
            self.requests,
            self.leases,
            self.delayed,
            self.revisits,
            self.revisit_queue,
            self.revisit_of,
            self.seen,
            self.legacy_seen,
            self.bloom,
            self.seq,
            self.dead,
            self.workers,
            self.alive,
            self.commits,
            self.stats,
            self.domains,
            self.history_minutes,
            self.history_ten_minutes,
            self.ready,
            self.slots,
            self.inflight,
            self.placeless,
            self.throttle,
            self.throttle_raised,
            self.throttle_state,
            self.hungry,
            self.limits,
            self.robots,
            self.robotstxt,
            self.settings,
            self.meta,
            self.sweep,
            self.reaper,
            self.reaper_idle,
            self.paused,
            self.wake,
            self.runnable,
            self.lifecycle,
            self.webhook_lock,
            self.events,
            self.import_queue,
            self.imported,
            self.migration,
        )

    def script_keys(self, script: str, of: str | None = None) -> list[str]:
        """The KEYS of Lua script ``script`` (``distcrawl.model.lua.KEYS``) in the order its header
        gives, so that no caller lists them by hand. ``of``: the worker tag or netloc of the
        keys that are per worker or per host (``claims``, ``wake_of``, ``robots_txt``...),
        or the key itself where the caller chooses it (``lua.PASSED_BY_CALLER``)."""
        out: list[str] = []
        for name in lua.KEYS[script]:
            if name in lua.PASSED_BY_CALLER:
                if of is None:
                    raise ValueError(f"{script}.lua's key {name!r} is the caller's to give")
                out.append(of)
                continue
            member = getattr(type(self), name)
            if isinstance(member, _Key | property):
                out.append(getattr(self, name))
            elif of is None:
                raise ValueError(f"{script}.lua's key {name!r} needs a worker tag or netloc")
            else:
                out.append(getattr(self, name)(of))
        return out
