"""The one reader of the frontier's sizes (distcrawl/model/sizes.py): what status, watch, the
producer, the monitor and Prometheus show, counted by one rule."""

from __future__ import annotations

import dataclasses

import pytest

from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import make_entry
from distcrawl.model.records import Entry, EntryKind
from distcrawl.model.sizes import (
    ALL_SIZES,
    SIZE_REPLIES,
    FrontierSizes,
    read_frontier_sizes,
    size_commands,
    sizes_from,
)


def _fill(client, keys: FrontierKeys, n: int) -> None:
    """n requests (n slots), one leased, one retry waiting, one dead letter, one due revisit
    waiting in the revisit queue, one quarantined count."""
    frontier = Frontier(client, keys)
    entries = [Entry(EntryKind.REQUEST, b"fp%d" % i, 0, b"p", b"", f"h{i}.test") for i in range(n)]
    entries.append(Entry(EntryKind.RETRY, b"rt", 0, b"p", b"3600000", "r.test"))
    frontier.commit([], entries)
    assert len(frontier.lease(1, 600_000).items) == 1
    client.rpush(keys.dead, b"{}")
    client.zadd(keys.revisit_queue, {make_entry("v.test", 0, 9, b"p"): 0})
    client.hset(keys.stats, "quarantined", 2)


def test_one_crawl_by_every_rule(redis_client):
    keys = FrontierKeys("site")
    _fill(redis_client, keys, 3)
    redis_client.rpush(keys.start_urls, b"http://a.test/", b"http://b.test/")
    sizes = read_frontier_sizes(redis_client, keys)
    assert sizes == FrontierSizes(
        queue=2 + 1,  # the due revisit is queued too
        leased=1,
        delayed=1,
        revisits=0,
        seen=3,  # the requests: a retry is seen already
        start_urls=2,
        dead=1,
        queue_slots=2,
        quarantined=2,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        sizes.queue = 0  # type: ignore[misc]
    assert Frontier(redis_client, keys).admin.sizes() == sizes.as_dict()


def test_a_sharded_crawl_adds_up_its_shards_and_keeps_each(redis_client):
    crawl = FrontierKeys("site")
    redis_client.hset(crawl.meta, "shards", 3)
    sharded = crawl.sharded(3)
    for i in range(3):
        _fill(redis_client, sharded.of_shard(i), i + 2)
    redis_client.rpush(crawl.start_urls, b"http://a.test/")
    sizes = read_frontier_sizes(redis_client, crawl)
    assert len(sizes.shards) == 3
    assert [s.queue for s in sizes.shards] == [2, 3, 4]
    assert sizes.queue == 9 and sizes.leased == 3 and sizes.dead == 3
    assert sizes.quarantined == 6 and sizes.queue_slots == 6
    assert sizes.start_urls == 1  # the crawl's list, not counted once per shard
    assert all(s.start_urls == 0 for s in sizes.shards)
    assert read_frontier_sizes(redis_client, crawl, shards=1).queue == 0  # the crawl's own


def test_any_subset_of_sizes_reads_only_its_commands(redis_client):
    keys = FrontierKeys("site")
    _fill(redis_client, keys, 2)
    assert len(size_commands(keys)) == SIZE_REPLIES
    for fields in (("queue", "leased", "delayed"), ("seen",), ALL_SIZES):
        pipe = redis_client.pipeline(transaction=False)
        for op in size_commands(keys, fields):
            pipe.execute_command(*op.args)
        got = sizes_from(pipe.execute(), fields)
        whole = read_frontier_sizes(redis_client, keys)
        assert {f: getattr(got, f) for f in fields} == {f: getattr(whole, f) for f in fields}
