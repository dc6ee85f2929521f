"""The autoscaling signal (lua/runnable.lua): requests the crawl could run now within its
politeness, mirrored as the length of ``<ns>:runnable`` for KEDA's stock Redis scaler, and
shown by ``distcrawl status`` and the workers' Prometheus gauge."""

from __future__ import annotations

import json
import re

import pytest

from distcrawl.cli import main
from distcrawl.model.frontier import RUNNABLE_MAX, RUNNABLE_SLOTS, Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import make_entry
from distcrawl.model.records import Politeness
from tests.support import wait_until

KEYS = FrontierKeys("t")


def fill(client, slots: int, per_slot: int) -> None:
    """``per_slot`` queued requests in each of ``slots`` slots, every slot due now: what a
    crawl's commits leave, written directly (100,000 entries in well under a second)."""
    pipe = client.pipeline(transaction=False)
    for s in range(slots):
        slot = f"d{s}.test"
        entries = {make_entry(slot, 0, s * per_slot + i, b"x"): 0 for i in range(per_slot)}
        for at in range(0, per_slot, 10_000):
            chunk = dict(list(entries.items())[at : at + 10_000])
            pipe.zadd(KEYS.queue, chunk)
        pipe.zadd(KEYS.ready, {slot: 0})
    pipe.execute()


def count(client, **politeness) -> int:
    frontier = Frontier(client, KEYS, Politeness(**politeness))
    return frontier.run(frontier.runnable_op()).requests


def test_one_domain_of_100000_urls_at_concurrency_4_runs_4(redis_client):
    fill(redis_client, 1, 100_000)
    assert count(redis_client, concurrency=4) == 4
    # the mirror KEDA reads: a LIST of that length
    assert redis_client.llen(KEYS.runnable) == 4


def test_50_domains_at_concurrency_4_run_200(redis_client):
    fill(redis_client, 50, 2_000)
    assert count(redis_client, concurrency=4) == 200
    assert redis_client.llen(KEYS.runnable) == 200


def test_in_flight_limits_and_overrides_are_taken_off(redis_client):
    fill(redis_client, 3, 10)
    redis_client.hset(KEYS.inflight, mapping={"d0.test": 3, "d1.test": 9})
    redis_client.hset(KEYS.limits, "d2.test", ":7")  # distcrawl limit: concurrency 7
    # d0: min(10, 4) - 3 = 1; d1: full (9 > 4): 0, never negative; d2: min(10, 7) = 7
    assert count(redis_client, concurrency=4) == 8
    # a slot with a 429/503 cap counts no more than the cap
    redis_client.hset(KEYS.throttle_state, "d2.test", "2:0.3:0")
    assert count(redis_client, concurrency=4) == 3
    # DOWNLOAD_SLOTS' concurrency for one slot (the settings' per-slot defaults)
    overrides = json.dumps({"d0.test": [-1, 10]})
    assert count(redis_client, concurrency=4, overrides=overrides) == 7 + 0 + 2


def test_slots_not_due_and_a_short_queue_count_what_they_hold(redis_client):
    fill(redis_client, 2, 2)
    redis_client.zadd(KEYS.ready, {"d1.test": 2**50})  # its next turn is far off
    assert count(redis_client, concurrency=4) == 2  # d0's 2 requests; d1 not due
    redis_client.lpush(KEYS.start_urls, "http://a.test/", "http://b.test/")
    assert count(redis_client, concurrency=4) == 4  # start URLs: one request each


def test_a_paused_crawl_runs_nothing_and_the_mirror_shrinks(redis_client):
    fill(redis_client, 10, 10)
    assert count(redis_client, concurrency=4) == 40
    redis_client.set(KEYS.paused, b"1")
    assert count(redis_client, concurrency=4) == 0
    assert redis_client.exists(KEYS.runnable) == 0
    redis_client.delete(KEYS.paused)
    redis_client.hset(KEYS.inflight, mapping={f"d{i}.test": 3 for i in range(10)})
    assert count(redis_client, concurrency=4) == 10
    assert redis_client.llen(KEYS.runnable) == 10  # trimmed, not pushed onto


def test_bounded_work_per_call(redis_client):
    """At most RUNNABLE_SLOTS due slots are looked at (the count is then a lower bound),
    and the count and the mirror are capped at RUNNABLE_MAX."""
    fill(redis_client, RUNNABLE_SLOTS + 5, 1)
    frontier = Frontier(redis_client, KEYS, Politeness(concurrency=4))
    found = frontier.run(frontier.runnable_op())
    assert (found.requests, found.looked, found.due) == (RUNNABLE_SLOTS, RUNNABLE_SLOTS, 1005)
    redis_client.lpush(KEYS.start_urls, *[b"http://x.test/"] * (RUNNABLE_MAX + 10))
    assert frontier.run(frontier.runnable_op()).requests == RUNNABLE_MAX
    assert redis_client.llen(KEYS.runnable) == RUNNABLE_MAX


def test_a_shard_counts_without_mirroring(redis_client):
    fill(redis_client, 2, 10)
    frontier = Frontier(redis_client, KEYS, Politeness(concurrency=4))
    assert frontier.run(frontier.runnable_op(mirror=False)).requests == 8
    assert redis_client.exists(KEYS.runnable) == 0
    # the crawl's keys add the shards' counts up and mirror the sum
    assert frontier.run(frontier.runnable_op(others=5)).requests == 13
    assert redis_client.llen(KEYS.runnable) == 13


@pytest.mark.parametrize("shards", [1, 2])
def test_workers_keep_the_signal_and_status_shows_it(
    shards, demo_site, workers, redis_client, redis_url, capsys
):
    """A real worker that downloads 1 request at a time on a host allowed 8: the reaper
    mirrors what the others could run, and ``distcrawl status --json`` reads it."""
    site = demo_site(pages=60, delay=0.5)
    settings = {
        "CONCURRENT_REQUESTS": 1,
        "DISTCRAWL_PREFETCH": 1,
        "DISTCRAWL_DOMAIN_CONCURRENCY": 8,
        "DISTCRAWL_SHARDS": shards,
        "DISTCRAWL_IDLE_TIMEOUT": 60,
    }
    workers(1, **settings)
    redis_client.lpush("site:start_urls", site.url + "/")
    crawl = FrontierKeys("site")
    assert wait_until(lambda: redis_client.llen(crawl.runnable) >= 5, timeout=30)
    capsys.readouterr()
    assert main(["--redis-url", redis_url, "--json", "status", "site"]) == 0
    assert 5 <= json.loads(capsys.readouterr().out)["runnable"] <= 8
    assert main(["--redis-url", redis_url, "status", "site"]) == 0
    assert re.search(r"runnable +[5-8] ", capsys.readouterr().out)
