"""``python -m benchmarks.migrate``: how long ``distcrawl migrate`` takes, and how long it holds
each server, for a frontier of a given size moved from one redis-server to a 3-master cluster.

The frontier is synthetic (no crawl): ``--seen`` 16-byte fingerprints, ``--queue`` queued
requests with their records, ``--robots`` robots.txt keys with a TTL, paused. Three runs:
the move, the same command again (a verified move: nothing to do) and ``--delete-source``.
Each server's SLOWLOG (commands over 5 ms) says how long one DUMP or RESTORE held it: what
other crawls on the same servers would feel. Servers are started here on 127.0.0.1 and stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from distcrawl.cli import main as distcrawl
from distcrawl.model.keys import FrontierKeys
from distcrawl.testing.redis_server import RedisServer
from tests.cluster import RedisClusterNodes

SLOW_US = 5000


def fill(client: redis.Redis, seen: int, queue: int, robots: int) -> None:
    k = FrontierKeys("site")
    pipe = client.pipeline(transaction=False)
    pipe.hset(k.meta, mapping={"format": 1, "shards": 1, "seen": "set"})
    for at in range(0, seen, 10_000):
        pipe.sadd(k.seen, *(i.to_bytes(16, "big") for i in range(at, min(seen, at + 10_000))))
    for at in range(0, queue, 10_000):
        ids = range(at, min(queue, at + 10_000))
        pipe.zadd(k.queue, {b"host%d\0entry%d" % (i % 500, i) + b"x" * 100: 0 for i in ids})
        pipe.hset(k.requests, mapping={b"r%d" % i: b"t" * 8 + b"x" * 150 for i in ids})
    for i in range(robots):
        pipe.set(k.robots_txt(f"h{i}.example"), b"0 200\n" + b"d" * 200, px=3_600_000)
    pipe.set(k.paused, b"1")
    pipe.execute()


def worst(client: redis.Redis) -> list[list[Any]]:
    """The three slowest commands the server logged (ms, command and key name)."""
    entries = client.slowlog_get(128)
    top = sorted(entries, key=lambda e: e["duration"], reverse=True)[:3]
    return [[e["duration"] / 1000, b" ".join(e["command"].split()[:2]).decode()] for e in top]


def run(seen: int, queue: int, robots: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="migrate-bench-"))
    (work / "single").mkdir()
    server = RedisServer(directory=work / "single").start()
    nodes = RedisClusterNodes(work / "cluster").start()
    clients = [redis.Redis.from_url(server.url)] + [nodes.node(p) for p in nodes.ports]
    try:
        fill(clients[0], seen, queue, robots)
        report: dict[str, Any] = {
            "keys": clients[0].dbsize(),
            "source_bytes": clients[0].info("memory")["used_memory"],
        }
        for client in clients:
            client.config_set("slowlog-log-slower-than", SLOW_US)
            client.slowlog_reset()
        target = nodes.url(nodes.ports[0])
        for name, extra in (("move", []), ("again", []), ("delete_source", ["--delete-source"])):
            started = time.monotonic()
            argv = ["--redis-url", server.url, "--json", "migrate", "site", "--to", target]
            with contextlib.redirect_stdout(io.StringIO()) as out:
                code = distcrawl([*argv, *extra])
            report[name] = {
                "exit": code,
                "seconds": round(time.monotonic() - started, 2),
                "outcome": json.loads(out.getvalue() or "null"),
            }
        report["slowest_ms"] = {"source": worst(clients[0])}
        for port, client in zip(nodes.ports, clients[1:], strict=True):
            report["slowest_ms"][f"cluster node {port}"] = worst(client)
        return report
    finally:
        for client in clients:
            client.close()
        nodes.stop()
        server.stop()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--seen", type=int, default=1_000_000)
    parser.add_argument("--queue", type=int, default=200_000)
    parser.add_argument("--robots", type=int, default=10_000)
    args = parser.parse_args()
    print(json.dumps(run(args.seen, args.queue, args.robots), indent=2))


if __name__ == "__main__":
    cli()
