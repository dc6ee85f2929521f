"""What each console view reads from Redis, as plain (blocking) functions.

Each runs on the console's thread pool (distcrawl/web/app.py), never on the event loop, and
reads through the readers the command line uses: the dashboard's :func:`snapshot` (the one
status reader, itself built on distcrawl/model/sizes.py), ``FrontierAdmin.states_of`` for
the politeness state of the domains shown, the dead-letter list by LRANGE pages and the
history rollups by one HMGET. Every read is O(page size): nothing scans the queue, the
seen-set or the whole dead-letter list.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import redis

from distcrawl.model.dashboard import snapshot
from distcrawl.model.frontier import Frontier
from distcrawl.model.frontier_admin import FrontierAdmin
from distcrawl.model.history import RESOLUTIONS, read_history
from distcrawl.model.keys import FrontierKeys

#: dead letters and domains shown per page
PAGE_SIZE = 50
#: seconds of snapshots the rates are taken over
RATE_WINDOW = 10.0
#: the rates shown: counter of ``<ns>:stats`` -> name on the page
RATES = {"pages": "pages_per_s", "items": "items_per_s", "errors": "errors_per_s"}


@dataclass
class Rates:
    """Pages/s and items/s between the snapshots of the last :data:`RATE_WINDOW` seconds,
    kept per crawl by the console (every page and poll adds its snapshot), so that any
    number of open browsers share one series and a first look has a rate at its second
    poll."""

    samples: deque[tuple[float, dict[str, int]]] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, now: float, totals: dict[str, int]) -> dict[str, float]:
        with self.lock:
            if not self.samples or now > self.samples[-1][0]:
                self.samples.append((now, dict(totals)))
            while len(self.samples) > 2 and self.samples[0][0] < now - RATE_WINDOW:
                self.samples.popleft()
            first_t, first = self.samples[0]
            last_t, last = self.samples[-1]
        elapsed = last_t - first_t
        if elapsed <= 0:
            return dict.fromkeys(RATES.values(), 0.0)
        return {
            shown: round(max(0, last.get(name, 0) - first.get(name, 0)) / elapsed, 2)
            for name, shown in RATES.items()
        }


def lifecycle(snap: dict[str, Any]) -> str:
    """The crawl's state as ``status`` tells it (paused, finished or running: decided in Redis,
    FrontierSizes.state), refined by what the live workers' beats say: draining while one
    drains, idle when none is alive and the crawl is not finished."""
    alive = [w for w in snap["workers"] if w["status"] == "alive"]
    if any(w.get("state") == "draining" for w in alive):
        return "draining"
    state = snap.get("state", "paused" if snap["paused"] else "running")
    if state in ("paused", "finished"):
        return str(state)
    return "running" if alive else "idle"


def overview(frontier: Frontier, rates: Rates) -> dict[str, Any]:
    """The crawl page's data: the status snapshot (sizes, workers, totals, busiest domains),
    its lifecycle and the rates; what ``/api/<ns>/status`` returns and the page shows.
    ``frontier`` is made once per crawl by the console: making one loads its scripts."""
    snap = snapshot(frontier)
    snap["state"] = lifecycle(snap)
    snap["rates"] = rates.add(snap["time"], snap["totals"])
    for worker in snap["workers"]:
        worker["pages_per_s"] = round(float(worker.get("pages_per_min") or 0) / 60, 2)
    return snap


def domains(client: redis.Redis, keys: FrontierKeys, page: int) -> dict[str, Any]:
    """One page of the busiest domains (by pages fetched, ``<ns>:domains``) with what the
    frontier holds of their politeness: queued, in flight, next turn, adaptive delay and
    cap, robots.txt Crawl-delay and ``distcrawl limit`` override. O(page): a ZREVRANGE of
    the page, then seven reads per domain in one pipeline."""
    start = page * PAGE_SIZE
    pipe = client.pipeline(transaction=False)
    pipe.zrevrange(keys.domains, start, start + PAGE_SIZE - 1, withscores=True)
    pipe.zcard(keys.domains)
    ranked, total = pipe.execute()
    names = [name.decode(errors="backslashreplace") for name, _ in ranked]
    states = {s["slot"]: s for s in FrontierAdmin(client, keys).states_of(names)}
    rows = []
    for name, pages in ranked:
        slot = name.decode(errors="backslashreplace")
        row: dict[str, Any] = {"domain": slot, "pages": int(pages), **states.get(slot, {})}
        # a `distcrawl limit` override is "<delay ms>:<concurrency>", either part empty
        delay, _, concurrency = (row.get("override") or ":").partition(":")
        row["limit_delay"] = int(delay) / 1000 if delay.isdigit() else None
        row["limit_concurrency"] = int(concurrency) if concurrency.isdigit() else None
        rows.append(row)
    return {"rows": rows, "page": page, "total": int(total), "page_size": PAGE_SIZE}


def dead_page(client: redis.Redis, keys: FrontierKeys, page: int) -> dict[str, Any]:
    """One page of dead letters, newest first: one LRANGE of the page and LLEN."""
    start = page * PAGE_SIZE
    pipe = client.pipeline(transaction=False)
    pipe.lrange(keys.dead, start, start + PAGE_SIZE - 1)
    pipe.llen(keys.dead)
    raws, total = pipe.execute()
    rows = []
    for raw in raws:
        try:
            record = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if not isinstance(record, dict):
            record = {"reason": "unreadable record", "raw": raw.decode(errors="replace")[:200]}
        rows.append(
            {
                "time": record.get("time"),
                "source": str(record.get("source") or "-"),
                "reason": str(record.get("reason") or "-")[:500],
                "url": str(record.get("url") or record.get("raw") or "-")[:500],
                "worker": str(record.get("worker") or "-"),
            }
        )
    return {"rows": rows, "page": page, "total": int(total), "page_size": PAGE_SIZE}


def history(client: redis.Redis, keys: FrontierKeys, span: str) -> dict[str, Any]:
    """The rollups of ``span`` (hour or day) up to the server's time now."""
    if span not in RESOLUTIONS:
        raise ValueError(span)
    seconds, micros = client.time()
    return read_history(client, keys, span, seconds + micros / 1e6)
