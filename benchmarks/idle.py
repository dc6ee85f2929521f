"""``python -m benchmarks.idle``: what idle workers cost Redis, and how fast they pick up work.

Starts ``--workers`` real ``scrapy crawl site`` workers against a fresh redis-server and
nothing to crawl, waits until every one has beaten in ``<ns>:alive`` and the settling
period is over, then measures over ``--seconds`` (counters of the server itself, see
``benchmarks/redisstats.py``):

- commands/s per worker: ``total_commands_processed`` (each ``redis.call`` inside a script
  counts too: server work), and the EVALSHA and plain commands the workers sent
  (``INFO commandstats``);
- round trips/s per worker: ``total_reads_processed`` (a pipeline arrives in one read);
- Redis CPU: ``used_cpu_user + used_cpu_sys`` per second, and bytes received per second.

Then it pushes ``--pushes`` URLs to ``<ns>:start_urls`` one at a time, at random moments, and
reports how long each waited until a worker took it from ``start_urls`` (stored as a
request) and until that request was leased.

``--code DIR`` runs the workers on another checkout of distcrawl (e.g. ``git archive main``
unpacked in a directory), for a before/after comparison on the same benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from benchmarks.redisstats import SCRIPT_COMMANDS, Snapshot, own_traffic, traffic
from distcrawl.demo.site import DemoSite
from distcrawl.model.keys import FrontierKeys
from distcrawl.testing.redis_server import RedisServer
from distcrawl.testing.workers import Worker

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "site"


class CodeWorker(Worker):
    """A worker run on the checkout in ``code`` (its own directory first on sys.path)."""

    def __init__(self, *args: Any, code: Path | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.code = code

    def start(self) -> Worker:
        if self.code is None:
            return super().start()
        import distcrawl.testing.workers as workers

        saved = workers.ROOT
        workers.ROOT = self.code  # cwd and PYTHONPATH of the child
        try:
            return super().start()
        finally:
            workers.ROOT = saved


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.idle", description=__doc__)
    p.add_argument("--workers", type=int, default=20)
    p.add_argument("--seconds", type=float, default=60.0, help="measuring window")
    p.add_argument(
        "--settle",
        type=float,
        default=10.0,
        help="seconds idle before measuring (past the idle spell's one look at the crawl)",
    )
    p.add_argument("--pushes", type=int, default=5, help="start URLs pushed one at a time")
    p.add_argument("--code", type=Path, default=None, help="distcrawl checkout for workers")
    p.add_argument("--output", type=Path, default=None, help="JSON results")
    p.add_argument("--shards", type=int, default=1, help="DISTCRAWL_SHARDS of the crawl")
    return p.parse_args(argv)


def wait_alive(client: redis.Redis, workers: list[Worker], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [w.index for w in workers if not w.alive()]
        if dead:
            raise SystemExit(f"workers {dead} exited; see their logs")
        if client.zcard(f"{NAMESPACE}:alive") >= len(workers):
            return
        time.sleep(0.2)
    raise SystemExit("workers did not all start in time")


def measure_idle(client: redis.Redis, workers: int, seconds: float) -> dict[str, Any]:
    own = own_traffic(client, push=False)
    before = Snapshot.take(client)
    time.sleep(seconds)
    after = Snapshot.take(client)
    t = traffic(before, after, own)
    sent = sum(v for k, v in t.calls.items() if "|" not in k and k not in ("info",))
    per = seconds * workers
    return {
        "commands_per_s_per_worker": t.commands / per,
        "round_trips_per_s_per_worker": t.reads / per,
        "scripts_per_s_per_worker": t.scripts / per,
        "calls_per_s_per_worker": {k: round(v / per, 3) for k, v in t.calls.items()},
        "redis_cpu_ms_per_s": 1000 * t.cpu / seconds,
        "net_in_bytes_per_s": t.net_in / seconds,
        "connected_clients": int(client.info("clients")["connected_clients"]) - 1,
        "commandstats_total_per_s_per_worker": sent / per,
        "script_commands": list(SCRIPT_COMMANDS),
    }


def measure_pickup(
    client: redis.Redis, site_url: str, pushes: int, shards: int = 1
) -> list[dict[str, float]]:
    """Seconds from the LPUSH until the entry left ``start_urls`` and until the request made
    from it left the queue (leased; every shard's queue), polled every 2 ms."""
    out = []
    rng = random.Random(7)
    crawl = FrontierKeys(NAMESPACE).sharded(shards)
    queues = [crawl.of_shard(i).queue for i in range(shards)]
    start_urls = crawl.start_urls
    for i in range(pushes):
        time.sleep(1.0 + rng.random() * 2)  # a random phase against the workers' polls
        t0 = time.monotonic()
        client.lpush(start_urls, f"{site_url}/missing-{i}")
        taken = leased = None
        while time.monotonic() - t0 < 30:
            pipe = client.pipeline(transaction=False)
            pipe.llen(start_urls)
            for queue in queues:
                pipe.zcard(queue)
            waiting, *sizes = pipe.execute()
            queued = sum(sizes)
            now = time.monotonic() - t0
            if taken is None and not waiting:
                taken = now
            if taken is not None and not queued:
                leased = now
                break
            time.sleep(0.002)
        out.append({"taken_s": taken or float("nan"), "leased_s": leased or float("nan")})
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not found")
    tmp = Path(tempfile.mkdtemp(prefix="distcrawl-idle-"))
    server = RedisServer(directory=tmp / "redis").start()
    site = DemoSite(pages=10, log_path=tmp / "site.log").start()
    workers: list[Worker] = []
    try:
        client = server.client()
        settings = {
            "LOG_LEVEL": "INFO",
            "DISTCRAWL_DOMAIN_CONCURRENCY": 64,
            "DISTCRAWL_SHARDS": args.shards,
        }
        for i in range(args.workers):
            w = CodeWorker(
                i,
                redis_url=server.url,
                log_path=tmp / f"worker-{i}.log",
                settings=settings,
                code=args.code.resolve() if args.code else None,
            )
            workers.append(w.start())
        started = time.monotonic()
        wait_alive(client, workers)
        time.sleep(args.settle)
        idle = measure_idle(client, args.workers, args.seconds)
        pickup = measure_pickup(client, site.url, args.pushes, args.shards)
        leased = [p["leased_s"] for p in pickup]
        result = {
            "workers": args.workers,
            "seconds": args.seconds,
            "code": str(args.code or ROOT),
            "startup_s": round(time.monotonic() - started - args.settle - args.seconds, 1),
            "idle": idle,
            "pickup": pickup,
            "pickup_leased_mean_s": statistics.mean(leased),
            "pickup_leased_max_s": max(leased),
        }
    finally:
        for w in workers:
            w.stop(timeout=10)
        site.stop()
        server.stop()
    i = result["idle"]
    print(f"{args.workers} idle workers on {result['code']}, {args.seconds:.0f} s:")
    print(f"  commands/s per worker     {i['commands_per_s_per_worker']:8.2f}")
    print(f"  round trips/s per worker  {i['round_trips_per_s_per_worker']:8.2f}")
    print(f"  scripts/s per worker      {i['scripts_per_s_per_worker']:8.2f}")
    print(f"  Redis CPU ms/s (all)      {i['redis_cpu_ms_per_s']:8.2f}")
    print(f"  bytes in/s (all)          {i['net_in_bytes_per_s']:8.0f}")
    print(f"  calls/s per worker        {i['calls_per_s_per_worker']}")
    mean, most = result["pickup_leased_mean_s"], result["pickup_leased_max_s"]
    each = [round(p["leased_s"], 3) for p in pickup]
    print(f"  pickup (leased) s         mean {mean:.3f} max {most:.3f}  {each}")
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
