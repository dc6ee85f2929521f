"""``distcrawl migrate SPIDER --shards N``: a paused crawl's frontier re-split from the M shards
its layout record names into N, on the same Redis (a single server or a cluster).

Every queued request moves to the shard of its URL (:func:`distcrawl.model.shards.shard_of_url`),
read from its payload (msgpack, JSON; pickle only with ``trust_pickle``); it keeps its slot,
priority and payload and gets a new id. A retry waiting in ``delayed`` moves with its due time
and record. A member or record that cannot be read goes to the crawl's dead letters with the
reason, never dropped. The seen-set cannot be routed (fingerprints are hashes), so every
target shard gets all of it (the union of the M sources'): a set is copied member by member, a
Bloom filter's layers are stacked (each source's layers, tested in turn, are the union). Of the
per-slot state, ``limits``, the robots.txt Crawl-delays and the adaptive throttle go to every
target shard; the slots' next turns, the in-flight counts, the hungry marks and the sweep's
cursors rebuild (nothing is leased). The crawl-wide keys stay as they are.

Safe to interrupt at any point, and a run again finishes the job:

- the source is only read until the layout record ``<ns>:meta`` names N shards, so workers
  started before that point find the old layout whole;
- the new ids are fixed when the run starts (``base`` + the member's position among the
  source's members), so copying a batch twice writes the same members twice, not twice as
  many; the positions reached are recorded in the crawl's ``migration`` HASH (``reshard:*``
  fields), and so are the dead letters to write, which are written only with the switch;
- the switch is one transaction on the crawl's own keys: the dead letters, ``shards`` = N and
  the record's state; only then are the old layout's keys deleted, the crawl's ``migration``
  fields last, so that a run again after an interruption there deletes the rest.

A crawl is moved only paused with its workers stopped and no lease held (a lease is a request
some worker may still acknowledge in the old layout): see :meth:`Resharding.problems`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from distcrawl.admin._reshard_copy import BATCH, copy_bloom, copy_per_slot
from distcrawl.admin.migrate import RunOutcome, not_stopped, text_of
from distcrawl.codec.serialize import DecodeError, RequestCodec
from distcrawl.model.connection import is_cluster, server_ms
from distcrawl.model.deadrecord import dead_letter
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.names import MAX_SHARDS
from distcrawl.model.queue_entry import QueueEntryError, QueueMember, renumbered, split_member
from distcrawl.model.seen import BloomState, part_keys
from distcrawl.model.shards import shard_of_url

#: a lease's token, for a retry waiting in ``delayed`` (lib.lua's NO_TOKEN)
NO_TOKEN = b"\0" * 8
#: the frontier's keys of a shard: what moves (or rebuilds), and what the old layout loses
SHARD_STATE = (
    "queue", "requests", "leases", "delayed", "seen", "bloom", "seq", "ready", "slots",
    "inflight", "placeless", "throttle", "throttle_raised", "throttle_state", "hungry",
    "limits", "robots", "sweep",
)  # fmt: skip
#: per-slot HASHes copied into every target shard
PER_SLOT_COPIED = ("limits", "robots", "throttle", "throttle_raised", "throttle_state")
#: keys that must be empty in the target shards before a run starts
MUST_BE_EMPTY = ("queue", "requests", "leases", "delayed", "seen", "bloom")
#: the crawl's ``migration`` HASH fields of a re-sharding all start with this
PREFIX = "reshard:"


class ReshardRefused(Exception):
    """The crawl may not be re-sharded now: nothing written."""


@dataclass
class ReshardOutcome(RunOutcome):
    """What a run did, printed (or as JSON) by the command."""

    from_shards: int = 1
    to_shards: int = 1
    queued: int = 0
    retries: int = 0
    dead_lettered: int = 0
    seen: int = 0


@dataclass(frozen=True)
class _Source:
    """One source shard's part of a copy: the ids it gives start at ``first_id``."""

    j: int
    keys: FrontierKeys
    targets: list[FrontierKeys]
    first_id: int


#: one batch from a position: its writes into the pipeline, its dead letters into the dict;
#: returns how many members it read
_Batch = Callable[[int, Any, dict[Any, Any]], int]


class Resharding:
    """The re-splitting of crawl ``namespace`` on ``client`` into ``shards`` shards."""

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        shards: int,
        *,
        worker_timeout: float = 10.0,
        trust_pickle: bool = False,
    ) -> None:
        if not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"invalid shard count {shards}: 1 to {MAX_SHARDS}")
        self.client = client
        self.crawl = FrontierKeys(namespace).on_cluster(is_cluster(client))
        self.to_shards = shards
        self.worker_timeout = worker_timeout
        self.codec = RequestCodec("pickle" if trust_pickle else "msgpack")
        self.trust_pickle = trust_pickle

    # ------------------------------------------------------------------ the layouts

    def record(self) -> dict[str, str]:
        raw = self.client.hgetall(self.crawl.migration)
        return {text_of(k): text_of(v) for k, v in raw.items() if text_of(k).startswith(PREFIX)}

    def recorded_shards(self) -> int:
        return int(self.client.hget(self.crawl.meta, "shards") or 1)

    def _layout(self, count: int) -> list[FrontierKeys]:
        return self.crawl.parts(count)

    def problems(self, *, force: bool = False) -> list[str]:
        """Why the crawl may not be re-sharded now (empty: it may). ``force`` skips the checks
        that it is paused and no worker beats, never the one about leases."""
        k, client = self.crawl, self.client
        if not client.exists(k.meta):
            return [f"no crawl {k.namespace!r} here (no layout record {k.meta})"]
        out = [] if force else not_stopped(client, k, self.worker_timeout)
        source = int(self.record().get(PREFIX + "from") or self.recorded_shards())
        leased = sum(int(client.zcard(s.leases)) for s in self._layout(source))
        if leased:
            out.append(
                f"{leased} request(s) leased: a worker may still acknowledge them in the old "
                "layout. Wait for the lease timeout (DISTCRAWL_LEASE_TIMEOUT), then start one "
                "worker (its reaper requeues them), pause the crawl again and stop the worker"
            )
        revisits = sum(
            int(client.zcard(s.revisits)) + int(client.zcard(s.revisit_queue))
            for s in self._layout(source)
        )
        if revisits:
            # not moved yet: left in the old layout, they would never be fetched again
            out.append(
                f"{revisits} page revisit(s) scheduled (DISTCRAWL_RECRAWL_INTERVAL): "
                "re-sharding does not move revisits yet"
            )
        serializer = text_of(client.hget(k.meta, "serializer") or b"")
        if serializer == "pickle" and not self.trust_pickle:
            out.append("the crawl's requests are pickled: add --trust-pickle to read their URLs")
        if source != self.to_shards:
            mine = {s.prefix for s in self._layout(source)}
            clash = mine & {t.prefix for t in self._layout(self.to_shards)}
            if clash:
                out.append(
                    f"shards of {source} and {self.to_shards} share the key prefixes "
                    f"{', '.join(sorted(clash))}: re-shard through 1 (--shards 1, then "
                    f"--shards {self.to_shards})"
                )
        return out

    # ------------------------------------------------------------------ the run

    def run(self) -> ReshardOutcome:
        """Copy, verify, switch the layout record, delete the old layout; or go on from where
        an interrupted run stopped. Call ``problems()`` first."""
        started = time.monotonic()
        rec = self.record()
        if rec and int(rec[PREFIX + "to"]) != self.to_shards:
            raise ReshardRefused(
                f"an interrupted re-sharding to {rec[PREFIX + 'to']} shards: finish it first "
                f"(--shards {rec[PREFIX + 'to']})"
            )
        source = int(rec.get(PREFIX + "from") or self.recorded_shards())
        out = ReshardOutcome(source, self.to_shards)
        if not rec and source == self.to_shards:
            out.already_done = True
            return out
        if not rec:
            rec = self._start(source)
        if rec[PREFIX + "state"] == "copying":
            self._copy(rec, out)
            out.mismatches = self.verify(rec)
            if out.mismatches:
                out.seconds = time.monotonic() - started
                return out
            self._switch()
        out.deleted = self.delete(source)
        out.seconds = time.monotonic() - started
        return out

    def _start(self, source: int) -> dict[str, str]:
        """The record of a new run: the counts and the ids' base, read once."""
        if source < 1:
            raise ReshardRefused(f"invalid recorded shard count {source}")
        sources, targets = self._layout(source), self._layout(self.to_shards)
        pipe = self.client.pipeline(transaction=False)
        for t in targets:
            for name in MUST_BE_EMPTY:
                pipe.exists(getattr(t, name))
        if any(pipe.execute()):
            raise ReshardRefused(
                f"the keys of {self.to_shards} shards already hold requests or a seen-set: "
                f"not this run's (distcrawl reset {self.crawl.namespace}, or move them away)"
            )
        pipe = self.client.pipeline(transaction=False)
        for s in sources:
            pipe.zcard(s.queue)
            pipe.zcard(s.delayed)
        for k in {*sources, *targets, self.crawl}:
            pipe.get(k.seq)
        replies = pipe.execute()
        base = max(int(v or 0) for v in replies[2 * source :])
        now = server_ms(self.client, self.crawl.alive)
        rec = {
            "id": uuid.uuid4().hex,
            "from": str(source),
            "to": str(self.to_shards),
            "state": "copying",
            "base": str(base),
            "now": str(now),
        }
        for j in range(source):
            rec[f"queued:{j}"] = str(replies[2 * j])
            rec[f"delayed:{j}"] = str(replies[2 * j + 1])
        rec = {PREFIX + k: v for k, v in rec.items()}
        mapping: dict[Any, Any] = rec
        self.client.hset(self.crawl.migration, mapping=mapping)
        return rec

    # ------------------------------------------------------------------ the copy

    def _copy(self, rec: dict[str, str], out: ReshardOutcome) -> None:
        source = int(rec[PREFIX + "from"])
        sources, targets = self._layout(source), self._layout(self.to_shards)
        queued = [int(rec[f"{PREFIX}queued:{j}"]) for j in range(source)]
        delayed = [int(rec[f"{PREFIX}delayed:{j}"]) for j in range(source)]
        next_id = int(rec[PREFIX + "base"]) + 1
        now = int(rec[PREFIX + "now"])
        for j, s in enumerate(sources):
            queue = self._queue(_Source(j, s, targets, next_id), now, out)
            self._in_batches(rec, f"queue:{j}", queued[j], out, queue)
            next_id += queued[j]
        for j, s in enumerate(sources):
            retries = self._delayed(_Source(j, s, targets, next_id), out)
            self._in_batches(rec, f"delayed:{j}:at", delayed[j], out, retries)
            next_id += delayed[j]
        layers = 0
        for j, s in enumerate(sources):
            out.seen += self._seen(rec, j, s, targets)
            # an imported crawl's legacy seen-set: a fingerprint does not tell its shard
            self._seen(rec, j, s, targets, "legacy_seen")
            layers += copy_bloom(self.client, j, s, targets, layers)
        for s in sources:
            for name in PER_SLOT_COPIED:
                copy_per_slot(self.client, getattr(s, name), [getattr(t, name) for t in targets])
        pipe = self.client.pipeline(transaction=False)
        for t in targets:  # above every id given: lib.lua numbers on from here
            pipe.get(t.seq)
        current = pipe.execute()
        pipe = self.client.pipeline(transaction=False)
        for t, value in zip(targets, current, strict=True):
            pipe.set(t.seq, max(int(value or 0), next_id - 1))
        pipe.execute()

    def _progress(self, name: str, value: Any, dead: dict[Any, Any]) -> None:
        """The position reached, and the dead letters met on the way (written at the switch)."""
        self.client.hset(self.crawl.migration, mapping={PREFIX + name: str(value), **dead})

    def _url_shard(self, payload: bytes) -> int | str:
        """The target shard of a request's payload, or why it has none."""
        try:
            url = self.codec.decode_dict(payload)["u"]
        except DecodeError as exc:
            return str(exc)
        return shard_of_url(url, self.to_shards)

    def _entry(self, member: bytes) -> tuple[int | str, QueueMember | None]:
        """(target shard or why it has none, its parts) of a queue member: parsed by the
        rule the workers apply (queue_entry.split_member), so that what they would refuse
        goes to the dead letters here instead of into the new shards."""
        try:
            parts = split_member(member)
        except QueueEntryError as exc:
            return f"malformed queue entry: {exc}", None
        return self._url_shard(parts.payload), parts

    def _in_batches(
        self, rec: dict[str, str], name: str, count: int, out: ReshardOutcome, batch: _Batch
    ) -> None:
        """Runs ``batch`` from the position recorded under ``name`` until ``count`` members are
        read: each batch's position and dead letters are recorded together, after its writes,
        so that a run again after an interruption copies at most that batch twice."""
        at = int(rec.get(PREFIX + name, 0))
        while at < count:
            pipe = self.client.pipeline(transaction=False)
            dead: dict[Any, Any] = {}
            read = batch(at, pipe, dead)
            pipe.execute()
            out.dead_lettered += len(dead)
            at += read
            self._progress(name, at, dead)
            if not read:
                break

    def _queue(self, src: _Source, now: int, out: ReshardOutcome) -> _Batch:
        def batch(at: int, pipe: Any, dead: dict[Any, Any]) -> int:
            members: Any = self.client.zrange(src.keys.queue, at, at + BATCH - 1)
            for pos, member in enumerate(members, start=at):
                shard, parts = self._entry(member)
                if isinstance(shard, str) or parts is None:
                    dead[f"{PREFIX}dead:q:{src.j}:{pos}"] = dead_letter(
                        str(shard), raw=member, source="queue", moved="reshard"
                    )
                    continue
                t = src.targets[shard]
                pipe.zadd(t.queue, {renumbered(parts, member, src.first_id + pos): 0})
                pipe.zadd(t.ready, {parts.slot.encode(): now})
                out.queued += 1
            return len(members)

        return batch

    def _delayed(self, src: _Source, out: ReshardOutcome) -> _Batch:
        def batch(at: int, pipe: Any, dead: dict[Any, Any]) -> int:
            due: Any = self.client.zrange(src.keys.delayed, at, at + BATCH - 1, withscores=True)
            records: Any = self.client.hmget(src.keys.requests, [i for i, _ in due]) if due else []
            for pos, ((old, when), record) in enumerate(zip(due, records, strict=True), start=at):
                entry = record[len(NO_TOKEN) :] if record else b""
                shard, parts = self._entry(entry) if record else ("retry without record", None)
                if isinstance(shard, str) or parts is None:
                    dead[f"{PREFIX}dead:d:{src.j}:{pos}"] = dead_letter(
                        str(shard),
                        raw=entry or old,
                        source="retry",
                        moved="reshard",
                        id=text_of(old),
                    )
                    continue
                new = src.first_id + pos
                t = src.targets[shard]
                pipe.hset(t.requests, f"{new:012x}", NO_TOKEN + renumbered(parts, entry, new))
                pipe.zadd(t.delayed, {f"{new:012x}": when})
                out.retries += 1
            return len(due)

        return batch

    def _seen(
        self,
        rec: dict[str, str],
        j: int,
        s: FrontierKeys,
        targets: list[FrontierKeys],
        name: str = "seen",
    ) -> int:
        """Every fingerprint of source ``s``'s seen SET (or its legacy seen-set, ``name``)
        into every target's; SSCAN's cursor is recorded (a member returned twice is added
        twice: no change)."""
        cursor = int(rec.get(f"{PREFIX}{name}:{j}", 0))
        if cursor < 0:
            return 0
        copied = 0
        while True:
            cursor, members = self.client.sscan(getattr(s, name), cursor, count=BATCH)
            if members:
                pipe = self.client.pipeline(transaction=False)
                for t in targets:
                    pipe.sadd(getattr(t, name), *members)
                pipe.execute()
                copied += len(members)
            self._progress(f"{name}:{j}", cursor or -1, {})
            if not cursor:
                return copied

    # ------------------------------------------------------------------ verify and switch

    def _staged(self) -> dict[bytes, bytes]:
        match = f"{PREFIX}dead:*"
        return dict(self.client.hscan_iter(self.crawl.migration, match=match, count=BATCH))

    def verify(self, rec: dict[str, str]) -> list[str]:
        """Each count that differs: the source unchanged, every request in a target shard or
        a dead letter, every target holding the whole seen-set."""
        source = int(rec[PREFIX + "from"])
        sources, targets = self._layout(source), self._layout(self.to_shards)
        out = []
        pipe = self.client.pipeline(transaction=False)
        for k in (*sources, *targets):
            pipe.zcard(k.queue)
            pipe.zcard(k.delayed)
            pipe.hlen(k.requests)
            pipe.scard(k.seen)
        replies = pipe.execute()
        sizes = [replies[at : at + 4] for at in range(0, len(replies), 4)]
        for j in range(source):
            was = (int(rec[f"{PREFIX}queued:{j}"]), int(rec[f"{PREFIX}delayed:{j}"]))
            if tuple(sizes[j][:2]) != was:
                out.append(f"{sources[j].queue}: the source changed during the move {was}")
        staged = self._staged()
        dead_q = sum(1 for k in staged if k.startswith(f"{PREFIX}dead:q:".encode()))
        dead_d = len(staged) - dead_q
        queued = sum(s[0] for s in sizes[source:])
        if queued + dead_q != sum(s[0] for s in sizes[:source]):
            was = sum(s[0] for s in sizes[:source])
            out.append(f"queue: {queued} moved + {dead_q} dead letters, the source {was}")
        retries = sum(s[1] for s in sizes[source:])
        if retries + dead_d != sum(s[1] for s in sizes[:source]):
            out.append(f"delayed: {retries} moved + {dead_d} dead letters")
        if sum(s[2] for s in sizes[source:]) != retries:
            out.append("requests: records other than the retries' in the target shards")
        seen = [s[3] for s in sizes[:source]]
        for t, got in zip(targets, sizes[source:], strict=True):
            if not max(seen) <= got[3] <= sum(seen):
                out.append(f"{t.seen}: {got[3]} fingerprints, the source {seen}")
        layers = sum(BloomState.parse(self.client.hgetall(s.bloom)).layers for s in sources)
        for t in targets:
            if BloomState.parse(self.client.hgetall(t.bloom)).layers != layers:
                out.append(f"{t.bloom}: not the {layers} layers of the source")
        return out

    def _switch(self) -> None:
        """One transaction on the crawl's own keys: the dead letters, the layout record's
        shard count, the state. From here workers of N shards may start."""
        staged = sorted(self._staged().items())
        pipe = self.client.pipeline(transaction=True)
        for at in range(0, len(staged), BATCH):
            pipe.lpush(self.crawl.dead, *(v for _, v in staged[at : at + BATCH]))
            pipe.hdel(self.crawl.migration, *(k for k, _ in staged[at : at + BATCH]))
        if staged:
            pipe.hincrby(self.crawl.stats, "quarantined", len(staged))
        pipe.hset(self.crawl.meta, "shards", str(self.to_shards))
        pipe.hset(self.crawl.migration, PREFIX + "state", "switched")
        pipe.execute()

    # ------------------------------------------------------------------ delete

    def old_keys(self, source: int) -> list[FrontierKeys]:
        return self._layout(source)

    def delete(self, source: int) -> int:
        """The old layout's keys: with one shard, the crawl's own frontier keys (not its
        crawl-wide ones); with more, every key of each shard, once its dead letters are
        copied to the crawl's and its counters added to the crawl's. The crawl's record of the
        run goes last."""
        removed = 0
        for s in self._layout(source):
            # the Bloom parts before their list (the bloom HASH): a run again finds the rest
            names = part_keys(s, BloomState.parse(self.client.hgetall(s.bloom)))
            names += [getattr(s, n) for n in SHARD_STATE]
            if s.shard is not None:
                self._fold(s)
                names += [n for n in s.all() if n != s.start_urls]
            for at in range(0, len(names), 500):
                removed += int(self.client.unlink(*dict.fromkeys(names[at : at + 500])))
        fields = list(self.record())
        if fields:
            self.client.hdel(self.crawl.migration, *fields)
        return removed

    def _fold(self, s: FrontierKeys) -> None:
        """A shard's dead letters into the crawl's (copied, then trimmed: at least once) and
        its counters into the crawl's (once: a field of the record says they were)."""
        while True:
            records = self.client.lrange(s.dead, -BATCH, -1)
            if not records:
                break
            self.client.lpush(self.crawl.dead, *reversed(records))
            self.client.ltrim(s.dead, 0, -len(records) - 1)
        done = f"{PREFIX}stats:{s.shard}"
        if self.client.hexists(self.crawl.migration, done):
            return
        counters = self.client.hgetall(s.stats)
        pipe = self.client.pipeline(transaction=True)  # the crawl's own keys: one slot
        for name, value in counters.items():
            pipe.hincrby(self.crawl.stats, name, int(value))
        pipe.hset(self.crawl.migration, done, "1")
        pipe.execute()
