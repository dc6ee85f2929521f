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
domain keeps (one node, one shard only).

Each load process runs the worker's own batch runner: one ``Batch`` per round carries the
commit of the pages leased the round before (``Commit``: their acknowledgements and
children) and the next lease, as the scheduler sends them. With ``--shards N`` (N > 1) it is
``Runner`` over a ``Shards`` of N shard frontiers, as a worker with
``DISTCRAWL_SHARDS = N``: each lease asks the shards due, children go to the shard of their
URL's site in a first phase, the acknowledgements to the shard each page was leased from
once those are stored. Hosts are ``h<i>.test``, each a site of its own, so ``--hosts``
spreads the pages over the shards.

``--cluster`` starts a Redis Cluster of ``--masters`` (3) real ``redis-server`` processes on
127.0.0.1 (``tests/cluster.py``) instead of one server, connects with ``RedisCluster`` and
reports Redis CPU per page of each master and the balance (max / mean over masters).
``--summary`` runs the capacity table in one go: one node with 1 and 4 shards, the cluster
with 3, 6 and 12 shards. Every figure of a run on a shared machine (the load processes and
every Redis share its cores) is a Redis CPU cost per page; pages per second only say how
fast that machine went.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import redis
from redis.crc import key_slot

from distcrawl.engine._batch_types import Batch, Commit
from distcrawl.engine.batch import Runner
from distcrawl.model.connection import make_redis
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.records import Entry, EntryKind, Politeness
from distcrawl.model.shards import Shards, shard_of_url
from distcrawl.testing.redis_server import RedisServer

RESULTS = Path(__file__).resolve().parent / "results"
NAMESPACE = "load"
LEASE_MS = 60_000
WORKER_TIMEOUT_MS = 60_000
#: the nodes' CPU is sampled this long (s) before the load starts: what they spend idle
IDLE_SECONDS = 1.0
#: a load process stops after this many rounds even if its time is not up
MAX_ROUNDS = 10_000_000
#: a commit Redis refuses or cannot take is sent again at most this many times
MAX_COMMIT_FAILURES = 5
#: the rows of ``--summary``: (cluster, shards)
SUMMARY_ROWS = ((False, 1), (False, 4), (True, 3), (True, 6), (True, 12))
SHARED_MACHINE = (
    f"numbers from a shared {os.cpu_count()}-core machine: the load processes and every Redis "
    "share its cores (and other jobs may run), so pages/s say how fast this machine went; "
    "size with Redis CPU per page"
)
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


def host_url(host: int, page: int) -> str:
    return f"http://h{host}.test/p/{page}"


def url_entry(host: int, page: int) -> Entry:
    url = host_url(host, page)
    fingerprint = hashlib.sha1(url.encode()).digest()[:12]
    payload = msgpack.packb({"u": url}, use_bin_type=True)
    # the request rides along (never sent) as the scheduler's entries carry it: a sharded
    # commit routes an entry by its request's URL
    return Entry(
        EntryKind.REQUEST, fingerprint, 0, payload, b"", f"h{host}.test", SimpleNamespace(url=url)
    )


class PayloadCodec:
    """The runner's codec for this benchmark's payloads (``{"u": url}``): no Scrapy request."""

    def decode(self, payload: bytes) -> SimpleNamespace:
        return SimpleNamespace(url=msgpack.unpackb(payload, raw=False)["u"])


def client_of(url: str, cluster: bool) -> redis.Redis:
    return make_redis(url, cluster=True) if cluster else redis.Redis.from_url(url)


def keys_of(cluster: bool, shards: int) -> FrontierKeys:
    """The crawl's own keys, as a worker of ``DISTCRAWL_SHARDS = shards`` names them."""
    return FrontierKeys(NAMESPACE, cluster=cluster).sharded(shards)


def runner_of(
    client: redis.Redis, cluster: bool, shards: int, politeness: Politeness
) -> tuple[Runner, Shards]:
    """The batch runner and shards of one worker, as ``_scheduler/opening.py`` makes them."""
    keys = keys_of(cluster, shards)
    tag = os.urandom(4).hex()
    crawl = Frontier(client, keys, politeness, tag=tag)
    if shards == 1:
        sh = Shards.single(crawl)
        return Runner(crawl, PayloadCodec(), **_runner_options()), sh
    parts = [Frontier(client, part, politeness, tag=tag) for part in keys.parts(shards)]
    sh = Shards(crawl, parts)
    return Runner(crawl, PayloadCodec(), shards=sh, **_runner_options()), sh


def _runner_options() -> dict[str, Any]:
    return {"lease_ms": LEASE_MS, "worker_timeout_ms": WORKER_TIMEOUT_MS}


def worker(
    url: str,
    cluster: bool,
    shards: int,
    seconds: float,
    hosts: int,
    pages: int,
    links: int,
    batch: int,
    delay_ms: int,
    seed: int,
    go: Any,
    out: Any,
) -> None:
    """One load process: each round commits the pages leased the round before (their
    acknowledgements and children) and leases the next ones, in one batch."""
    client = client_of(url, cluster)
    runner, _ = runner_of(client, cluster, shards, Politeness(concurrency=8, delay_ms=delay_ms))
    rng = random.Random(seed)
    done = leases = rounds = empty = commit_errors = errors = 0
    #: commits not stored yet, oldest first: sent in order, each only once those before it
    #: succeeded (a failed one is sent again with the next batch, as the scheduler does)
    pending: list[Commit] = []
    go.wait(60)
    start = time.perf_counter()
    cpu0 = time.process_time()
    deadline = time.monotonic() + seconds
    while rounds < MAX_ROUNDS:
        closing = time.monotonic() >= deadline
        if closing and not pending:
            break
        rounds += 1
        res = runner.run(Batch(commits=list(pending), want=0 if closing else batch))
        if res.error is not None:
            errors += 1
        for commit in pending[: res.commits_done]:
            done += len(commit.acks)
        pending = pending[res.commits_done :]
        if pending:
            commit_errors += 1
            pending[0].failures += 1
            if pending[0].failures >= MAX_COMMIT_FAILURES:
                raise RuntimeError(
                    f"a commit failed {MAX_COMMIT_FAILURES} times: {res.commit_error}"
                )
        if closing:
            continue
        leases += 1
        got = [item for item in res.leased if item.request is not None]
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
        pending.append(Commit([item.ref for item in got], children, []))
    out.put(
        {
            "pages": done,
            "rounds": rounds,
            "leases": leases,
            "empty_leases": empty,
            "commit_errors": commit_errors,
            "errors": errors,
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


def cpu_of(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def scripts_of(client: redis.Redis) -> int:
    """Script calls the node ran (EVALSHA and EVAL)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


@dataclass
class Redises:
    """The Redis a row runs against: one server, or the masters of a cluster."""

    url: str
    cluster: bool
    #: a plain client of each node (masters only), by port
    nodes: dict[int, redis.Redis] = field(default_factory=dict)
    #: port of the master holding each shard
    owners: list[int] = field(default_factory=list)

    def sample(self) -> dict[int, tuple[float, int, int, float]]:
        """CPU seconds, commands, script calls and system CPU seconds of each node."""
        out = {}
        for port, node in self.nodes.items():
            cpu = node.info("cpu")
            out[port] = (
                float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
                int(node.info("stats")["total_commands_processed"]),
                scripts_of(node),
                float(cpu["used_cpu_sys"]),
            )
        return out

    def memory(self) -> dict[int, int]:
        return {port: int(node.info("memory")["used_memory"]) for port, node in self.nodes.items()}


@contextlib.contextmanager
def redises(cluster: bool, shards: int, masters: int) -> Iterator[Redises]:
    """A fresh redis-server, or a fresh cluster of ``masters`` masters; stopped by PID."""
    if not cluster:
        with RedisServer() as server:
            assert server.port is not None
            node = server.client()
            try:
                yield Redises(server.url, False, {server.port: node}, [server.port] * shards)
            finally:
                node.close()
        return
    from tests.cluster import RedisClusterNodes

    with tempfile.TemporaryDirectory(prefix="distcrawl-capacity-") as work:
        nodes = RedisClusterNodes(Path(work), masters=masters)
        try:
            nodes.start()
            keys = keys_of(True, shards)
            owners = [
                nodes.owner(key_slot(keys.of_shard(i).prefix.encode())) for i in range(shards)
            ]
            clients = {port: nodes.node(port) for port in nodes.ports}
            try:
                yield Redises(nodes.url(nodes.ports[0]), True, clients, owners)
            finally:
                for client in clients.values():
                    client.close()
        finally:
            nodes.stop()


def seed_frontier(client: redis.Redis, sh: Shards, hosts: int) -> None:
    """Page 0 of every host, in its site's shard."""
    by_shard: dict[int, list[Entry]] = {}
    for h in range(hosts):
        by_shard.setdefault(shard_of_url(host_url(h, 0), sh.count), []).append(url_entry(h, 0))
    for shard, entries in sorted(by_shard.items()):
        for at in range(0, len(entries), 1000):
            sh.parts[shard].commit([], entries[at : at + 1000])


def run(args: argparse.Namespace) -> dict[str, Any]:
    measure_memory = not args.cluster and args.shards == 1 and not args.no_drain
    with redises(args.cluster, args.shards, args.masters) as rs:
        client = client_of(rs.url, rs.cluster)
        _, sh = runner_of(client, rs.cluster, args.shards, Politeness())
        seed_frontier(client, sh, args.hosts)
        out: Any = multiprocessing.Queue()
        go: Any = multiprocessing.Event()
        procs = [
            multiprocessing.Process(
                target=worker,
                args=(
                    rs.url,
                    rs.cluster,
                    args.shards,
                    args.seconds,
                    args.hosts,
                    args.pages,
                    args.links,
                    args.batch,
                    args.delay_ms,
                    i,
                    go,
                    out,
                ),
            )
            for i in range(args.processes)
        ]
        for p in procs:
            p.start()
        try:
            time.sleep(1.0)  # the processes import and connect before the clock starts
            # what the nodes spend with nothing to do (the server's and the cluster bus' cron)
            idle0 = rs.sample()
            time.sleep(IDLE_SECONDS)
            before = rs.sample()
            go.set()
            reports = [out.get(timeout=args.seconds + 60) for _ in procs]
            after = rs.sample()
        finally:
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
                    p.join(5)
        pages = sum(r["pages"] for r in reports)
        seconds = max(r["seconds"] for r in reports)
        node_cpu = {port: after[port][0] - before[port][0] for port in rs.nodes}
        commands = sum(after[port][1] - before[port][1] for port in rs.nodes)
        scripts = sum(after[port][2] - before[port][2] for port in rs.nodes)
        node_sys = {port: after[port][3] - before[port][3] for port in rs.nodes}
        idle = {port: (before[port][0] - idle0[port][0]) / IDLE_SECONDS for port in rs.nodes}
        redis_cpu = sum(node_cpu.values())
        mean = redis_cpu / len(node_cpu)
        memory = rs.memory()
        sizes = sh.sizes()
        result: dict[str, Any] = {
            "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "machine": SHARED_MACHINE,
            "masters": len(rs.nodes),
            "shards": args.shards,
            "shards_per_master": {str(port): rs.owners.count(port) for port in rs.nodes},
            "pages": pages,
            "seconds": seconds,
            "pages_per_s": pages / seconds,
            "redis_cpu_cores": redis_cpu / seconds,
            "redis_cpu_us_per_page": 1e6 * redis_cpu / max(pages, 1),
            "node_cpu_us_per_page": {
                str(port): 1e6 * c / max(pages, 1) for port, c in node_cpu.items()
            },
            "node_cpu_cores": {str(port): c / seconds for port, c in node_cpu.items()},
            "balance": max(node_cpu.values()) / mean if mean > 0 else 1.0,
            "redis_cpu_sys_share": sum(node_sys.values()) / redis_cpu if redis_cpu else 0.0,
            "idle_cpu_ms_per_s": {str(port): 1000 * c for port, c in idle.items()},
            "commands_per_page": commands / max(pages, 1),
            "scripts_per_page": scripts / max(pages, 1),
            "rounds_per_page": sum(r["rounds"] for r in reports) / max(pages, 1),
            "load_cpu_ms_per_page": 1000 * sum(r["cpu_seconds"] for r in reports) / max(pages, 1),
            "empty_leases": sum(r["empty_leases"] for r in reports),
            "commit_errors": sum(r["commit_errors"] for r in reports),
            "errors": sum(r["errors"] for r in reports),
            "seen_urls": sizes.get("seen", 0),
            "queued_at_end": sizes.get("queue", 0),
            "used_memory_at_end": sum(memory.values()),
            "used_memory_by_node": {str(port): m for port, m in memory.items()},
            "shard_queued_at_end": [int(client.zcard(f.keys.queue)) for f in sh.parts],
        }
        if measure_memory:
            result.update(_finished_domains(client, sh.crawl.keys, args.hosts))
        client.close()
    return result


def _finished_domains(client: redis.Redis, keys: FrontierKeys, hosts: int) -> dict[str, Any]:
    """Drain the queue, then measure what the finished hosts keep before and after the sweep."""
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
        name: int(client.memory_usage(getattr(keys, name), samples=0) or 0) for name in SLOT_KEYS
    }
    return {
        "drained": drained,
        "finished_domain_bytes_before_sweep": kept / hosts,
        "sweep_calls": sweeps,
        "finished_domain_bytes": sum(slot_bytes.values()) / hosts,
        "finished_domain_bytes_by_key": {k: v / hosts for k, v in slot_bytes.items()},
        "finished_domain_entries": {n: _entries(client, getattr(keys, n)) for n in SLOT_KEYS},
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


def where(result: dict[str, Any]) -> str:
    if result["config"]["cluster"]:
        return f"{result['masters']}-master cluster"
    return "1 node"


def print_run(result: dict[str, Any]) -> None:
    args = result["config"]
    print(
        f"{where(result)}, {result['shards']} shard(s): {result['pages']} pages in "
        f"{result['seconds']:.1f}s by {args['processes']} processes: "
        f"{result['pages_per_s']:.0f} pages/s; Redis {result['redis_cpu_cores']:.2f} cores, "
        f"{result['redis_cpu_us_per_page']:.0f} us/page, "
        f"{result['commands_per_page']:.1f} commands/page, "
        f"{result['scripts_per_page']:.2f} scripts/page; "
        f"load {result['load_cpu_ms_per_page']:.2f} CPU ms/page"
    )
    if result["masters"] > 1:
        nodes = ", ".join(
            f"{port}: {us:.0f} us/page ({result['shards_per_master'][port]} shards)"
            for port, us in result["node_cpu_us_per_page"].items()
        )
        print(f"per master: {nodes}; balance (max/mean) {result['balance']:.2f}")
    idle = ", ".join(f"{ms:.1f}" for ms in result["idle_cpu_ms_per_s"].values())
    print(
        f"Redis system CPU {100 * result['redis_cpu_sys_share']:.0f}% of its CPU; "
        f"idle before the load: {idle} ms/s per node"
    )
    print(
        f"seen {result['seen_urls']}, queued at the end {result['queued_at_end']}, "
        f"used memory {result['used_memory_at_end'] / 2**20:.1f} MiB; "
        f"commit errors {result['commit_errors']}, other errors {result['errors']}"
    )
    if "finished_domain_bytes" in result:
        print(
            f"a finished domain keeps {result['finished_domain_bytes_before_sweep']:.0f} bytes, "
            f"{result['finished_domain_bytes']:.0f} once swept "
            f"({result['finished_domain_entries']} entries left of {args['hosts']} hosts)"
        )


def table(rows: list[dict[str, Any]]) -> str:
    """The summary as a Markdown table."""
    lines = [
        "| setup | shards | pages/s | Redis CPU ms/page, all | per master, ms/page "
        "| busiest master, cores | balance max/mean | scripts/page |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_node = " / ".join(f"{1e-3 * us:.3f}" for us in r["node_cpu_us_per_page"].values())
        lines.append(
            f"| {where(r)} | {r['shards']} | {r['pages_per_s']:.0f} "
            f"| {1e-3 * r['redis_cpu_us_per_page']:.3f} | {per_node} "
            f"| {max(r['node_cpu_cores'].values()):.2f} "
            f"| {r['balance']:.2f} | {r['scripts_per_page']:.2f} |"
        )
    return "\n".join(lines)


def summary(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for cluster, shards in SUMMARY_ROWS:
        row_args = argparse.Namespace(**{**vars(args), "cluster": cluster, "shards": shards})
        row_args.no_drain = True
        result = run(row_args)
        print_run(result)
        rows.append(result)
    return {"machine": SHARED_MACHINE, "rows": rows, "table": table(rows)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.frontier_load", description=__doc__)
    p.add_argument("--processes", type=int, default=4, help="load processes (workers)")
    p.add_argument("--seconds", type=float, default=20.0, help="per run (per row of --summary)")
    p.add_argument("--hosts", type=int, default=2000, help="hosts, each a site of its own")
    p.add_argument("--pages", type=int, default=2000, help="page space per host")
    p.add_argument("--links", type=int, default=17, help="children per page")
    p.add_argument("--batch", type=int, default=32, help="leased per call, as DISTCRAWL_PREFETCH")
    p.add_argument("--delay-ms", type=int, default=0, help="DOWNLOAD_DELAY of every host (ms)")
    p.add_argument("--shards", type=int, default=1, help="DISTCRAWL_SHARDS")
    p.add_argument("--cluster", action="store_true", help="a Redis Cluster, not one node")
    p.add_argument("--masters", type=int, default=3, help="masters of --cluster")
    p.add_argument(
        "--summary",
        action="store_true",
        help="the capacity table: 1 node with 1 and 4 shards, the cluster with 3, 6, 12",
    )
    p.add_argument("--no-drain", action="store_true", help="skip the finished-domain memory")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    if not 1 <= args.shards <= 256:
        p.error("--shards: 1 to 256")
    print(SHARED_MACHINE)
    if args.summary:
        result = summary(args)
        output = args.output or RESULTS / "frontier_capacity.json"
        print(result["table"])
    else:
        result = run(args)
        output = args.output or RESULTS / "frontier_load.json"
        print_run(result)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"JSON: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
