"""The frontier's sizes, read one way for everyone who shows them.

``distcrawl status`` and ``watch`` (distcrawl/model/dashboard.py), the producer's ``status()``,
``FrontierAdmin.sizes`` (the scheduler's opening line) and the web console read the same numbers:
how many requests are queued, in flight, retrying, dead, due again later, how many start URLs
wait and how many URLs were seen. They are read here, as :class:`FrontierSizes`, so that a
size is counted by one rule (the queue includes the due revisits' queue, the seen-set the Bloom
filter's URLs) and a new one is added once.

Every read is O(1) (ZCARD, SCARD, LLEN, HLEN-sized HGETALL of the Bloom filter's header):
a snapshot is cheap enough for every second of a large crawl. One keyset's reads are one
pipelined round trip; a sharded crawl's are one per shard (each shard is a hash slot of its
own on a cluster), plus the crawl's own keys (its start URLs and dead letters).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from distcrawl.model.keys import FrontierKeys
from distcrawl.model.names import MAX_SHARDS
from distcrawl.model.ops import Op
from distcrawl.model.seen import BloomState

#: the sizes a sharded crawl's total adds up over its shards (start URLs are the crawl's)
_SUMMED = ("queue", "leased", "delayed", "revisits", "seen", "dead", "queue_slots", "quarantined")
#: every size :func:`size_commands` can read, in the order it reads them
ALL_SIZES = (
    "queue",
    "leased",
    "delayed",
    "revisits",
    "seen",
    "start_urls",
    "dead",
    "queue_slots",
    "quarantined",
    "runnable",
    "finished",
)


@dataclass(frozen=True)
class FrontierSizes:
    """The sizes of a crawl's frontier (or of one of its shards) at one moment."""

    #: requests waiting to be leased, due revisits included (lease.lua takes both)
    queue: int = 0
    #: requests leased by a worker and not acknowledged yet (in flight)
    leased: int = 0
    #: requests waiting for a retry's backoff
    delayed: int = 0
    #: pages to fetch again, not due yet (DISTCRAWL_RECRAWL_INTERVAL)
    revisits: int = 0
    #: URLs in the seen-set (a Bloom filter's count of them with DISTCRAWL_SEEN = "bloom")
    seen: int = 0
    #: producer entries not claimed by a worker yet
    start_urls: int = 0
    #: dead-letter records
    dead: int = 0
    #: slots (hosts, download slots) with queued requests
    queue_slots: int = 0
    #: unparsable queue entries the workers moved to the dead letters
    quarantined: int = 0
    #: requests the crawl could run now within its politeness, as the reaper last counted
    #: them (lua/runnable.lua): the autoscaling signal; the crawl's own, never a shard's
    runnable: int = 0
    #: 1 while the crawl's lifecycle says finished (lua/finish.lua); work seen since (a
    #: push, a commit) outranks it: see :meth:`state`
    finished: int = 0
    #: each shard's own sizes, by shard number, for a sharded crawl (empty with one shard)
    shards: tuple[FrontierSizes, ...] = ()

    def as_dict(self) -> dict[str, int]:
        """The sizes ``FrontierAdmin.sizes`` has always returned (the scheduler logs them)."""
        return {
            "queue": self.queue,
            "leased": self.leased,
            "delayed": self.delayed,
            "revisits": self.revisits,
            "seen": self.seen,
            "start_urls": self.start_urls,
            "dead": self.dead,
        }

    def state(self, paused: bool) -> str:
        """The crawl's lifecycle state: 'paused', 'finished' (decided by finish.lua, and
        nothing waiting since), or 'running'."""
        if paused:
            return "paused"
        waiting = self.queue or self.leased or self.delayed or self.start_urls
        return "finished" if self.finished and not waiting else "running"

    def with_shards(self, shards: Sequence[FrontierSizes]) -> FrontierSizes:
        """The crawl's total: its own keys' sizes plus its shards', which it keeps."""
        summed = {
            name: getattr(self, name) + sum(getattr(s, name) for s in shards) for name in _SUMMED
        }
        return dataclasses.replace(self, shards=tuple(shards), **summed)


def _same(reply: Any) -> Any:
    return reply


def _commands(k: FrontierKeys) -> dict[str, list[Op[Any]]]:
    """Each size -> the plain commands that count it in one keyset (all O(1))."""
    return {
        # due revisits wait in a queue of their own (lease.lua), queued all the same
        "queue": [
            Op("", [], ["ZCARD", k.queue], _same),
            Op("", [], ["ZCARD", k.revisit_queue], _same),
        ],
        "leased": [Op("", [], ["ZCARD", k.leases], _same)],
        "delayed": [Op("", [], ["ZCARD", k.delayed], _same)],
        "revisits": [Op("", [], ["ZCARD", k.revisits], _same)],
        # the seen-set counts the Bloom filter's URLs when there is one
        "seen": [Op("", [], ["SCARD", k.seen], _same), Op("", [], ["HGETALL", k.bloom], _same)],
        "start_urls": [Op("", [], ["LLEN", k.start_urls], _same)],
        "dead": [Op("", [], ["LLEN", k.dead], _same)],
        "queue_slots": [Op("", [], ["ZCARD", k.ready], _same)],
        "quarantined": [Op("", [], ["HGET", k.stats, "quarantined"], _same)],
        "runnable": [Op("", [], ["LLEN", k.runnable], _same)],
        "finished": [Op("", [], ["HGET", k.lifecycle, "state"], _same)],
    }


def size_commands(keys: FrontierKeys, fields: Sequence[str] = ALL_SIZES) -> list[Op[Any]]:
    """The plain-command Ops that read ``fields`` of one keyset, for a caller that sends
    them its own way (the worker monitor, in its beat's MULTI); :func:`sizes_from` reads
    their replies."""
    reads = _commands(keys)
    return [op for name in fields for op in reads[name]]


def size_replies(fields: Sequence[str] = ALL_SIZES) -> int:
    """How many replies :func:`size_commands` of ``fields`` gets."""
    return len(size_commands(FrontierKeys("n"), fields))


#: how many replies :func:`queue_size_reads` adds to a pipeline
SIZE_REPLIES = size_replies()


def queue_size_reads(pipe: Any, keys: FrontierKeys) -> None:
    """Queue the reads of one keyset's sizes on ``pipe`` (SIZE_REPLIES replies, which
    :func:`sizes_from` reads), so that a caller can send them with reads of its own."""
    for op in size_commands(keys):
        pipe.execute_command(*op.args)


def _bloom_count(reply: Any) -> int:
    if isinstance(reply, list):  # HGETALL's reply as sent in a MULTI: not made a dict
        reply = dict(zip(reply[::2], reply[1::2], strict=True))
    return BloomState.parse(reply).count


def sizes_from(
    replies: Sequence[Any], fields: Sequence[str] = ALL_SIZES, *, start_urls: bool = True
) -> FrontierSizes:
    """The sizes from the replies of :func:`size_commands` of ``fields`` (the others 0).
    ``start_urls=False`` for a shard's keys: their start URLs are the crawl's list."""
    values: dict[str, Any] = {}
    at = 0
    for name in fields:
        if name == "queue":
            values[name] = int(replies[at]) + int(replies[at + 1])
            at += 2
        elif name == "seen":
            values[name] = int(replies[at]) + _bloom_count(replies[at + 1])
            at += 2
        elif name == "finished":
            values[name] = int(replies[at] in (b"finished", "finished"))
            at += 1
        else:
            values[name] = int(replies[at] or 0)
            at += 1
    if not start_urls:
        values.pop("start_urls", None)
    return FrontierSizes(**values)


def recorded_count(raw: Any) -> int:
    """The shard count of a layout record's ``shards`` field (1: none, or not readable)."""
    try:
        count = int(raw) if raw is not None else 1
    except ValueError:
        return 1
    return count if 1 < count <= MAX_SHARDS else 1


def read_shard_sizes(client: redis.Redis, keys: FrontierKeys, count: int) -> list[FrontierSizes]:
    """Each of the ``count`` shards' sizes, in one pipeline (a cluster pipeline sends each
    shard's reads to the node holding it)."""
    sharded = keys.sharded(count)
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        queue_size_reads(pipe, sharded.of_shard(i))
    replies = pipe.execute()
    return [
        sizes_from(replies[at : at + SIZE_REPLIES], start_urls=False)
        for at in range(0, len(replies), SIZE_REPLIES)
    ]


def read_frontier_sizes(
    client: redis.Redis, keys: FrontierKeys, shards: int | None = None
) -> FrontierSizes:
    """The sizes of the crawl ``keys`` names, its shards' added up (and kept, in
    ``shards``): ``shards`` of them, else as many as its layout record names. Two pipelined
    round trips: the crawl's keys (and its layout record's shard count), then every shard's."""
    pipe = client.pipeline(transaction=False)
    queue_size_reads(pipe, keys)
    pipe.hget(keys.meta, "shards")
    replies = pipe.execute()
    crawl = sizes_from(replies)
    count = recorded_count(replies[SIZE_REPLIES]) if shards is None else shards
    if count == 1 or keys.shard is not None:
        return crawl
    return crawl.with_shards(read_shard_sizes(client, keys, count))
