"""``distcrawl import scrapy-redis SPIDER``: carry a running scrapy-redis crawl over.

A scrapy-redis frontier can take days to build; without this its owner must crawl again
from the start or write a converter. What is read, named as scrapy-redis 0.9.1 names it
from the project's settings:

* the queue, ``SCHEDULER_QUEUE_KEY`` (``%(spider)s:requests``): a ZSET (``PriorityQueue``,
  score = -priority) or a LIST (``FifoQueue``, ``LifoQueue``) of dicts of Scrapy's
  ``Request.to_dict``, encoded by ``SCHEDULER_SERIALIZER`` (``scrapy_redis.picklecompat``:
  pickle, by default);
* the seen-set, ``SCHEDULER_DUPEFILTER_KEY`` (``%(spider)s:dupefilter``): a SET of 40-digit
  hex SHA1 fingerprints;
* with ``--rebuild-seen``, the items ``REDIS_ITEMS_KEY`` (``%(spider)s:items``, JSON, from
  scrapy-redis' RedisPipeline) and a MongoDB collection: the URLs of pages already crawled.

Each queued request goes through :meth:`Producer.push_requests`: rebuilt by the rules a
worker applies to what it reads from Redis (callbacks, errbacks, request class) and
committed with its fingerprint, so a request already seen stores nothing. What cannot be
imported becomes a dead letter (``source: "import"``) with its reason. A digest of every
member stored goes to ``<ns>:import:done``, so that a run again (after an interruption)
skips it. That record is written after the commit that stores the page, so a page whose
commit ran but whose reply was lost (or whose importer died in between) is committed again
by the next run: each member carries an id into the seen-set in that same commit (its
fingerprint, or :func:`replay_id` for a ``dont_filter`` request, which has none), so the
commit sent again stores nothing. A dead-lettered member is tried again by the next run (the
spider may have been fixed), without a second dead letter.

Fingerprints: scrapy-redis 0.9.1's ``RFPDupeFilter.request_fingerprint`` is its own SHA1
of ``{"body", "method", "url"}`` as JSON; it never asks ``crawler.request_fingerprinter``.
Scrapy's (2.7+) fingerprint, which distcrawl stores (its first 12 bytes), hashes
``{"body", "headers", "method", "url"}``: the same request gets a different hash, and a
hash cannot be turned back into its URL. The import checks this on the queued requests
(:func:`detect`) rather than assuming it: where the dupefilter holds the crawl's own
fingerprints (a patched scrapy-redis) they are copied; where it holds scrapy-redis' own,
they are kept as the crawl's legacy seen-set (``<ns>:seen:legacy``, flagged in
``<ns>:meta``), against which the workers check scrapy-redis' fingerprint of each new
request (commit.lua), so that no page crawled before is fetched again. ``--rebuild-seen``
also marks the pages already stored as seen in distcrawl's own seen-set.

A sharded crawl (DISTCRAWL_SHARDS above 1, in the project's settings as in the crawl's
layout record) gets each request in the shard of its URL and each URL ``--rebuild-seen``
marks in that shard's seen-set, as the producer stores them. A copied fingerprint tells no
URL, so no shard: it is copied into every shard's seen-set (or legacy seen-set; each shard
then drops that request, wherever its URL belongs), at the memory of one copy per shard.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pickle
from collections.abc import Callable, Iterable, Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any

import redis
from scrapy import Request
from scrapy.settings import BaseSettings
from scrapy.utils.python import to_unicode

from distcrawl.admin._import_report import Report
from distcrawl.dupefilter import FINGERPRINT_BYTES, scrapy_redis_fingerprint
from distcrawl.model.deadrecord import dead_letter
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.layout import LEGACY_SCRAPY_REDIS, LEGACY_SEEN
from distcrawl.producer import Outcome, Producer

#: Source field -> the scrapy-redis setting and its default in scrapy-redis 0.9.1: settings
#: of the project being migrated, not of distcrawl (docs/migrating.md)
SOURCE_SETTINGS: dict[str, tuple[str, str]] = {
    "queue_key": ("SCHEDULER_QUEUE_KEY", "%(spider)s:requests"),
    "dupefilter_key": ("SCHEDULER_DUPEFILTER_KEY", "%(spider)s:dupefilter"),
    "items_key": ("REDIS_ITEMS_KEY", "%(spider)s:items"),
    "serializer": ("SCHEDULER_SERIALIZER", "scrapy_redis.picklecompat"),
}
#: SCHEDULER_SERIALIZER values whose ``loads`` only ever builds data
SAFE_SERIALIZERS = frozenset({"json"})
#: those that are pickle: decoded with ``pickle.loads`` (all scrapy-redis' picklecompat does)
PICKLE_SERIALIZERS = frozenset({"scrapy_redis.picklecompat", "pickle", "_pickle", "cPickle"})
#: members read from Redis, and URLs marked seen, at a time
PAGE = 500
#: queued requests whose fingerprints are looked up in the dupefilter to tell its kind
SAMPLE = 200
#: bytes of a member's SHA1 kept in ``<ns>:import:done``
DIGEST_BYTES = 12
#: prefix of the digest of a member that was dead-lettered (tried again by the next run)
DEAD = b"dead:"

TRUST_HELP = (
    "{what}, and unpickling runs whatever code the pickle names: anyone who could write to "
    "this Redis could run code here. Nothing was decoded. If only your own crawlers ever "
    "wrote to it, run again with --trust-pickle."
)


class ImportRefused(Exception):
    """The import cannot run as asked; the message says why and what to do instead."""


@dataclass(frozen=True)
class Source:
    """The scrapy-redis keys of one spider and how its queue is encoded."""

    spider: str
    queue_key: str
    dupefilter_key: str
    items_key: str
    serializer: str

    @classmethod
    def from_settings(cls, settings: BaseSettings, spider: str) -> Source:
        """Names as scrapy-redis 0.9.1 builds them (its defaults.py, scheduler.py)."""

        values = {
            field: settings.get(name) or default
            for field, (name, default) in SOURCE_SETTINGS.items()
        }
        keys = {f: str(v) % {"spider": spider} for f, v in values.items() if f != "serializer"}
        serializer = values["serializer"]  # a module path, or the module itself
        name = getattr(serializer, "__name__", str(serializer))
        return cls(spider=spider, serializer=name, **keys)

    @property
    def trusted_only(self) -> bool:
        """Whether decoding the queue may run code (pickle, or a module we cannot vouch for)."""
        return self.serializer not in SAFE_SERIALIZERS

    def loads(self) -> Callable[[bytes], Any]:
        if self.serializer in PICKLE_SERIALIZERS:
            return pickle.loads  # only reached with --trust-pickle
        loads: Callable[[bytes], Any] = importlib.import_module(self.serializer).loads
        return loads


def replay_id(member: bytes, position: int) -> bytes:
    """What stands in the seen-set for the fingerprint of a queue member that has none
    (``dont_filter``), so that storing it again (the commit's reply was lost, the import
    was stopped before it recorded the page) stores nothing: a hash of the member and its
    position in the source queue (a LIST may hold the same request twice, both to be
    fetched), which no request's fingerprint equals. The source is not written while it is
    imported (scrapy-redis stopped, or renamed by ``--move``), so a run again finds the same
    member at the same position."""
    digest = hashlib.sha1(b"distcrawl-import\0")  # SHA1 as the fingerprints: not for secrecy
    digest.update(position.to_bytes(8, "big") + member)
    return digest.digest()[:FINGERPRINT_BYTES]


def _method(data: dict[str, Any]) -> str:
    return str(data.get("method") or "GET")


def _body(data: dict[str, Any]) -> bytes:
    body = data.get("body") or b""
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


@dataclass(eq=False)
class Importer:
    """One import: ``run()`` returns the :class:`Report`; :class:`ImportRefused` before
    anything is written when it cannot run as asked."""

    producer: Producer
    source: Source
    _: KW_ONLY
    trust_pickle: bool = False
    move: bool = False
    dry_run: bool = False
    rebuild_seen: bool = False
    url_field: str = "url"
    mongo: Callable[[], Iterable[str]] | None = None

    def __post_init__(self) -> None:
        self.client: redis.Redis = self.producer.client
        self.keys: FrontierKeys = self.producer.frontier.keys
        self.report = Report(dry_run=self.dry_run)
        self._samples: list[dict[str, Any]] = []

    def run(self) -> Report:
        key, kind = self._queue()
        report = self.report
        report.queue_key, report.queue_type = key, kind
        if key is not None:
            report.members = int(
                self.client.zcard(key) if kind == "zset" else self.client.llen(key)
            )
            if report.members and self.source.trusted_only and not self.trust_pickle:
                what = f"the queue {key} (SCHEDULER_SERIALIZER={self.source.serializer!r})"
                if not self.dry_run:
                    how = "is pickled"
                    if self.source.serializer not in PICKLE_SERIALIZERS:
                        how = (
                            "is decoded by a module not known to decode data only (it may unpickle)"
                        )
                    raise ImportRefused(TRUST_HELP.format(what=f"{what} {how}"))
                report.notes.append(f"{what} not decoded: counts only (no --trust-pickle)")
            # RENAMENX: a concurrent run that renamed it first wins, nothing is lost
            moving = self.move and not self.dry_run and key == self.source.queue_key
            if moving and self.client.renamenx(key, self.keys.import_queue):
                key = report.queue_key = self.keys.import_queue
            self._import(key, kind)
        report.dupefilter = int(self.client.scard(self.source.dupefilter_key))
        self._seen()
        if self.move and not self.dry_run:
            if report.not_imported:
                # kept for the next run, which skips what is done and tries the rest again
                report.notes.append(
                    f"{report.not_imported} requests not imported: "
                    f"{self.keys.import_queue} and the dupefilter are kept until a run "
                    "imports them all"
                )
            else:
                self.client.delete(
                    self.keys.import_queue, self.source.dupefilter_key, self.keys.imported
                )
                report.moved = True
        return report

    def _queue(self) -> tuple[str | None, str]:
        """The key to read (a --move in progress first) and its type; refuses a queue key
        that is one of distcrawl's own keys unless --move frees it."""
        staged = _type(self.client, self.keys.import_queue)
        if staged in ("zset", "list"):
            return self.keys.import_queue, staged
        key = self.source.queue_key
        kind = _type(self.client, key)
        ours = key in self.keys.all()
        if kind == "none":
            return None, kind
        if kind not in ("zset", "list"):
            if ours:  # distcrawl's own data by now (a finished --move, or never scrapy-redis)
                self.report.notes.append(f"{key} is a {kind}: distcrawl's, not a queue")
                return None, "none"
            raise ImportRefused(f"{key} is a {kind}, not a scrapy-redis queue (ZSET or LIST)")
        if ours and not self.move and not self.dry_run:
            raise ImportRefused(
                f"the scrapy-redis queue {key} is also the name of distcrawl's own key for "
                f"namespace {self.keys.namespace!r}: import into another namespace "
                f"(--namespace), or give --move to rename the queue to "
                f"{self.keys.import_queue} first and delete it once imported"
            )
        return key, kind

    def _members(self, key: str, kind: str) -> Iterator[tuple[int, list[bytes]]]:
        """Pages of members and the position of each page's first: a ZSET best priority
        first, a LIST oldest first (its tail)."""
        at = 0
        while True:
            if kind == "zset":
                page = self.client.zrange(key, at, at + PAGE - 1)
            else:
                page = list(reversed(self.client.lrange(key, -(at + PAGE), -(at + 1))))
            if not page:
                return
            yield at, page  # type: ignore[misc]
            if len(page) < PAGE:
                return
            at += PAGE

    def _import(self, key: str, kind: str) -> None:
        """Page by page: skip what an earlier run handled, decode, store, dead-letter.

        A member dead-lettered by an earlier run is tried again (the spider may have been
        fixed since) but never gets a second dead letter: its digest is kept under
        :data:`DEAD` in ``<ns>:import:done``, in the transaction that writes the letter."""
        report = self.report
        counts = report.requests
        loads = self.source.loads() if self.trust_pickle or not self.source.trusted_only else None
        for start, page in self._members(key, kind):
            digests = [hashlib.sha1(m).digest()[:DIGEST_BYTES] for m in page]
            marks = self.client.smismember(
                self.keys.imported, [*digests, *(DEAD + d for d in digests)]
            )
            done, dead_before = marks[: len(page)], marks[len(page) :]
            todo = [
                (m, d, bool(old_letter), start + i)
                for i, (m, d, old, old_letter) in enumerate(
                    zip(page, digests, done, dead_before, strict=True)
                )
                if not old
            ]
            counts.already_imported += len(page) - len(todo)
            if loads is None or not todo:
                continue
            letters: list[tuple[bytes, bytes, bool]] = []  # (digest, letter, written before)
            handled: list[bytes] = []
            decoded: list[tuple[bytes, bytes, bool, dict[str, Any]]] = []
            ids: list[bytes] = []
            for member, digest, lettered, at in todo:
                try:
                    data = loads(member)
                    if not isinstance(data, dict):
                        raise ValueError(f"a {type(data).__name__}, not a request dict")
                except Exception as exc:
                    letter = self._letter(f"undecodable: {exc!r}", member, None)
                    letters.append((digest, letter, lettered))
                    continue
                decoded.append((member, digest, lettered, data))
                ids.append(replay_id(member, at))
            self._count_known([d for *_, d in decoded])
            if self.dry_run:
                counts.dead += len(letters)
                counts.queued += len(decoded)
                continue
            # a commit whose reply is lost (or a crash before the record below) is sent
            # again by the next run: the ids make that a no-op for dont_filter requests too
            results = self.producer.push_requests([d for *_, d in decoded], once=ids)
            for (member, digest, lettered, data), result in zip(decoded, results, strict=True):
                if result.outcome is Outcome.FULL:
                    counts.full += 1
                elif result.outcome is Outcome.REFUSED:
                    letter = self._letter(str(result.reason), member, data.get("url"))
                    letters.append((digest, letter, lettered))
                else:
                    handled.append(digest)
                    counts.seen += result.outcome is Outcome.SEEN
                    counts.queued += result.outcome is Outcome.QUEUED
            counts.dead += len(letters)
            new_letters = [(d, letter) for d, letter, before in letters if not before]
            pipe = self.client.pipeline(transaction=True)  # a dead letter is written once
            if new_letters:
                pipe.lpush(self.keys.dead, *(letter for _, letter in new_letters))
                pipe.sadd(self.keys.imported, *(DEAD + d for d, _ in new_letters))
            if handled:
                pipe.sadd(self.keys.imported, *handled)
            pipe.execute()
            if counts.full:
                report.notes.append(
                    "DISTCRAWL_MAX_PENDING reached: run the import again once workers made room"
                )
                return

    def _letter(self, reason: str, member: bytes, url: Any) -> bytes:
        return dead_letter(
            f"scrapy-redis import: {reason}",
            raw=member,
            url=url if isinstance(url, str) else None,
            source="import",
        )

    def _count_known(self, dicts: list[dict[str, Any]]) -> None:
        """Count the queued requests whose scrapy-redis fingerprint is in the dupefilter (and
        keep a few to tell which fingerprints it holds, :func:`detect`)."""
        filtered = [d for d in dicts if not d.get("dont_filter") and isinstance(d.get("url"), str)]
        self._samples.extend(filtered[: SAMPLE - len(self._samples)])
        fps = [scrapy_redis_fingerprint(_method(d), d["url"], _body(d)) for d in filtered]
        if fps:
            hits = self.client.smismember(self.source.dupefilter_key, fps)
            self.report.conversion.queued_in_dupefilter += sum(1 for hit in hits if hit)

    def _seen(self) -> None:
        report = self.report
        report.conversion.fingerprints = detect(self, self._samples)
        if report.conversion.fingerprints == "crawl":
            if not self.dry_run:
                self._convert()
            return
        if report.conversion.fingerprints == "scrapy-redis":
            if not self.dry_run:
                self._keep_legacy()
            report.notes.append(
                "scrapy-redis 0.9.1 fingerprints (its own SHA1 of method, URL and body) differ "
                "from Scrapy's, which distcrawl stores: "
                + ("they would be" if self.dry_run else "they were")
                + " kept as the crawl's legacy seen-set, which the workers check each new "
                "request against with scrapy-redis' fingerprint"
            )
        elif report.dupefilter:
            report.notes.append(
                "the dupefilter's fingerprints are neither the crawl's nor scrapy-redis "
                "0.9.1's: they cannot be converted"
                + ("" if self.rebuild_seen else "; --rebuild-seen marks the stored pages seen")
            )
        if self.rebuild_seen:
            self._rebuild()

    def _convert(self) -> None:
        """Copy the dupefilter's hex fingerprints, cut to what the seen-set holds: into every
        shard's seen-set in a sharded crawl (a fingerprint does not tell its URL's shard);
        counted as converted when no shard held it yet."""
        parts = self.producer.parts
        if len(parts) > 1:
            self.report.notes.append(
                f"the dupefilter's fingerprints were copied into each of the {len(parts)} "
                "shards' seen-sets (DISTCRAWL_SHARDS): a fingerprint does not tell which "
                "shard its URL belongs to"
            )
        for fps in self._dupefilter_pages():
            new = [True] * len(fps)
            for part in parts:
                new = [a and b for a, b in zip(new, part.add_seen(fps), strict=True)]
            self.report.conversion.converted += sum(new)

    def _dupefilter_pages(self) -> Iterator[list[bytes]]:
        """The dupefilter's fingerprints, a SSCAN page at a time, cut to FINGERPRINT_BYTES;
        a member that is no hex SHA1 (not scrapy-redis') is passed over."""
        cursor = 0
        while True:
            cursor, values = self.client.sscan(self.source.dupefilter_key, cursor, count=PAGE)
            fps = []
            for value in values:
                try:
                    fps.append(bytes.fromhex(to_unicode(value))[:FINGERPRINT_BYTES])
                except ValueError:
                    continue
            yield fps
            if not cursor:
                return

    def _keep_legacy(self) -> None:
        """Copy the dupefilter's fingerprints, cut to FINGERPRINT_BYTES, into the crawl's
        legacy seen-set (every shard's: a fingerprint does not tell its URL's shard), then
        say so in ``<ns>:meta``, which the workers read at open: only then do they compute
        scrapy-redis' fingerprint of their requests, so that a crawl without one pays
        nothing. A run again adds what is there again (no change)."""
        parts = self.producer.parts
        for fps in self._dupefilter_pages():
            if fps:
                pipe = self.client.pipeline(transaction=False)
                for part in parts:
                    pipe.sadd(part.keys.legacy_seen, *fps)
                pipe.execute()
        self.report.conversion.legacy = int(self.client.scard(parts[0].keys.legacy_seen))
        self.client.hset(self.keys.meta, LEGACY_SEEN, LEGACY_SCRAPY_REDIS)

    def _rebuild(self) -> None:
        rebuild = self.report.rebuild
        for urls in _pages(self._stored_urls()):
            fps = [scrapy_redis_fingerprint("GET", url, b"") for url in urls]
            hits = self.client.smismember(self.source.dupefilter_key, fps)
            rebuild.stored_in_dupefilter += sum(1 for hit in hits if hit)
            rebuild.seen_urls += len(urls)
            if not self.dry_run:
                rebuild.seen_added += self.producer.mark_seen(urls)

    def _stored_urls(self) -> Iterator[str]:
        """URLs of the items scrapy-redis' RedisPipeline stored, then of the MongoDB ones."""
        key, at = self.source.items_key, 0
        if _type(self.client, key) == "list":
            while raws := self.client.lrange(key, at, at + PAGE - 1):
                at += len(raws)
                for raw in raws:
                    try:
                        url = json.loads(raw).get(self.url_field)
                    except (ValueError, AttributeError):
                        continue
                    if isinstance(url, str):
                        yield url
        if self.mongo is not None:
            yield from self.mongo()


def detect(importer: Importer, samples: list[dict[str, Any]]) -> str:
    """Which fingerprints the dupefilter holds, from queued requests (each of them was put
    in the dupefilter when scrapy-redis queued it): "crawl" if the crawl's own fingerprinter
    gives them, "scrapy-redis" if scrapy-redis 0.9.1's does, else "unknown"."""
    client, key = importer.client, importer.source.dupefilter_key
    if not samples or not importer.report.dupefilter:
        return "unknown"
    fingerprint = importer.producer.fingerprinter.fingerprint
    ours = [fingerprint(Request(d["url"], method=_method(d), body=_body(d))).hex() for d in samples]
    theirs = [scrapy_redis_fingerprint(_method(d), d["url"], _body(d)) for d in samples]
    crawl_hits = sum(1 for hit in client.smismember(key, ours) if hit)
    sr_hits = sum(1 for hit in client.smismember(key, theirs) if hit)
    if crawl_hits > sr_hits:
        return "crawl"
    return "scrapy-redis" if sr_hits else "unknown"


def _type(client: redis.Redis, key: str) -> str:
    return to_unicode(client.type(key))


def _pages(items: Iterable[str]) -> Iterator[list[str]]:
    page: list[str] = []
    for item in items:
        page.append(item)
        if len(page) >= PAGE:
            yield page
            page = []
    if page:
        yield page
