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
from collections.abc import Iterable, Sequence
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


class Leased(NamedTuple):
    id: str
    priority: int
    payload: bytes


class LeaseResult(NamedTuple):
    items: list[Leased]
    queue_size: int
    delayed: int
    released: int


@dataclass(frozen=True)
class CommitResult:
    enqueued: int = 0
    duplicates: int = 0
    dead: int = 0
    skipped: int = 0
    queue_size: int = 0


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


def split_value(value: bytes) -> tuple[int, bytes]:
    prio, _, payload = value.partition(b":")
    return int(prio), payload


class Frontier:
    """``seen`` picks the seen-set, ``"set"`` or ``"bloom"`` (``DISTCRAWL_SEEN``); the Bloom
    filter's capacity and error rate only matter to the worker that creates it."""

    def __init__(
        self,
        client: redis.Redis,
        keys: FrontierKeys,
        *,
        seen: str = "set",
        bloom_capacity: int = DEFAULT_CAPACITY,
        bloom_error_rate: float = DEFAULT_ERROR_RATE,
    ) -> None:
        if seen not in SEEN_MODES:
            raise ValueError(f"unknown seen-set {seen!r}: expected one of {', '.join(SEEN_MODES)}")
        self.client = client
        self.keys = keys
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

    def commit(self, acks: Sequence[str], entries: Sequence[Entry]) -> CommitResult:
        k = self.keys
        args: list[Any] = [len(acks), *acks, len(entries)]
        for e in entries:
            args += [e.kind, e.fingerprint, e.priority, e.payload, e.raw]
        keys = [k.queue, k.requests, k.seen, k.seq, k.leases, k.start_urls, k.dead, k.delayed]
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

    def lease(self, count: int, lease_ms: int, *, promote: int = 1000) -> LeaseResult:
        """Lease up to ``count`` requests, after moving up to ``promote`` due retries into
        the queue."""
        k = self.keys
        res = self.scripts.lease(
            keys=[k.queue, k.requests, k.leases, k.delayed], args=[count, lease_ms, promote]
        )
        out = []
        for i in range(3, len(res), 2):
            prio, payload = split_value(res[i + 1])
            out.append(Leased(res[i].decode(), prio, payload))
        return LeaseResult(out, int(res[0]), int(res[1]), int(res[2]))

    def redrive(self, moves: Sequence[tuple[bytes, str, int, bytes]]) -> int:
        """Move dead-letter records back: (record, 'q' or 'u', priority, payload or raw)."""
        if not moves:
            return 0
        k = self.keys
        args: list[Any] = []
        for move in moves:
            args += list(move)
        keys = [k.dead, k.queue, k.requests, k.seq, k.start_urls]
        return int(self.scripts.redrive(keys=keys, args=args))

    def renew(self, ids: Iterable[str], lease_ms: int) -> int:
        ids = list(ids)
        if not ids:
            return 0
        return int(self.scripts.renew(keys=[self.keys.leases], args=[lease_ms, *ids]))

    def requeue_expired(self, limit: int = 1000) -> int:
        k = self.keys
        return int(
            self.scripts.requeue(keys=[k.leases, k.queue, k.requests], args=["expired", limit])
        )

    def release(self, ids: Iterable[str]) -> int:
        ids = list(ids)
        if not ids:
            return 0
        k = self.keys
        return int(
            self.scripts.requeue(keys=[k.leases, k.queue, k.requests], args=["ids", 0, *ids])
        )

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
