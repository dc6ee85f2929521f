"""``python -m benchmarks.frontier_load``: what one Redis serves, with no HTTP in the way.

Crawls measure the crawler; sizing a cluster needs the frontier alone: how many pages per
second one Redis node can lease and acknowledge, what each page costs it in CPU, and what a
domain the crawl has finished still costs in memory. Several worker processes run the
frontier's own calls at full speed against a fresh ``redis-server``: lease a batch, make
``--links`` children per page (links into a finite space of pages per host, so duplicates
grow as in a real crawl), and commit the children with the acknowledgements, exactly as the
scheduler does (``Frontier.lease`` and ``Frontier.commit``, msgpack payloads, 12-byte
fingerprints). Redis CPU is ``INFO`` ``used_cpu_user + used_cpu_sys``; with the load
generators on the same machine the node is not saturated unless its CPU nears one core, so
the number to size with is Redis CPU per page, not pages per second.

After the timed run the queue is drained to nothing and the per-slot state left behind is
measured (``MEMORY USAGE`` of every per-slot HASH and ZSET, per host): the memory a finished
domain keeps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import random
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import redis

from distcrawl.demo.redis_server import RedisServer
from distcrawl.frontier import Entry, EntryKind, Frontier, Politeness
from distcrawl.keys import FrontierKeys

RESULTS = Path(__file__).resolve().parent / "results"
NAMESPACE = "load"
LEASE_MS = 60_000
#: per-slot state: every HASH or ZSET keyed by slot
SLOT_KEYS = (
    "ready",
    "slots",
    "inflight",
    "throttle",
    "throttle_raised",
    "throttle_state",
    "hungry",
    "robots",
    "domains",
)


def url_entry(host: int, page: int) -> Entry:
    url = f"http://h{host}.test/p/{page}"
    fingerprint = hashlib.sha1(url.encode()).digest()[:12]
    payload = msgpack.packb({"u": url}, use_bin_type=True)
    return Entry(EntryKind.REQUEST, fingerprint, 0, payload, b"", f"h{host}.test")


def worker(
    url: str,
    seconds: float,
    hosts: int,
    pages: int,
    links: int,
    batch: int,
    delay_ms: int,
    seed: int,
    out: Any,
) -> None:
    """One load process: lease, make children, commit with the acknowledgements."""
    client = redis.Redis.from_url(url)
    politeness = Politeness(concurrency=8, delay_ms=delay_ms)
    frontier = Frontier(client, FrontierKeys(NAMESPACE), politeness)
    rng = random.Random(seed)
    done = leases = commits = empty = 0
    start = time.perf_counter()
    cpu0 = time.process_time()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = frontier.lease(batch, LEASE_MS).items
        leases += 1
        if not got:
            empty += 1
            time.sleep(0.002)
            continue
        children = []
        for item in got:
            host = int(item.slot[1:].split(".")[0])
            for _ in range(links):
                # mostly links within the host, some to others, as on real sites
                to = host if rng.random() < 0.8 else rng.randrange(hosts)
                children.append(url_entry(to, rng.randrange(pages)))
        frontier.commit([item.ref for item in got], children)
        commits += 1
        done += len(got)
    out.put(
        {
            "pages": done,
            "leases": leases,
            "empty_leases": empty,
            "commits": commits,
            "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu0,
        }
    )
    client.close()


def drain(client: redis.Redis, keys: FrontierKeys) -> int:
    """Acknowledge everything left without adding children, so that every slot finishes."""
    frontier = Frontier(client, keys, Politeness(concurrency=1_000_000))
    acked = 0
    for _ in range(1_000_000):
        got = frontier.lease(1000, LEASE_MS).items
        if not got:
            if client.zcard(keys.queue) == 0 and client.zcard(keys.delayed) == 0:
                return acked
            time.sleep(0.01)
            continue
        frontier.commit([item.ref for item in got], [])
        acked += len(got)
    return acked


def cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    with RedisServer() as server:
        client = server.client()
        keys = FrontierKeys(NAMESPACE)
        seed = Frontier(client, keys)
        for at in range(0, args.hosts, 1000):
            seed.commit([], [url_entry(h, 0) for h in range(at, min(args.hosts, at + 1000))])
        cpu0, commands0 = cpu(client), int(client.info("stats")["total_commands_processed"])
        out: Any = multiprocessing.Queue()
        procs = [
            multiprocessing.Process(
                target=worker,
                args=(
                    server.url,
                    args.seconds,
                    args.hosts,
                    args.pages,
                    args.links,
                    args.batch,
                    args.delay_ms,
                    i,
                    out,
                ),
            )
            for i in range(args.processes)
        ]
        for p in procs:
            p.start()
        reports = [out.get(timeout=args.seconds + 60) for _ in procs]
        for p in procs:
            p.join(30)
        redis_cpu = cpu(client) - cpu0
        commands = int(client.info("stats")["total_commands_processed"]) - commands0
        pages = sum(r["pages"] for r in reports)
        seconds = max(r["seconds"] for r in reports)
        memory_running = int(client.info("memory")["used_memory"])
        seen = int(client.scard(keys.seen))
        queued = int(client.zcard(keys.queue))
        drained = drain(client, keys)
        kept = _slot_state(client, keys)
        # what the workers' reclaims do a minute after a host's last request (sweep.lua)
        sweeper = Frontier(client, keys)
        sweeps = 0
        while sweeps < 100_000:
            sweeps += 1
            if sweeper.sweep_slots(grace_ms=0, count=100).wrapped:
                break
        slot_bytes = {
            name: int(client.memory_usage(getattr(keys, name), samples=0) or 0)
            for name in SLOT_KEYS
        }
        slots_left = {name: _entries(client, getattr(keys, name)) for name in SLOT_KEYS}
        client.close()
    per_domain = sum(slot_bytes.values()) / args.hosts
    return {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "pages": pages,
        "pages_per_s": pages / seconds,
        "redis_cpu_cores": redis_cpu / seconds,
        "redis_cpu_us_per_page": 1e6 * redis_cpu / max(pages, 1),
        "commands_per_page": commands / max(pages, 1),
        "load_cpu_ms_per_page": 1000 * sum(r["cpu_seconds"] for r in reports) / max(pages, 1),
        "empty_leases": sum(r["empty_leases"] for r in reports),
        "seen_urls": seen,
        "queued_at_end": queued,
        "used_memory_at_end": memory_running,
        "drained": drained,
        "finished_domain_bytes_before_sweep": kept / args.hosts,
        "sweep_calls": sweeps,
        "finished_domain_bytes": per_domain,
        "finished_domain_bytes_by_key": {k: v / args.hosts for k, v in slot_bytes.items()},
        "finished_domain_entries": slots_left,
    }


def _slot_state(client: redis.Redis, keys: FrontierKeys) -> int:
    return sum(int(client.memory_usage(getattr(keys, n), samples=0) or 0) for n in SLOT_KEYS)


def _entries(client: redis.Redis, key: str) -> int:
    kind = client.type(key)
    if kind == b"hash":
        return int(client.hlen(key))
    if kind == b"zset":
        return int(client.zcard(key))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.frontier_load", description=__doc__)
    p.add_argument("--processes", type=int, default=4, help="load processes (workers)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--hosts", type=int, default=2000)
    p.add_argument("--pages", type=int, default=2000, help="page space per host")
    p.add_argument("--links", type=int, default=17, help="children per page")
    p.add_argument("--batch", type=int, default=32, help="leased per call, as DISTCRAWL_PREFETCH")
    p.add_argument("--delay-ms", type=int, default=0, help="DOWNLOAD_DELAY of every host (ms)")
    p.add_argument("--output", type=Path, default=RESULTS / "frontier_load.json")
    args = p.parse_args(argv)
    result = run(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{result['pages']} pages in {args.seconds:g}s by {args.processes} processes: "
        f"{result['pages_per_s']:.0f} pages/s; Redis {result['redis_cpu_cores']:.2f} cores, "
        f"{result['redis_cpu_us_per_page']:.0f} us/page, "
        f"{result['commands_per_page']:.2f} commands/page; "
        f"load {result['load_cpu_ms_per_page']:.2f} CPU ms/page"
    )
    print(
        f"seen {result['seen_urls']}, queued at the end {result['queued_at_end']}, "
        f"used memory {result['used_memory_at_end'] / 2**20:.1f} MiB"
    )
    print(
        f"a finished domain keeps {result['finished_domain_bytes_before_sweep']:.0f} bytes, "
        f"{result['finished_domain_bytes']:.0f} once swept "
        f"({result['finished_domain_entries']} entries left of {args.hosts} hosts)"
    )
    print(f"JSON: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
