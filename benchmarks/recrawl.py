"""``python -m benchmarks.recrawl``: how fresh the adaptive revisit schedule keeps a crawl,
against a fixed interval spending the same number of fetches (a simulation, no HTTP).

Each page changes as a Poisson process at a rate drawn from a mix like those measured on the
web (Cho and Garcia-Molina, "The evolution of the Web", 2000: about a quarter of pages change
within a day, a third are unchanged after four months): 20% of pages change every 2 hours on
average, 30% daily, 30% weekly and 20% never. Over ``--days`` days, the adaptive schedule
(distcrawl/config/recrawl.py, Nutch's defaults but a 10-minute floor) fetches each page when it is
due and sees a change if the page changed since its last fetch; the fixed schedule fetches every
page at one interval, chosen so that it makes as many fetches in all. A change counts as
detected within T when the first fetch after it comes no later than T after it: the share of
changes detected within T, and those detected per 1,000 fetches, are the freshness figures.
Politeness and fetch failures are left out: both schedules would pay them alike.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import random
import sys
from pathlib import Path
from typing import Any

from distcrawl.config.recrawl import DAY, Outcome, RecrawlPolicy, first_fetch, revisit

HOUR = 3600.0
#: (share of pages, mean seconds between changes; None: never changes)
MIX: tuple[tuple[float, float | None], ...] = (
    (0.2, 2 * HOUR),
    (0.3, DAY),
    (0.3, 7 * DAY),
    (0.2, None),
)
WITHIN = (HOUR, 6 * HOUR, DAY)
RESULTS = Path(__file__).resolve().parent / "results"


def change_times(rng: random.Random, mean: float | None, horizon: float) -> list[float]:
    if mean is None:
        return []
    out, t = [], rng.expovariate(1 / mean)
    while t < horizon:
        out.append(t)
        t += rng.expovariate(1 / mean)
    return out


def adaptive_fetches(
    changes: list[list[float]], policy: RecrawlPolicy, horizon: float, rng: random.Random
) -> list[list[float]]:
    """Each page's fetch times under the adaptive schedule; first fetches spread over the
    first interval, as a crawl discovers its pages."""
    fetches: list[list[float]] = [[] for _ in changes]
    heap: list[tuple[float, int]] = []
    states = {}
    for page in range(len(changes)):
        start = rng.uniform(0, policy.interval)
        states[page] = first_fetch(policy, start)
        fetches[page].append(start)
        heapq.heappush(heap, (states[page].due, page))
    while heap:
        now, page = heapq.heappop(heap)
        if now >= horizon:
            continue
        last = fetches[page][-1]
        # a change since the last fetch: its content signature differs now
        at = bisect.bisect_right(changes[page], last)
        changed = at < len(changes[page]) and changes[page][at] <= now
        states[page] = revisit(
            policy, states[page], Outcome.CHANGED if changed else Outcome.UNCHANGED, now
        )
        fetches[page].append(now)
        heapq.heappush(heap, (states[page].due, page))
    return fetches


def fixed_fetches(
    pages: int, interval: float, horizon: float, rng: random.Random
) -> list[list[float]]:
    out = []
    for _ in range(pages):
        t, times = rng.uniform(0, interval), []
        while t < horizon:
            times.append(t)
            t += interval
        out.append(times)
    return out


def freshness(changes: list[list[float]], fetches: list[list[float]]) -> dict[str, Any]:
    total = sum(len(f) for f in fetches)
    counted = 0
    within = dict.fromkeys(WITHIN, 0)
    for times, seen in zip(changes, fetches, strict=True):
        for c in times:
            at = bisect.bisect_left(seen, c)
            if at == len(seen):
                continue  # no fetch after it before the end: neither schedule is judged on it
            counted += 1
            for limit in WITHIN:
                if seen[at] - c <= limit:
                    within[limit] += 1
    return {
        "fetches": total,
        "changes": counted,
        **{
            f"within_{int(limit // HOUR)}h": {
                "share": within[limit] / counted if counted else 0.0,
                "per_1000_fetches": 1000 * within[limit] / total if total else 0.0,
            }
            for limit in WITHIN
        },
    }


def run(pages: int, days: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    horizon = days * DAY
    means = [m for share, m in MIX for _ in range(round(share * pages))]
    changes = [change_times(rng, m, horizon) for m in means]
    policy = RecrawlPolicy(interval=DAY, min_interval=600.0, max_interval=365 * DAY)
    adaptive = adaptive_fetches(changes, policy, horizon, rng)
    budget = sum(len(f) for f in adaptive)
    interval = len(changes) * horizon / budget
    fixed = fixed_fetches(len(changes), interval, horizon, rng)
    return {
        "pages": len(changes),
        "days": days,
        "fixed_interval_h": interval / HOUR,
        "adaptive": freshness(changes, adaptive),
        "fixed": freshness(changes, fixed),
    }


def table(result: dict[str, Any]) -> str:
    head = "| schedule | fetches | changes | " + " | ".join(
        f"detected within {int(t // HOUR)} h (share, per 1,000 fetches)" for t in WITHIN
    )
    lines = [head + " |", "|" + "---|" * (3 + len(WITHIN))]
    for name in ("adaptive", "fixed"):
        row = result[name]
        label = name if name == "adaptive" else f"fixed, every {result['fixed_interval_h']:.1f} h"
        cells = [
            f"{row[k]['share']:.1%}, {row[k]['per_1000_fetches']:.0f}"
            for k in (f"within_{int(t // HOUR)}h" for t in WITHIN)
        ]
        lines.append(
            f"| {label} | {row['fetches']:,} | {row['changes']:,} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def revisit_storage(count: int, workdir: Path) -> dict[str, Any]:
    """Redis memory a page costs while revisits are on: its revisit (the request record with
    its state: interval, ETag, Last-Modified, signature), its member in ``revisits`` and its
    ``revisit_of`` entry, stored through ``Frontier.commit`` as a worker stores them."""
    from scrapy.utils.request import RequestFingerprinter

    from benchmarks.storage import BATCH, SLOT, key_bytes, sample_requests, used_memory
    from distcrawl.codec.serialize import RequestCodec
    from distcrawl.dupefilter import FINGERPRINT_BYTES
    from distcrawl.model.frontier import Frontier
    from distcrawl.model.keys import FrontierKeys
    from distcrawl.model.records import Entry, EntryKind
    from distcrawl.revisit import STATE_META, RevisitState
    from distcrawl.spiders.site import SiteSpider
    from distcrawl.testing.redis_server import RedisServer

    workdir.mkdir(parents=True, exist_ok=True)
    with RedisServer(directory=workdir) as server:
        client = server.client()
        keys = FrontierKeys("bench-revisits")
        frontier = Frontier(client, keys)
        spider = SiteSpider()
        codec, fingerprinter = RequestCodec("msgpack", spider), RequestFingerprinter()
        before = used_memory(client)
        batch: list[Entry] = []
        for n, request in enumerate(sample_requests(spider, count)):
            state = RevisitState(
                request.url,
                DAY * (1 + n % 7),
                etag=f'"{n:016x}"',
                last_modified="Tue, 01 Dec 2026 10:00:00 GMT",
                signature=f"{n:032x}",
            )
            request.meta[STATE_META] = state.to_meta()
            fp = fingerprinter.fingerprint(request)[:FINGERPRINT_BYTES]
            batch.append(Entry(EntryKind.REVISIT, fp, 0, codec.encode(request), b"86400000", SLOT))
            if len(batch) >= BATCH:
                frontier.commit([], batch)
                batch = []
        if batch:
            frontier.commit([], batch)
        sizes = {k: key_bytes(client, k) for k in (keys.requests, keys.revisits, keys.revisit_of)}
        result = {
            "pages": count,
            "keys": sizes,
            "bytes_per_page": sum(sizes.values()) / count,
            "used_memory_bytes_per_page": (used_memory(client) - before) / count,
        }
        client.close()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.recrawl", description=__doc__)
    p.add_argument("--pages", type=int, default=2000)
    p.add_argument("--days", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", type=Path, default=RESULTS / "recrawl.json")
    p.add_argument(
        "--storage",
        type=int,
        default=0,
        metavar="PAGES",
        help="also measure the Redis memory of PAGES pages' revisits (a redis-server is started)",
    )
    args = p.parse_args(argv)
    result = run(args.pages, args.days, args.seed)
    print(table(result))
    if args.storage:
        result["storage"] = revisit_storage(args.storage, RESULTS / "recrawl-redis")
        print(
            f"\nRedis memory per page with revisits on: "
            f"{result['storage']['bytes_per_page']:.1f} B in its keys, "
            f"{result['storage']['used_memory_bytes_per_page']:.1f} B of used_memory "
            f"({args.storage:,} pages)"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nJSON: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
