"""``python -m benchmarks.idle_load``: many parked (idle) workers in one process, for counts of
workers that real Scrapy processes cannot reach on a small machine (200 of them need some 300
CPU-seconds to start on 2 CPUs).

A faithful load generator: each simulated worker runs the workers' own idle code, not a copy of
it: ``IdleWaits`` (its BLMOVE into the worker's claim list and its BLPOP on ``<ns>:wake``, on
threads and connections of their own), a ``Liveness`` in idle mode (plain ZADDs every third of
the worker timeout, alive.lua at start and once a minute), the batch runner's parked reaper
(``Runner.run(Batch(idle_reap=True))`` at the scheduler's pace, ``IDLE_REAP_INTERVAL`` times
0.5 to 1.5) and the monitor's parked heartbeat (``WorkerMonitor._ops(parts=False)``'s commands:
HSET of the heartbeat, EXISTS of the pause flag, the crawl's dead-letter size) every
``PARKED_BEAT_INTERVAL``, and the generation read a worker's runner adds to its parked
reaper's pipeline (here a round trip of its own). What it leaves out is what an idle worker
does not send: Scrapy itself. Then it pushes ``--pushes`` start URLs one at a time and reports
how long until one worker's BLMOVE had moved it into its claim list and handed it over (the
real worker then claims, commits and leases it: a few ms more, see ``benchmarks.idle``).

Measured from ``INFO`` as ``benchmarks.idle`` measures (``benchmarks/redisstats.py``).
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
import threading
import time
from pathlib import Path
from typing import Any

import redis

from benchmarks.redisstats import Snapshot, own_traffic, traffic
from distcrawl.codec.serialize import RequestCodec
from distcrawl.engine._batch_types import Batch
from distcrawl.engine.batch import Runner
from distcrawl.engine.idle import IDLE_REAP_INTERVAL, IdleWaits, claim_wait_for
from distcrawl.engine.liveness import Liveness
from distcrawl.extensions import PARKED_BEAT_INTERVAL
from distcrawl.model._monitor_reads import crawl_ops
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import new_tag
from distcrawl.testing.redis_server import RedisServer

NAMESPACE = "site"
WORKER_TIMEOUT = 10.0


class ParkedWorker:
    """One parked worker's Redis traffic, made by the workers' own code."""

    def __init__(self, url: str, keys: FrontierKeys, picked: list[tuple[float, bytes]]) -> None:
        self.tag = new_tag()
        self.keys = keys
        self.picked = picked
        self.client = redis.Redis.from_url(url)
        self.frontier = Frontier(self.client, keys, tag=self.tag)
        self.runner = Runner(
            self.frontier,
            RequestCodec(),
            lease_ms=30_000,
            worker_timeout_ms=int(WORKER_TIMEOUT * 1000),
        )
        self.liveness = Liveness(
            url,
            keys,
            self.tag,
            interval=1.0,
            socket_timeout=10.0,
            own_after=1.5,
            idle_interval=WORKER_TIMEOUT / 3,
        )
        self.waits = IdleWaits(
            url,
            keys,
            self.tag,
            socket_timeout=10.0,
            cluster=False,
            deliver=self._delivered,
            claim_wait=claim_wait_for(WORKER_TIMEOUT),
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _delivered(self, kind: str, value: Any) -> None:
        if kind == "claimed":
            self.picked.append((time.monotonic(), value))
            # the worker stores it (commit.lua takes it from the claim list): here it is
            # taken out as that commit would, and the worker parks again
            self.client.lrem(self.keys.claims(self.tag), -1, value)
        self.waits.park(claims=True)

    def start(self) -> None:
        self.liveness.beat()  # alive before the first wait, as a worker's open does
        self.liveness.idle(True)
        self.liveness.start()
        self.waits.park(claims=True)
        self._thread.start()

    def _loop(self) -> None:
        next_reap = time.monotonic() + IDLE_REAP_INTERVAL * (0.5 + random.random())
        next_beat = time.monotonic() + PARKED_BEAT_INTERVAL * random.random()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_reap:
                next_reap = now + IDLE_REAP_INTERVAL
                self.runner.run(Batch(idle_reap=True))
                # a worker's runner reads the crawl's generation in that pipeline (it has
                # joined a crawl, layout.py); here one round trip more
                self.client.hget(self.keys.meta, "generation")
            if now >= next_beat:
                next_beat = now + PARKED_BEAT_INTERVAL
                pipe = self.client.pipeline(transaction=False)
                pipe.hset(self.keys.workers, self.tag, json.dumps({"state": "running"}))
                pipe.exists(self.keys.paused)
                for op in crawl_ops(self.keys):
                    pipe.execute_command(*op.args)
                pipe.execute()
            self._stop.wait(max(0.05, min(next_reap, next_beat) - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self.waits.end_claims()
        self.waits.stop()
        self.liveness.stop(clean=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.idle_load", description=__doc__)
    p.add_argument("--workers", type=int, default=200)
    p.add_argument("--seconds", type=float, default=60.0, help="measuring window")
    p.add_argument("--settle", type=float, default=15.0, help="seconds parked before measuring")
    p.add_argument("--pushes", type=int, default=5)
    p.add_argument("--output", type=Path, default=None, help="JSON results")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="distcrawl-idle-load-"))
    server = RedisServer(directory=tmp / "redis").start()
    keys = FrontierKeys(NAMESPACE)
    picked: list[tuple[float, bytes]] = []
    pool: list[ParkedWorker] = []
    try:
        client = server.client()
        client.config_set("maxclients", "10000")
        for _ in range(args.workers):
            w = ParkedWorker(server.url, keys, picked)
            w.start()
            pool.append(w)
        time.sleep(args.settle)
        own = own_traffic(client, push=False)
        before = Snapshot.take(client)
        time.sleep(args.seconds)
        after = Snapshot.take(client)
        t = traffic(before, after, own)
        per = args.seconds * args.workers
        rng = random.Random(7)
        pickup = []
        for i in range(args.pushes):
            time.sleep(1.0 + rng.random() * 2)
            url = f"http://a.test/{i}".encode()
            t0 = time.monotonic()
            client.lpush(keys.start_urls, url)
            deadline = t0 + 10
            while time.monotonic() < deadline and not any(u == url for _, u in picked):
                time.sleep(0.001)
            at = next((at for at, u in picked if u == url), float("nan"))
            pickup.append(at - t0)
        result = {
            "workers": args.workers,
            "seconds": args.seconds,
            "generator": "benchmarks.idle_load (the workers' own idle code, one process)",
            "idle": {
                "commands_per_s_per_worker": t.commands / per,
                "round_trips_per_s_per_worker": t.reads / per,
                "scripts_per_s_per_worker": t.scripts / per,
                "calls_per_s_per_worker": {k: round(v / per, 4) for k, v in t.calls.items()},
                "redis_cpu_ms_per_s": 1000 * t.cpu / args.seconds,
                "redis_core_share": t.cpu / args.seconds,
                "connected_clients": int(client.info("clients")["connected_clients"]) - 1,
            },
            "pickup_claimed_s": pickup,
            "pickup_claimed_mean_s": statistics.mean(pickup) if pickup else None,
            "pickup_claimed_max_s": max(pickup) if pickup else None,
        }
    finally:
        for w in pool:
            w.stop()
        server.stop()
    i = result["idle"]
    print(f"{args.workers} parked workers (load generator), {args.seconds:.0f} s:")
    print(f"  commands/s per worker     {i['commands_per_s_per_worker']:8.3f}")
    print(f"  round trips/s per worker  {i['round_trips_per_s_per_worker']:8.3f}")
    print(f"  scripts/s per worker      {i['scripts_per_s_per_worker']:8.3f}")
    print(f"  Redis CPU ms/s (all)      {i['redis_cpu_ms_per_s']:8.2f}")
    print(f"  calls/s per worker        {i['calls_per_s_per_worker']}")
    print(f"  pickup (claimed) s        {[round(p, 4) for p in result['pickup_claimed_s']]}")
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
