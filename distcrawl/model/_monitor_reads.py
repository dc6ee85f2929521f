"""The worker monitor's reads of each part of the frontier (``WorkerMonitor``'s beat).

A crawl of one shard keeps its queue, leases, retries and revisits in the crawl's own keys;
with ``DISTCRAWL_SHARDS`` above 1 they are all in the shards' keys (each under its hash tag)
and none in the crawl's. So the monitor reads each part's and adds them up: per part the
reads of the sizes it publishes (:func:`part_sizes`), then the revisit gauges' reads
(``GAUGE_REPLIES``, see :func:`~distcrawl.model.revisits_admin.gauges_of`), then one TIME.
The crawl's own dead letters (``CRAWL_SIZES``) are read in the beat's MULTI, in the crawl's
slot on a cluster, and added to the shards' quarantines as ``distcrawl status`` adds them.
Every size is read by the one reader of sizes, distcrawl/model/sizes.py, so that it counts as
``status`` counts it. Every read is O(1) or O(log n): a beat costs O(shards) of them, however
big the crawl.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distcrawl.model.keys import FrontierKeys
from distcrawl.model.ops import Op
from distcrawl.model.revisits_admin import GAUGE_REPLIES
from distcrawl.model.sizes import FrontierSizes, size_commands, size_replies, sizes_from

#: the sizes the monitor publishes (distcrawl_queue, _leased, _delayed, _dead, _runnable)
MONITOR_SIZES = ("queue", "leased", "delayed", "dead", "runnable", "finished")
#: the sizes read in the crawl's own keys: its dead letters (crawl-wide, every shard's too)
#: the autoscaling signal (the reaper mirrors the whole crawl's there) and the lifecycle
CRAWL_SIZES = ("dead", "runnable", "finished")
#: replies of :func:`crawl_ops`
CRAWL_REPLIES = size_replies(CRAWL_SIZES)


def part_sizes(parts: int) -> tuple[str, ...]:
    """The sizes read in each of ``parts`` parts: the requests queued, leased and waiting
    for a retry; with shards also each shard's dead-letter quarantine (the one part of a
    crawl of one shard is the crawl's own keys, whose dead letters ``CRAWL_SIZES`` reads)."""
    return ("queue", "leased", "delayed") if parts == 1 else ("queue", "leased", "delayed", "dead")


def crawl_ops(keys: FrontierKeys) -> list[Op[Any]]:
    """The reads of ``CRAWL_SIZES`` in the crawl's own keys (``CRAWL_REPLIES`` replies)."""
    return size_commands(keys, CRAWL_SIZES)


def crawl_sizes(replies: Sequence[Any]) -> FrontierSizes:
    """The sizes :func:`crawl_ops` read (the others 0)."""
    return sizes_from(replies, CRAWL_SIZES)


def parts_of(keys: FrontierKeys, shards: int) -> list[FrontierKeys]:
    """The keys holding the crawl's requests: every shard's, or the crawl's own (1 shard)."""
    if shards == 1:
        return [keys]
    return keys.parts(shards)


def _same(reply: Any) -> Any:
    return reply


def part_ops(parts: Sequence[FrontierKeys], due_until: int | str) -> list[Op[Any]]:
    """The per-part reads, as plain-command Ops: the sizes of every part, then the revisit
    gauges' reads of every part, counting those due up to ``due_until``, then TIME."""
    ops: list[Op[Any]] = []
    for k in parts:
        ops += size_commands(k, part_sizes(len(parts)))
    for k in parts:
        ops += [
            Op("", [], ["ZCARD", k.revisits], _same),
            Op("", [], ["ZCARD", k.revisit_queue], _same),
            Op("", [], ["ZCOUNT", k.revisits, "-inf", due_until], _same),
            Op("", [], ["ZRANGE", k.revisits, 0, 0, "WITHSCORES"], _same),
        ]
    ops.append(Op("", [], ["TIME"], _same))
    return ops


def part_replies(parts: int) -> int:
    """How many replies :func:`part_ops` of ``parts`` parts gets."""
    return parts * (size_replies(part_sizes(parts)) + GAUGE_REPLIES) + 1


def split_replies(replies: Sequence[Any], parts: int) -> tuple[list[Any], list[Any]]:
    """The replies of :func:`part_ops`: those of the sizes, those of the revisit gauges."""
    count = parts * size_replies(part_sizes(parts))
    return list(replies[:count]), list(replies[count:])


def sizes_of(replies: Sequence[Any], parts: int, crawl: FrontierSizes) -> dict[str, int]:
    """The frontier sizes ``MONITOR_SIZES``: the parts' from their reads, added up, and the
    crawl's own (:func:`crawl_sizes`) added to them."""
    fields = part_sizes(parts)
    each = size_replies(fields)
    total = crawl.with_shards(
        [sizes_from(replies[i * each : (i + 1) * each], fields) for i in range(parts)]
    )
    return {name: getattr(total, name) for name in MONITOR_SIZES}
