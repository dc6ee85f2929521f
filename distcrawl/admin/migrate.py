"""``distcrawl migrate``: move a paused crawl's frontier to another Redis (one node <-> Cluster).

A crawl that outgrows one Redis node should not have to start over on a Redis Cluster, and
hand-copying a few dozen keys with ``redis-cli`` (under other names there: ``site:queue`` is
``{site:start_urls}:queue`` on a cluster, see keys.py) is how requests get lost or fetched
twice. So this copies every key of the crawl (the fixed keys, the workers' claim lists, the
Bloom filter's parts, the per-netloc robots.txt keys) with ``DUMP``/``RESTORE``, which keeps
each key's type, content and remaining TTL, each under its name on the target (a cluster
client writes it to the master of its slot). Then it compares every key's size on both
sides, and only then, if asked, removes the source's keys.

Why the crawl must be paused with no live worker: a worker holding leases acknowledges them
on the Redis it knows, so a page fetched during the move would be fetched again on the
target, and its children lost; a running crawl changes keys already copied. ``distcrawl
pause`` stops the leasing and the workers finish what they hold; once they are stopped
(a clean stop removes a worker's liveness beat, a killed one's beat lapses after the worker
timeout) nothing but producers writes to the crawl. Leases left by killed workers are
copied as they are: the target's workers requeue them exactly as they would have on the
source. ``--force`` skips these checks, for a crawl whose workers are known gone.

Idempotent: a key already identical on the target is left alone and any other is written
with ``RESTORE ... REPLACE``, so a run again after an interruption finishes the job. The
record ``<ns>:migration`` (keys.py) on both sides names the migration, so that a run again
only ever writes into a target this same migration started, never over another crawl of
that name, and says on the source whether the copy was verified.

This module is the move, which Python code and the tests drive one step at a time; the
command's arguments and output are ``cli/_migrate.py``'s, as the import's are
``cli/_import.py``'s.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import redis

from distcrawl.engine.liveness import live_workers
from distcrawl.model.connection import is_cluster, node_info
from distcrawl.model.frontier_admin import FrontierAdmin
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.seen import BloomState, part_keys

#: keys per pipeline: bounds what one round trip carries (a DUMP holds a whole key)
BATCH = 100
#: bytes (MEMORY USAGE) per copy pipeline, past its first key: Bloom parts are large bitmaps,
#: and a hundred of them in one round trip would all be held in this process at once
BATCH_BYTES = 64 << 20
#: members up to which two keys whose DUMPs differ are compared by content: a hash table's
#: DUMP follows its server's hash seed, so equal hashes and sets of two servers differ there
COMPARE_MEMBERS = 10_000
#: the types whose size (STRLEN, LLEN, SCARD, ZCARD, HLEN) verify compares
_SIZED = frozenset({"string", "list", "set", "zset", "hash"})


class MigrationRefused(Exception):
    """The crawl or the target is not in a state a migration may start from: nothing written."""


@dataclass
class KeyInfo:
    """One key of the crawl: its names on both sides, and what the source holds."""

    source: str
    target: str
    type: str = "none"
    size: int = 0
    #: remaining time to live (ms); -1: none
    ttl_ms: int = -1
    bytes: int | None = None


@dataclass(kw_only=True)
class RunOutcome:
    """How a copy-then-verify run of ``distcrawl migrate`` ended, to another Redis
    (:class:`Outcome`) or into other shards (``reshard.ReshardOutcome``): what differs after
    the copy (nothing is switched nor removed then), the source keys removed, whether an
    earlier run had done it all, and how long it took."""

    mismatches: list[str] = field(default_factory=list)
    deleted: int = 0
    already_done: bool = False
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """As ``--json`` prints it: the run's own counts first, then how it ended."""
        own = asdict(self)
        ending = {f.name: own.pop(f.name) for f in fields(RunOutcome)}
        return own | ending


@dataclass
class Outcome(RunOutcome):
    """What a run to another Redis did, printed (or as JSON) by the command."""

    #: the crawl's keys listed on the source (each then copied, unchanged or expired)
    keys: int
    copied: int = 0
    unchanged: int = 0
    #: keys that expired (robots.txt, locks) between the listing and their copy
    expired: int = 0


@dataclass
class Side:
    """One Redis of the migration and the crawl's names there."""

    client: redis.Redis
    keys: FrontierKeys
    shown: str


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for at in range(0, len(items), size):
        yield items[at : at + size]


def _by_size(infos: Sequence[KeyInfo]) -> Iterator[list[KeyInfo]]:
    """Batches of at most BATCH keys and, but for a key larger alone, BATCH_BYTES."""
    batch: list[KeyInfo] = []
    size = 0
    for info in infos:
        weight = info.bytes or 0
        if batch and (len(batch) >= BATCH or size + weight > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(info)
        size += weight
    if batch:
        yield batch


def _text(fields: Any) -> dict[str, str]:
    """A HASH read from Redis, as text."""
    return {text_of(k): text_of(v) for k, v in dict(fields).items()}


def text_of(value: Any) -> str:
    """A Redis reply as text (bytes decoded, with a stand-in for what is not UTF-8)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def not_stopped(
    client: redis.Redis, keys: FrontierKeys, worker_timeout: float, why: str = ""
) -> list[str]:
    """Why the crawl is not stopped for a move (empty: it is): it is not paused, or some
    worker beat within the last ``worker_timeout`` seconds (``why``: what that worker
    would spoil)."""
    out = []
    if not client.exists(keys.paused):
        out.append(f"the crawl {keys.namespace!r} is not paused (distcrawl pause {keys.namespace})")
    live = live_workers(client, keys, worker_timeout)
    if live:
        tags = ", ".join(live)
        out.append(
            f"{len(live)} worker(s) beat within the last {worker_timeout:g}s ({tags}): "
            f"stop every worker first{why}"
        )
    return out


def describe(side: Side, names: Sequence[str], *, memory: bool = False) -> list[KeyInfo]:
    """TYPE, size, PTTL (and MEMORY USAGE) of each key of ``names``: two round trips."""
    pipe = side.client.pipeline(transaction=False)
    for name in names:
        pipe.type(name)
        pipe.pttl(name)
    replies = pipe.execute()
    infos = []
    for i, name in enumerate(names):
        kind = replies[2 * i]
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        infos.append(KeyInfo(name, name, kind, 0, int(replies[2 * i + 1])))
    pipe = side.client.pipeline(transaction=False)
    for info in infos:
        if info.type == "string":
            pipe.strlen(info.source)
        elif info.type == "list":
            pipe.llen(info.source)
        elif info.type == "set":
            pipe.scard(info.source)
        elif info.type == "zset":
            pipe.zcard(info.source)
        elif info.type == "hash":
            pipe.hlen(info.source)
        else:  # a type distcrawl never writes (or gone): its size is not compared
            pipe.exists(info.source)
        if memory:
            pipe.memory_usage(info.source)
    replies = pipe.execute()
    step = 2 if memory else 1
    for i, info in enumerate(infos):
        info.size = int(replies[step * i] or 0) if info.type in _SIZED else 0
        if memory:
            info.bytes = replies[step * i + 1]
    return infos


def _content(side: Side, name: str, kind: str) -> Any:
    """The whole value of a key, in a form two servers agree on."""
    if kind == "hash":
        return side.client.hgetall(name)
    if kind == "set":
        return side.client.smembers(name)
    if kind == "zset":
        return side.client.zrange(name, 0, -1, withscores=True)
    if kind == "list":
        return side.client.lrange(name, 0, -1)
    return side.client.get(name)


class Migration:
    """One crawl's move from ``source`` to ``target``: the checks, the copy, the verification
    and the delete as separate steps, so that the command and the tests can run each alone
    (a dry run is the checks and the listing)."""

    def __init__(self, source: Side, target: Side, *, worker_timeout: float = 10.0) -> None:
        self.source = source
        self.target = target
        self.worker_timeout = worker_timeout
        #: the source's keys as the last ``run`` listed them
        self.listed: list[KeyInfo] = []

    @classmethod
    def between(
        cls,
        source: redis.Redis,
        target: redis.Redis,
        namespace: str,
        *,
        shown: tuple[str, str] = ("source", "target"),
        **kwargs: Any,
    ) -> Migration:
        """The migration of crawl ``namespace``; ``shown``: how the two Redis may be named in
        records and output (redacted URLs: they are stored in the migration records)."""
        keys = FrontierKeys(namespace)
        return cls(
            Side(source, keys.on_cluster(is_cluster(source)), shown[0]),
            Side(target, keys.on_cluster(is_cluster(target)), shown[1]),
            **kwargs,
        )

    # ------------------------------------------------------------------ what there is

    def source_keys(self) -> list[KeyInfo]:
        """Every existing key of the crawl on the source, with its target name: the fixed
        keys, the claim lists (``claimants``), the Bloom parts (``bloom``), the per-netloc
        robots.txt keys (SCAN, as ``reset`` finds them); never the migration record."""
        src = self.source
        admin = FrontierAdmin(src.client, src.keys)
        bloom = BloomState.parse(src.client.hgetall(src.keys.bloom))
        names = [n for n in src.keys.all() if n != src.keys.migration]
        names += admin.claim_keys() + part_keys(src.keys, bloom)
        names += sorted(k.decode() for k in admin.netloc_keys())
        names = list(dict.fromkeys(names))
        infos = []
        for chunk in _chunks(names, BATCH):
            infos += [i for i in describe(src, chunk, memory=True) if i.type != "none"]
        for info in infos:
            info.target = src.keys.same_key_in(info.source, self.target.keys)
        return infos

    def problems(self) -> list[str]:
        """Why the crawl may not move now (empty: it may): not paused, a live worker, or a
        layout this version cannot move."""
        src, k = self.source, self.source.keys
        if not src.client.exists(*k.all()):
            return [f"no crawl {k.namespace!r} at the source (moved with --delete-source?)"]
        why = " (their leases would be acknowledged on the source)"
        out = not_stopped(src.client, k, self.worker_timeout, why)
        shards = _text(src.client.hgetall(k.meta)).get("shards", "1")
        if shards != "1":
            out.append(f"the frontier has {shards} shards: only 1 can move yet")
        return out

    def same_server(self) -> bool:
        """Whether source and target are one server (one run_id): the names would be the
        same keys, and --delete-source would delete the crawl."""
        src, tgt = self.source, self.target
        ours = node_info(src.client, "server", src.keys.start_urls).get("run_id")
        theirs = node_info(tgt.client, "server", tgt.keys.start_urls).get("run_id")
        return ours is not None and ours == theirs

    # ------------------------------------------------------------------ the move

    def run(self, *, dry_run: bool = False, delete_source: bool = False) -> Outcome:
        """Copy, verify, then (``delete_source``) remove the source keys; refuses (raises
        MigrationRefused, having written nothing) when the target holds another crawl of
        this name. Call ``problems()`` first. ``dry_run``: the checks and the listing
        (``listed``) only."""
        started = time.monotonic()
        src, tgt = self.source, self.target
        if self.same_server():
            raise MigrationRefused("the source and the target are the same Redis server")
        mine = _text(src.client.hgetall(src.keys.migration))
        theirs = _text(tgt.client.hgetall(tgt.keys.migration))
        outgoing = mine.get("id") if "to" in mine else None
        ours = outgoing is not None and theirs.get("id") == outgoing and "from" in theirs
        if ours and mine.get("state") == "done":
            infos = self.listed = self.source_keys()
            outcome = Outcome(keys=len(infos), already_done=True)
            if delete_source and not dry_run:
                outcome.deleted = self.delete([i.source for i in infos])
            outcome.seconds = time.monotonic() - started
            return outcome
        occupied = [n for n in tgt.keys.all() if n != tgt.keys.migration]
        if not ours and tgt.client.exists(*occupied):
            raise MigrationRefused(
                f"the target already holds a crawl {tgt.keys.namespace!r} that this migration "
                f"did not start: remove it there first (distcrawl reset {tgt.keys.namespace})"
            )
        infos = self.listed = self.source_keys()
        if not infos:
            raise MigrationRefused(f"no key of the crawl {src.keys.namespace!r} at the source")
        outcome = Outcome(keys=len(infos))
        if dry_run:
            return outcome
        ident = outgoing or uuid.uuid4().hex
        if outgoing is None:  # the record of a migration that brought the crawl here
            src.client.delete(src.keys.migration)
        tgt.client.delete(tgt.keys.migration)
        src.client.hset(
            src.keys.migration, mapping={"id": ident, "to": tgt.shown, "state": "copying"}
        )
        tgt.client.hset(tgt.keys.migration, mapping={"id": ident, "from": src.shown})
        for chunk in _by_size(infos):
            self._copy(chunk, outcome)
        outcome.mismatches = self.verify(infos)
        if not outcome.mismatches:
            src.client.hset(src.keys.migration, "state", "done")
            if delete_source:
                outcome.deleted = self.delete([i.source for i in infos])
        outcome.seconds = time.monotonic() - started
        return outcome

    def _copy(self, chunk: Sequence[KeyInfo], outcome: Outcome) -> None:
        """One batch: DUMP and PTTL on the source, DUMP on the target, RESTORE REPLACE of
        each key that differs (three round trips, whatever the batch size)."""
        src, tgt = self.source, self.target
        pipe = src.client.pipeline(transaction=False)
        for info in chunk:
            pipe.dump(info.source)
            pipe.pttl(info.source)
        mine = pipe.execute()
        pipe = tgt.client.pipeline(transaction=False)
        for info in chunk:
            pipe.dump(info.target)
        theirs = pipe.execute()
        pipe = tgt.client.pipeline(transaction=False)
        for i, info in enumerate(chunk):
            payload, ttl = mine[2 * i], int(mine[2 * i + 1])
            if payload is None or ttl == -2:
                outcome.expired += 1
            elif payload == theirs[i] or self._same(info, theirs[i]):
                outcome.unchanged += 1
            else:
                pipe.restore(info.target, max(ttl, 0), payload, replace=True)
                outcome.copied += 1
        pipe.execute()

    def _same(self, info: KeyInfo, theirs: bytes | None) -> bool:
        """Whether the target's key holds what the source's does though the DUMPs differ
        (a hash table's order); keys past COMPARE_MEMBERS are simply copied again."""
        if theirs is None or info.type in ("string", "list") or info.size > COMPARE_MEMBERS:
            return False
        if describe(self.target, [info.target])[0].type != info.type:
            return False
        return bool(
            _content(self.source, info.source, info.type)
            == _content(self.target, info.target, info.type)
        )

    def verify(self, infos: Sequence[KeyInfo]) -> list[str]:
        """Each key whose type or size differs between the two sides, as a line; a key with
        a TTL may have expired on either side meanwhile, and is no difference then."""
        out = []
        for chunk in _chunks(infos, BATCH):
            names = [i.source for i in chunk]
            mine = describe(self.source, names)
            theirs = describe(self.target, [i.target for i in chunk])
            for listed, a, b in zip(chunk, mine, theirs, strict=True):
                if (a.type, a.size) == (b.type, b.size):
                    continue
                if "none" in (a.type, b.type) and listed.ttl_ms >= 0:
                    continue  # a TTL ran out on one side meanwhile
                out.append(f"{a.source}: {a.type} of {a.size}, target {b.type} of {b.size}")
        return out

    def delete(self, names: Sequence[str]) -> int:
        """UNLINK the source's keys: freed in the background. ``paused`` and the migration
        record go last, in one command, so that a run again after an interruption here
        still finds a paused crawl whose move is done, and deletes the rest."""
        k = self.source.keys
        last = [k.paused, k.migration]
        removed = 0
        for chunk in _chunks([n for n in names if n not in last], 500):
            removed += int(self.source.client.unlink(*chunk))
        return removed + int(self.source.client.unlink(*last))
