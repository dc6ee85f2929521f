"""The shared frontier: synchronous Redis operations, one round trip each.

Nothing here touches the reactor: the scheduler runs these methods on its I/O thread and
hands the results back. Keeping them synchronous and free of Scrapy state makes them easy
to test against a real server and to reuse from the ``distcrawl`` command.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

from distcrawl.keys import FrontierKeys
from distcrawl.lua import SEEN_MODES, Scripts
from distcrawl.seen import DEFAULT_CAPACITY, DEFAULT_ERROR_RATE, BloomFilter, BloomState, part_keys


class Entry(NamedTuple):
    """One thing to store: see the ARGV section of ``commit.lua`` for the kinds."""

    kind: str
    fingerprint: bytes
    priority: int
    payload: bytes
    raw: bytes = b""
    slot: str = ""


class Feedback(NamedTuple):
    """What one slot's responses said since the last commit (see ``commit.lua``)."""

    slot: str
    responses: int
    latency_ms: int
    throttled: int
    retry_after_ms: int


class Leased(NamedTuple):
    id: str
    priority: int
    payload: bytes
    slot: str = ""
    #: taken at the start of a turn of a slot with a delay (see lease.lua)
    paced: bool = False


class LeaseResult(NamedTuple):
    items: list[Leased]
    queue_size: int
    delayed: int
    released: int
    #: seconds until some slot's turn comes or a retry is due (None: neither)
    wait: float | None = None
    #: the server's clock at the lease (ms), for ``sent``
    leased_at: int = 0


@dataclass(frozen=True)
class CommitResult:
    enqueued: int = 0
    duplicates: int = 0
    dead: int = 0
    skipped: int = 0
    queue_size: int = 0
    #: new requests dropped because the queue was at DISTCRAWL_MAX_PENDING
    dropped: int = 0
    #: start_urls entries left in their list for the same reason
    held: int = 0


@dataclass(frozen=True)
class Politeness:
    """The cluster-wide limits the scripts apply; built once from DistcrawlConfig."""

    delay_ms: int = 0
    concurrency: int = 2**31 - 1
    #: JSON {slot: [delay ms, concurrency]} from DOWNLOAD_SLOTS (-1: not set), or ""
    overrides: str = ""
    #: "<probe timeout ms>:<max Crawl-delay ms>" when robots.txt is obeyed, else ""
    robots: str = ""
    #: "<start ms>:<max ms>:<target concurrency>" (see commit.lua)
    throttle: str = "1000:60000:0"
    max_pending: int = 0
    keep_priority: int = 2**31
    scan: int = 64


def _overrides(text: str) -> dict[str, list[int]]:
    return json.loads(text) if text else {}


def make_entry(slot: str, priority: int, seq: int, payload: bytes) -> bytes:
    """A queue entry as ``lua/lib.lua`` builds it (for tools and tests)."""
    priority = max(-(2**31) + 1, min(2**31 - 1, priority))
    key = (2**31 - priority).to_bytes(4, "big") + seq.to_bytes(6, "big")
    return slot.encode() + b"\0" + key + payload


def parse_entry(entry: bytes) -> Leased:
    """Split a queue entry (layout in ``lua/lib.lua``) into id, priority, payload, slot."""
    cut = entry.index(b"\0")
    prio = 2**31 - int.from_bytes(entry[cut + 1 : cut + 5], "big")
    return Leased(entry[cut + 5 : cut + 11].hex(), prio, entry[cut + 11 :], entry[:cut].decode())


def worker_id() -> str:
    """Who did it, for dead letters and logs: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def dead_letter(
    reason: str,
    *,
    raw: bytes | str | None = None,
    url: str | None = None,
    source: str,
    **extra: Any,
) -> bytes:
    """A dead-letter record: JSON, so that operators can read it with ``redis-cli``."""
    record: dict[str, Any] = {
        "reason": reason,
        "source": source,
        "url": url,
        "worker": worker_id(),
        "time": time.time(),
    }
    if raw is not None:
        if isinstance(raw, bytes):
            try:
                record["raw"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                record["raw"] = raw.decode("latin-1")
                record["raw_encoding"] = "latin-1"
        else:
            record["raw"] = raw
    record.update(extra)
    return json.dumps(record, separators=(",", ":"), default=repr).encode()


class Frontier:
    """``seen`` picks the seen-set, ``"set"`` or ``"bloom"`` (``DISTCRAWL_SEEN``); the Bloom
    filter's capacity and error rate only matter to the worker that creates it."""

    def __init__(
        self,
        client: redis.Redis,
        keys: FrontierKeys,
        politeness: Politeness | None = None,
        *,
        seen: str = "set",
        bloom_capacity: int = DEFAULT_CAPACITY,
        bloom_error_rate: float = DEFAULT_ERROR_RATE,
    ) -> None:
        if seen not in SEEN_MODES:
            raise ValueError(f"unknown seen-set {seen!r}: expected one of {', '.join(SEEN_MODES)}")
        self.client = client
        self.keys = keys
        self.politeness = politeness or Politeness()
        self._overrides = _overrides(self.politeness.overrides)
        self.scripts = Scripts.register(client, seen)
        self.bloom: BloomFilter | None = None
        if seen == "bloom":
            self.bloom = BloomFilter(
                client,
                keys,
                self.scripts.bloom_grow,
                capacity=bloom_capacity,
                error_rate=bloom_error_rate,
            )

    def commit(
        self, acks: Sequence[str], entries: Sequence[Entry], feedback: Sequence[Feedback] = ()
    ) -> CommitResult:
        k, p = self.keys, self.politeness
        args: list[Any] = [p.max_pending, p.keep_priority, p.throttle, len(acks), *acks]
        args.append(len(entries))
        for e in entries:
            args += [e.kind, e.fingerprint, e.slot, e.priority, e.payload, e.raw]
        args.append(len(feedback))
        for f in feedback:
            args += list(f)
        keys = [
            k.queue,
            k.requests,
            k.seen,
            k.seq,
            k.leases,
            k.start_urls,
            k.dead,
            k.delayed,
            k.ready,
            k.slots,
            k.inflight,
            k.throttle,
            k.robots,
            k.throttle_raised,
        ]
        if self.bloom is not None:
            res = self.bloom.run(self.scripts.commit, keys, args)
        else:
            res = self.scripts.commit(keys=keys, args=args)
        return CommitResult(*(int(x) for x in res))

    def add_seen(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Mark fingerprints seen without queueing anything (URLs crawled elsewhere);
        True for each one that was new."""
        return [bool(x) for x in self._seen("add", fingerprints)]

    def has_seen(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Whether each fingerprint is (probably, for the Bloom filter) in the seen-set."""
        return [bool(x) for x in self._seen("has", fingerprints)]

    def _seen(self, op: str, fingerprints: Sequence[bytes]) -> list[int]:
        if not fingerprints:
            return []
        args: list[Any] = [op, *fingerprints]
        if self.bloom is not None:
            return list(self.bloom.run(self.scripts.seen, [], args))
        return list(self.scripts.seen(keys=[self.keys.seen], args=args))

    def lease(
        self,
        count: int,
        lease_ms: int,
        *,
        promote: int = 1000,
        held: Mapping[str, int] | None = None,
    ) -> LeaseResult:
        """Lease up to ``count`` requests from the slots whose turn has come, after moving
        up to ``promote`` due retries into the queue. ``held``: how many requests of each
        slot the caller already holds, for the fair share of a contended slot."""
        k, p = self.keys, self.politeness
        mine = json.dumps(dict(held), separators=(",", ":")) if held else ""
        res = self.scripts.lease(
            keys=[
                k.queue,
                k.requests,
                k.leases,
                k.delayed,
                k.ready,
                k.slots,
                k.inflight,
                k.throttle,
                k.limits,
                k.robots,
                k.hungry,
            ],
            args=[
                *(count, lease_ms, promote, p.scan, p.delay_ms, p.concurrency),
                *(p.overrides, p.robots, mine),
            ],
        )
        items = [parse_entry(res[i + 1])._replace(paced=res[i] == 1) for i in range(5, len(res), 2)]
        wait = None if int(res[3]) < 0 else int(res[3]) / 1000
        return LeaseResult(items, int(res[0]), int(res[1]), int(res[2]), wait, int(res[4]))

    def sent(self, paced: Sequence[tuple[str, int]]) -> int:
        """Report that requests of slots with a delay, leased at the given server times,
        were sent only now: their slots' next turns move back by the lag (sent.lua)."""
        if not paced:
            return 0
        args = [x for slot, leased_at in paced for x in (slot, leased_at)]
        return int(self.scripts.sent(keys=[self.keys.slots, self.keys.ready], args=args))

    def delay_ms(self, slot: str) -> int:
        """The slot's delay from the settings (DOWNLOAD_SLOTS, else the default)."""
        override = self._overrides.get(slot)
        if override and override[0] >= 0:
            return int(override[0])
        return self.politeness.delay_ms

    def record_crawl_delay(self, slot: str, delay_ms: int, *, fetched: bool) -> float:
        """Record a slot's robots.txt Crawl-delay; returns how long (s) the request that
        waited for robots.txt must still wait, when this worker downloaded it."""
        k = self.keys
        wait = self.scripts.robots(
            keys=[k.robots, k.slots, k.ready, k.limits, k.throttle],
            args=[slot, delay_ms, "fetched" if fetched else "known", self.delay_ms(slot)],
        )
        return int(wait) / 1000

    def redrive(self, moves: Sequence[tuple[bytes, str, str, int, bytes]]) -> int:
        """Move dead-letter records back: (record, 'q' or 'u', slot, priority, payload or
        raw)."""
        if not moves:
            return 0
        k = self.keys
        args: list[Any] = []
        for move in moves:
            args += list(move)
        keys = [k.dead, k.queue, k.seq, k.start_urls, k.ready, k.slots]
        return int(self.scripts.redrive(keys=keys, args=args))

    def renew(self, ids: Iterable[str], lease_ms: int) -> int:
        ids = list(ids)
        if not ids:
            return 0
        return int(self.scripts.renew(keys=[self.keys.leases], args=[lease_ms, *ids]))

    def _requeue_keys(self) -> list[str]:
        k = self.keys
        return [k.leases, k.queue, k.requests, k.ready, k.slots, k.inflight, k.robots]

    def requeue_expired(self, limit: int = 1000) -> int:
        return int(self.scripts.requeue(keys=self._requeue_keys(), args=["expired", limit]))

    def release(self, ids: Iterable[str]) -> int:
        ids = list(ids)
        if not ids:
            return 0
        return int(self.scripts.requeue(keys=self._requeue_keys(), args=["ids", 0, *ids]))

    def robots_txt(self, netloc: str) -> tuple[float, int, bytes] | None:
        """(age in seconds, HTTP status, body) of a netloc's shared robots.txt; status 0 means
        the download failed (read as "allowed", like Scrapy). The age is taken against the
        TIME of the server that stamped the entry, never this host's clock, so that workers
        with skewed clocks agree on when it expires."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.keys.robotstxt, netloc)
        pipe.time()
        value, (seconds, micros) = pipe.execute()
        if value is None:
            return None
        head, _, body = value.partition(b"\n")
        fetched, _, status = head.partition(b" ")
        return seconds + micros / 1e6 - float(fetched), int(status), body

    def lock_robots_txt(self, netloc: str, ttl_ms: int) -> bool:
        return bool(self.client.set(self.keys.robots_lock(netloc), worker_id(), nx=True, px=ttl_ms))

    def store_robots_txt(self, netloc: str, status: int, body: bytes) -> None:
        """Share a downloaded robots.txt, stamped with the server's TIME (robots_store.lua),
        and free the download lock."""
        self.scripts.robots_store(
            keys=[self.keys.robotstxt, self.keys.robots_lock(netloc)], args=[netloc, status, body]
        )

    def pending_room(self) -> int | None:
        """How many more start URLs the pending cap allows (None: no cap published)."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(k.settings, "max_pending")
        pipe.zcard(k.queue)
        pipe.llen(k.start_urls)
        cap, queued, waiting = pipe.execute()
        if cap is None:
            return None
        return max(0, int(cap) - int(queued) - int(waiting))

    def set_limit(self, slot: str, delay: float | None, concurrency: int | None) -> None:
        """A cluster-wide override for one slot, applied from the next lease on; both None
        removes it (the settings apply again)."""
        if delay is None and concurrency is None:
            self.client.hdel(self.keys.limits, slot)
            return
        value = f"{'' if delay is None else int(delay * 1000)}:{concurrency or ''}"
        self.client.hset(self.keys.limits, slot, value)

    def slot_states(self, limit: int = 20) -> list[dict[str, Any]]:
        """The politeness state of the slots with the most requests queued or in flight."""
        k = self.keys
        names: set[bytes] = set(self.client.zrange(k.ready, 0, -1))  # type: ignore[arg-type]
        names |= set(self.client.hkeys(k.inflight))  # type: ignore[arg-type]
        names |= set(self.client.hkeys(k.limits))  # type: ignore[arg-type]
        pipe = self.client.pipeline(transaction=False)
        ordered = sorted(names)
        for name in ordered:
            lo, hi = b"[" + name + b"\0", b"(" + name + b"\1"
            pipe.zlexcount(k.queue, lo, hi)
            pipe.hget(k.inflight, name)
            pipe.hget(k.slots, name)
            pipe.hget(k.throttle, name)
            pipe.hget(k.robots, name)
            pipe.hget(k.limits, name)
        pipe.time()
        values = pipe.execute()
        seconds, micros = values[-1]
        now_ms = seconds * 1000 + micros // 1000
        out = []
        for i, name in enumerate(ordered):
            queued, inflight, next_at, throttle, robots, limits = values[i * 6 : i * 6 + 6]
            out.append(
                {
                    "slot": name.decode(),
                    "queued": int(queued),
                    "in_flight": int(inflight or 0),
                    "next_in": max(0.0, (int(next_at or 0) - now_ms) / 1000),
                    "throttle_delay": int(throttle or 0) / 1000,
                    "crawl_delay": None if robots is None else max(0, int(robots)) / 1000,
                    "override": None if limits is None else limits.decode(),
                }
            )
        out.sort(key=lambda d: (-(d["queued"] + d["in_flight"]), d["slot"]))
        return out[:limit]

    def publish_settings(self, *, max_pending: int | None) -> None:
        """Values producers need (``distcrawl push`` refuses work past the pending cap)."""
        if max_pending:
            self.client.hset(self.keys.settings, "max_pending", max_pending)
        else:
            self.client.hdel(self.keys.settings, "max_pending")

    def peek_start_urls(self, count: int) -> list[bytes]:
        """The oldest entries, without removing them: commit() removes each one atomically
        with the request made from it, so a worker killed in between loses nothing."""
        entries: list[bytes] = self.client.lrange(self.keys.start_urls, -count, -1)  # type: ignore[assignment]
        return entries[::-1]

    def sizes(self) -> dict[str, int]:
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(k.queue)
        pipe.zcard(k.leases)
        pipe.zcard(k.delayed)
        pipe.scard(k.seen)
        pipe.hgetall(k.bloom)
        pipe.llen(k.start_urls)
        pipe.llen(k.dead)
        queue, leases, delayed, seen, bloom, start_urls, dead = pipe.execute()
        return {
            "queue": queue,
            "leased": leases,
            "delayed": delayed,
            "seen": seen + BloomState.parse(bloom).count,
            "start_urls": start_urls,
            "dead": dead,
        }

    def clear(self) -> int:
        bloom = BloomState.parse(self.client.hgetall(self.keys.bloom))
        if self.bloom is not None:
            self.bloom.state = None  # re-read (and re-create) on the next commit
        return int(self.client.delete(*self.keys.all(), *part_keys(self.keys, bloom)))
