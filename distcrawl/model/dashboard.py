"""What ``distcrawl status`` and ``distcrawl watch`` show: one snapshot of a crawl from Redis.

Everything comes from keys the workers maintain (heartbeats, crawl-wide counters, domains)
and from the frontier itself, read in one pipeline, so a snapshot is cheap enough to take
every second during a large crawl (no scan of the queue).
"""

from __future__ import annotations

import json
import shutil
import time
from collections import deque
from typing import Any

from distcrawl.model.connection import execute_timed
from distcrawl.model.frontier import Frontier
from distcrawl.model.sizes import (
    SIZE_REPLIES,
    queue_size_reads,
    read_shard_sizes,
    recorded_count,
    sizes_from,
)

#: a worker whose last liveness beat is older than this is reported as stale (dead or stuck);
#: the workers' own default timeout, after which they reap each other
STALE_AFTER = 10.0
SPARKS = "▁▂▃▄▅▆▇█"


def snapshot(frontier: Frontier, stale_after: float = STALE_AFTER) -> dict[str, Any]:
    """The crawl's state in two round trips: the sizes (distcrawl/model/sizes.py) with the
    workers, counters and domains, then the shards' sizes when the crawl has shards."""
    k = frontier.keys
    pipe = frontier.client.pipeline(transaction=False)
    queue_size_reads(pipe, k)
    pipe.hget(k.meta, "shards")
    pipe.exists(k.paused)
    pipe.hgetall(k.stats)
    pipe.hgetall(k.workers)
    pipe.zrevrange(k.domains, 0, 9, withscores=True)
    pipe.zrange(k.alive, 0, -1, withscores=True)
    replies = execute_timed(frontier.client, pipe, k.queue)
    sizes = sizes_from(replies)
    shards, paused, totals, workers, domains, alive, server_time = replies[SIZE_REPLIES:]
    now = server_time[0] + server_time[1] / 1e6
    count = recorded_count(shards)
    if count > 1 and k.shard is None:
        # a sharded crawl (DISTCRAWL_SHARDS): the shards hold the requests and their own
        # counters of quarantined entries; start URLs are the crawl's
        sizes = sizes.with_shards(read_shard_sizes(frontier.client, k, count))
    return {
        "namespace": k.namespace,
        "time": now,
        "queue": sizes.queue,
        "queue_slots": sizes.queue_slots,
        "leased": sizes.leased,
        "delayed": sizes.delayed,
        "revisits": sizes.revisits,
        "seen": sizes.seen,
        "start_urls": sizes.start_urls,
        "dead": sizes.dead,
        "paused": bool(paused),
        "totals": {key.decode(): int(value) for key, value in totals.items()},
        "quarantined": sizes.quarantined,
        "runnable": sizes.runnable,
        "state": sizes.state(bool(paused)),
        "workers": _workers(workers, _beats(alive), now, stale_after),
        "domains": [[d.decode(), int(n)] for d, n in domains],
    }


def _beats(alive: list[tuple[bytes, float]]) -> dict[str, float]:
    """Worker tag -> time of its last liveness beat, in server seconds."""
    return {tag.decode(): score / 1000 for tag, score in alive}


def _workers(
    raw: dict[bytes, bytes], beats: dict[str, float], now: float, stale_after: float
) -> list[dict[str, Any]]:
    """Each heartbeat with its status. The age is the server's TIME minus the worker's
    liveness beat (both the server's clock): the heartbeat's ``last_beat`` is the worker
    host's clock, and comparing it with this host's clock would report a live worker on a
    host running late as stale, or a dead one on a host running early as alive. A worker
    with no beat to go by (no tag: an older distcrawl; or its tag gone) has no age and is
    stale unless it says it exited."""
    out = []
    for wid, beat in raw.items():
        try:
            info = json.loads(beat)
        except ValueError:
            continue
        tag = info.get("tag")
        last = beats.get(tag) if isinstance(tag, str) else None
        age = None if last is None else max(0.0, now - last)
        closed = info.get("state") not in ("running", "paused", "draining")
        fresh = age is not None and age <= stale_after
        info.update(
            id=wid.decode(),
            age=None if age is None else round(age, 1),
            status="exited" if closed else ("alive" if fresh else "stale"),
        )
        out.append(info)
    return sorted(out, key=lambda w: (w["status"] != "alive", w["id"]))


def render_status(snap: dict[str, Any]) -> str:
    lines = [
        f"crawl {snap['namespace']!r}"
        + ("  (PAUSED)" if snap["paused"] else "")
        + ("  (FINISHED)" if snap.get("state") == "finished" else ""),
        f"  pending     {snap['queue']:>10}   (in {snap['queue_slots']} domains or slots; "
        "see distcrawl domains)",
        f"  in flight   {snap['leased']:>10}",
        f"  retrying    {snap['delayed']:>10}",
        f"  revisits    {snap.get('revisits', 0):>10}   (pages to fetch again, not due yet)",
        f"  dead        {snap['dead']:>10}",
        f"  quarantined {snap.get('quarantined', 0):>10}   (unparsable queue entries "
        "dead-lettered; see distcrawl doctor)",
        f"  seen        {snap['seen']:>10}",
        f"  start_urls  {snap['start_urls']:>10}",
        f"  runnable    {snap.get('runnable', 0):>10}   (requests it could run now within its "
        "politeness: the autoscaling signal)",
    ]
    totals = snap["totals"]
    lines.append("  totals      " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
    alive = sum(1 for w in snap["workers"] if w["status"] == "alive")
    lines.append(f"workers: {alive} alive of {len(snap['workers'])}")
    for w in snap["workers"]:
        age = f"{'-':>6}      " if w["age"] is None else f"{w['age']:>6.1f}s ago"
        lines.append(
            f"  {w['id']:<28} {w['status']:<7} {w.get('state', ''):<8} last beat "
            f"{age}  pages {w.get('pages', 0):>7}  "
            f"{w.get('pages_per_min', 0):>7.0f}/min  items {w.get('items', 0):>7}"
        )
    if snap["domains"]:
        lines.append("busiest domains:")
        lines += [f"  {n:>8}  {d}" for d, n in snap["domains"]]
    return "\n".join(lines)


def sparkline(values: list[float], width: int) -> str:
    values = values[-width:]
    if not values:
        return ""
    top = max(values) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1)))] for v in values)


class Watch:
    """Rates between successive snapshots, kept for the charts."""

    SERIES = ("pages", "items", "errors")

    def __init__(self, width: int = 60) -> None:
        self.width = width
        self.rates: dict[str, deque[float]] = {s: deque(maxlen=width) for s in self.SERIES}
        self.last: dict[str, Any] | None = None

    def add(self, snap: dict[str, Any]) -> None:
        if self.last is not None:
            elapsed = max(snap["time"] - self.last["time"], 1e-6)
            for s in self.SERIES:
                delta = snap["totals"].get(s, 0) - self.last["totals"].get(s, 0)
                self.rates[s].append(max(0.0, delta / elapsed))
        self.last = snap

    def render(self, snap: dict[str, Any]) -> str:
        width = min(self.width, max(10, shutil.get_terminal_size((100, 40)).columns - 30))
        charts = []
        for s in self.SERIES:
            series = list(self.rates[s])
            now = series[-1] if series else 0.0
            charts.append(f"{s + '/s':<9}{now:>8.1f}  {sparkline(series, width)}")
        stamp = time.strftime("%H:%M:%S", time.localtime(snap["time"]))
        return f"distcrawl watch  {stamp}\n" + "\n".join(charts) + "\n\n" + render_status(snap)
