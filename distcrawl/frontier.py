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
from distcrawl.lua import Scripts


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
    def __init__(self, client: redis.Redis, keys: FrontierKeys) -> None:
        self.client = client
        self.keys = keys
        self.scripts = Scripts.register(client)

    def commit(self, acks: Sequence[str], entries: Sequence[Entry]) -> CommitResult:
        k = self.keys
        args: list[Any] = [len(acks), *acks, len(entries)]
        for e in entries:
            args += [e.kind, e.fingerprint, e.priority, e.payload, e.raw]
        res = self.scripts.commit(
            keys=[k.queue, k.requests, k.seen, k.seq, k.leases, k.start_urls, k.dead], args=args
        )
        return CommitResult(*(int(x) for x in res))

    def lease(self, count: int, lease_ms: int) -> tuple[list[Leased], int]:
        k = self.keys
        res = self.scripts.lease(keys=[k.queue, k.requests, k.leases], args=[count, lease_ms])
        out = []
        for i in range(1, len(res), 2):
            prio, payload = split_value(res[i + 1])
            out.append(Leased(res[i].decode(), prio, payload))
        return out, int(res[0])

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
        pipe.scard(k.seen)
        pipe.llen(k.start_urls)
        pipe.llen(k.dead)
        queue, leases, seen, start_urls, dead = pipe.execute()
        return {
            "queue": queue,
            "leased": leases,
            "seen": seen,
            "start_urls": start_urls,
            "dead": dead,
        }

    def clear(self) -> int:
        return int(self.client.delete(*self.keys.all()))
