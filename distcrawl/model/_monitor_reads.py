"""The worker monitor's reads of each part of the frontier (``WorkerMonitor``'s beat).

A crawl of one shard keeps its queue, leases, retries and revisits in the crawl's own keys;
with ``DISTCRAWL_SHARDS`` above 1 they are all in the shards' keys (each under its hash tag)
and none in the crawl's. So the monitor reads each part's and adds them up: per part the
reads of the sizes it publishes (``MONITOR_SIZES``, by the one reader of sizes,
distcrawl/model/sizes.py, so that they count as ``distcrawl status`` counts), then the revisit
gauges' reads (``GAUGE_REPLIES``, see :func:`~distcrawl.model.revisits_admin.gauges_of`), then
one TIME. Every read is O(1) or O(log n): a beat costs O(shards) of them, however big the
crawl.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distcrawl.model.keys import FrontierKeys
from distcrawl.model.ops import Op
from distcrawl.model.revisits_admin import GAUGE_REPLIES
from distcrawl.model.sizes import add_up, size_commands, size_replies, sizes_from

#: the sizes the monitor publishes (distcrawl_queue, _leased, _delayed)
MONITOR_SIZES = ("queue", "leased", "delayed")
#: replies per part of the sizes' reads
SIZE_REPLIES = size_replies(MONITOR_SIZES)


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
        ops += size_commands(k, MONITOR_SIZES)
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
    return parts * (SIZE_REPLIES + GAUGE_REPLIES) + 1


def split_replies(replies: Sequence[Any], parts: int) -> tuple[list[Any], list[Any]]:
    """The replies of :func:`part_ops`: those of the sizes, those of the revisit gauges."""
    count = parts * SIZE_REPLIES
    return list(replies[:count]), list(replies[count:])


def sizes_of(replies: Sequence[Any], parts: int) -> dict[str, int]:
    """The frontier sizes, all parts added up, from their reads (``SIZE_REPLIES`` each)."""
    total = add_up(
        [
            sizes_from(replies[i * SIZE_REPLIES : (i + 1) * SIZE_REPLIES], MONITOR_SIZES)
            for i in range(parts)
        ]
    )
    return {name: getattr(total, name) for name in MONITOR_SIZES}
