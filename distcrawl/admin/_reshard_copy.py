"""What ``distcrawl migrate --shards N`` copies whole into every new shard (reshard.py): the
Bloom filter's layers and the per-slot HASHes, which cannot be routed to one shard (a Bloom
bit or a slot's limit may stand for URLs of any shard), in bounded pieces."""

from __future__ import annotations

from typing import Any

import redis

from distcrawl.admin.migrate import text_of
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.seen import BloomState, part_keys

#: members or fields per call
BATCH = 1000
#: bytes of a Bloom part copied per GETRANGE/SETRANGE
BLOOM_CHUNK = 1 << 20


def copy_bloom(
    client: redis.Redis, j: int, s: FrontierKeys, targets: list[FrontierKeys], offset: int
) -> int:
    """Source ``s``'s Bloom layers into every target as layers ``offset``.. (a run again
    copies them again: the same bits); returns how many layers it had."""
    state = BloomState.parse(client.hgetall(s.bloom))
    if not state.layers:
        return 0
    fields = {text_of(k): text_of(v) for k, v in client.hgetall(s.bloom).items()}
    moved: dict[Any, Any] = {}
    for name, value in fields.items():
        layer, sep, what = name.partition(":")
        if sep and layer.isdigit():
            moved[f"{int(layer) + offset}:{what}"] = value
        elif name != "layers" and (j == 0 or name not in ("capacity", "error_rate")):
            moved[name] = value
    sources = part_keys(s, state)
    for t in targets:
        names = [
            t.bloom_part(i + offset, p) for i in range(state.layers) for p in range(state.parts[i])
        ]
        for src, dst in zip(sources, names, strict=True):
            copy_string(client, src, dst)
        client.hset(t.bloom, mapping={**moved, "layers": str(offset + state.layers)})
    return state.layers


def copy_string(client: redis.Redis, src: str, dst: str) -> None:
    """A STRING copied in BLOOM_CHUNK pieces: a Bloom part can be 512 MB, too much for one
    reply."""
    size = int(client.strlen(src))
    for at in range(0, size, BLOOM_CHUNK):
        chunk = client.getrange(src, at, min(size, at + BLOOM_CHUNK) - 1)
        client.setrange(dst, at, chunk)


def copy_per_slot(client: redis.Redis, src: str, dsts: list[str]) -> None:
    """A per-slot HASH copied into every target shard's, a page of fields at a time."""
    cursor = 0
    while True:
        fields: Any
        cursor, fields = client.hscan(src, cursor, count=BATCH)
        if src.endswith(":robots"):  # a negative Crawl-delay: a read under way, gone
            fields = {k: v for k, v in fields.items() if not v.startswith(b"-")}
        if fields:
            pipe = client.pipeline(transaction=False)
            for dst in dsts:
                pipe.hset(dst, mapping=fields)
            pipe.execute()
        if not cursor:
            return
