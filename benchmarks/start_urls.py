"""Start URLs through the frontier alone: how fast workers turn ``start_urls`` entries into
queued requests, with 1 and 2 worker processes (``python -m benchmarks --suite start-urls``;
``--workers 1 4`` for others).

No HTTP and no Scrapy: each worker process reads entries the way the scheduler does (a batch
of ``DISTCRAWL_START_URLS_BATCH`` = 100 at a time, the next batch only once the last one is
stored) and stores a request per entry with ``Frontier.commit``, until ``start_urls`` is
empty, or for at most ``--max-seconds`` (90 by default: a slow configuration is measured
on the same long list without taking minutes). What is measured is what the entries cost
Redis: start URLs stored per second over the span from the first read to the last commit,
Redis' own CPU, and the slowest command or script in ``SLOWLOG`` (any over 1 ms is logged),
which is what every other worker waits behind. The SLOWLOG entries are also counted by the
script they ran (EVALSHA digests named from the scripts' sources) and how many took over 10 ms.

The same module measures the code of another checkout (``--distcrawl DIR``: its
``distcrawl`` package is imported instead of this one), so that a change can be compared
with what it replaces: a frontier with ``claim_start_urls`` claims entries (lua/claim.lua),
an older one peeks at them (``peek_start_urls``) and its commits take them from the list.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: entries a worker reads at a time (DISTCRAWL_START_URLS_BATCH's default)
BATCH = 100
#: SLOWLOG threshold (microseconds) and length for the run
SLOWLOG_US = 1000
SLOWLOG_LEN = 4096
#: the issue's bound for any one script (ms)
SLOW_MS = 10.0
NAMESPACE = "bench"
#: seconds between launching the workers and their common start (imports, connections)
START_DELAY = 2.0


def entry(i: int) -> bytes:
    """A plain-URL entry over 1,000 hosts, as producers push them."""
    return f"http://h{i % 1000}.test/page/{i}".encode()


# ---------------------------------------------------------------------- worker process


def worker(redis_url: str, start_at: float, out: Path, max_seconds: float, shards: int = 1) -> None:
    """One worker: read and store batches of entries until ``start_urls`` is empty or
    ``max_seconds`` have passed. With ``shards`` above 1 (DISTCRAWL_SHARDS) each entry's
    request is stored in its site's shard (commit kind 'S'), then the batch leaves the claim
    list (claimed.lua), as the scheduler's sharded commits do."""
    import redis

    import distcrawl
    from distcrawl.model.frontier import Frontier
    from distcrawl.model.keys import FrontierKeys
    from distcrawl.model.records import Entry, EntryKind

    print(f"worker {os.getpid()}: distcrawl from {distcrawl.__file__}", flush=True)

    client = redis.Redis.from_url(redis_url)
    keys = FrontierKeys(NAMESPACE)
    if shards > 1:
        from distcrawl.model.shards import shard_of_site

        keys = keys.sharded(shards)
        parts = [Frontier(client, part) for part in keys.parts(shards)]
    frontier = Frontier(client, keys, tag=parts[0].tag if shards > 1 else None)
    read = getattr(frontier, "claim_start_urls", None) or frontier.peek_start_urls  # type: ignore[attr-defined]
    time.sleep(max(0.0, start_at - time.time()))
    first = time.time()
    enqueued = skipped = commits = 0
    while time.time() - first < max_seconds:
        raws = read(BATCH)
        if not raws:
            break
        entries = []
        for raw in raws:
            host = raw.split(b"/")[2].decode()
            fp = hashlib.sha1(raw).digest()
            entries.append(Entry(EntryKind.START_REQUEST, fp, 0, raw, raw, host))
        if shards == 1:
            result = frontier.commit([], entries)
            enqueued += result.enqueued
            skipped += result.skipped
        else:
            routed: dict[int, list[Any]] = {}
            for e in entries:
                routed.setdefault(shard_of_site(e.slot, shards), []).append(
                    e._replace(kind=EntryKind.SHARD_START)
                )
            for shard, part in routed.items():
                enqueued += parts[shard].commit([], part).enqueued
            frontier.run(frontier.claimed_op(raws))
        commits += 1
    last = time.time()
    client.close()
    report = {"first": first, "last": last, "enqueued": enqueued, "skipped": skipped}
    out.write_text(json.dumps({**report, "commits": commits}))


# ---------------------------------------------------------------------- the run


def _fill(client: Any, key: str, count: int) -> None:
    chunk = 10_000
    for at in range(0, count, chunk):
        client.lpush(key, *(entry(i) for i in range(at, min(count, at + chunk))))


def _cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def run_config(
    workers: int,
    count: int,
    workdir: Path,
    distcrawl_dir: Path | None,
    max_seconds: float,
    shards: int = 1,
) -> dict[str, Any]:
    """``count`` entries, ``workers`` processes, one fresh Redis."""
    from distcrawl.testing.redis_server import RedisServer

    where = workdir / f"workers-{workers}"
    where.mkdir(parents=True, exist_ok=True)
    with RedisServer(directory=where) as server:
        client = server.client()
        try:
            _fill(client, f"{NAMESPACE}:start_urls", count)
            client.config_set("slowlog-log-slower-than", SLOWLOG_US)
            client.config_set("slowlog-max-len", SLOWLOG_LEN)
            client.slowlog_reset()
            cpu0 = _cpu(client)
            start_at = time.time() + START_DELAY
            # ``-m`` puts the working directory first on sys.path: the worker itself puts
            # the measured checkout before it (--distcrawl)
            other = ["--distcrawl", str(distcrawl_dir.resolve())] if distcrawl_dir else []
            outs = [where / f"worker-{i}.json" for i in range(workers)]
            procs = [
                subprocess.Popen(
                    [
                        *(sys.executable, "-m", "benchmarks.start_urls", "--worker", server.url),
                        *("--start-at", repr(start_at), "--out", str(out), *other),
                        *("--max-seconds", str(max_seconds), "--shards", str(shards)),
                    ],
                    cwd=Path(__file__).resolve().parents[1],
                )
                for out in outs
            ]
            for proc in procs:
                try:
                    proc.wait(timeout=max_seconds + START_DELAY + 60)
                except subprocess.TimeoutExpired:
                    for p in procs:
                        p.kill()
                    raise
            failed = [p.returncode for p in procs if p.returncode]
            if failed:
                raise RuntimeError(f"worker exited with {failed}; logs in {where}")
            cpu = _cpu(client) - cpu0
            slow = client.slowlog_get(SLOWLOG_LEN)
            queued = int(client.zcard(f"{NAMESPACE}:queue"))
            if shards > 1:
                from distcrawl.model.keys import FrontierKeys

                crawl = FrontierKeys(NAMESPACE).sharded(shards)
                queued = sum(int(client.zcard(crawl.of_shard(i).queue)) for i in range(shards))
            left = int(client.llen(f"{NAMESPACE}:start_urls"))
        finally:
            client.close()
    reports = [json.loads(out.read_text()) for out in outs]
    span = max(r["last"] for r in reports) - min(r["first"] for r in reports)
    worst = max(slow, key=lambda e: e["duration"], default=None)
    names = _script_names()
    by_command: dict[str, dict[str, float]] = {}
    for e in slow:
        name = _command(e, names).split(" ")[0]
        row = by_command.setdefault(name, {"count": 0, "over_10ms": 0, "worst_ms": 0.0})
        ms = e["duration"] / 1000
        row["count"] += 1
        row["over_10ms"] += ms > SLOW_MS
        row["worst_ms"] = max(row["worst_ms"], round(ms, 3))
    return {
        "workers": workers,
        "start_urls": count,
        "queued": queued,
        "left": left,
        "seconds": round(span, 3),
        "start_urls_per_s": queued / span if span > 0 else 0.0,
        "skipped": sum(r["skipped"] for r in reports),
        "commits": sum(r["commits"] for r in reports),
        "redis_cpu_seconds": round(cpu, 3),
        "slowlog_entries": len(slow),
        "worst_ms": round(worst["duration"] / 1000, 3) if worst else 0.0,
        "worst_command": _command(worst, names),
        "over_10ms": sum(1 for e in slow if e["duration"] / 1000 > SLOW_MS),
        "slowlog_by_command": by_command,
    }


def _script_names() -> dict[str, str]:
    """EVALSHA digest -> script name, for the scripts of the measured checkout."""
    from distcrawl.model import lua

    names = {}
    for seen in lua.SEEN_MODES:
        for name in lua.NAMES:
            digest = hashlib.sha1(lua.script_source(name, seen).encode()).hexdigest()
            names[digest] = f"{name}.lua"
    return names


def _command(slow: dict[str, Any] | None, names: dict[str, str]) -> str:
    if not slow:
        return ""
    parts = slow.get("command", b"")
    text = parts.decode(errors="replace") if isinstance(parts, bytes) else str(parts)
    words = text.split(" ")
    if len(words) > 1 and words[0].upper() == "EVALSHA":
        return names.get(words[1], f"EVALSHA {words[1][:8]}")
    return text[:60]


def run_suite(
    count: int,
    workdir: Path,
    distcrawl_dir: Path | None = None,
    max_seconds: float = 90,
    worker_counts: tuple[int, ...] = (1, 2),
    shards: int = 1,
) -> dict[str, Any]:
    rows = {}
    for workers in worker_counts:
        print(
            f"Start URLs: {count} entries, {workers} worker process(es), {shards} shard(s) ...",
            flush=True,
        )
        row = run_config(workers, count, workdir, distcrawl_dir, max_seconds, shards)
        print(
            f"  {row['queued']} stored in {row['seconds']:.1f}s = "
            f"{row['start_urls_per_s']:.0f}/s, Redis CPU {row['redis_cpu_seconds']:.1f}s, "
            f"worst SLOWLOG {row['worst_ms']:.1f} ms ({row['worst_command']}), "
            f"{row['over_10ms']} over {SLOW_MS:.0f} ms, {row['skipped']} skipped",
            flush=True,
        )
        rows[f"{workers}"] = row
    return rows


def table(rows: dict[str, Any]) -> str:
    head = f"{'workers':>7}  {'start URLs/s':>12}  {'seconds':>7}  {'Redis CPU s':>11}  "
    head += f"{'worst SLOWLOG ms':>16}  {'over 10 ms':>10}  {'skipped':>7}  {'left':>4}  worst"
    lines = [head]
    for row in rows.values():
        lines.append(
            f"{row['workers']:>7}  {row['start_urls_per_s']:>12.0f}  {row['seconds']:>7.1f}  "
            f"{row['redis_cpu_seconds']:>11.1f}  {row['worst_ms']:>16.1f}  "
            f"{row['over_10ms']:>10}  {row['skipped']:>7}  {row['left']:>4}  {row['worst_command']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The worker entry point (``--worker URL``), or a stand-alone run of the suite."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.start_urls")
    p.add_argument("--worker", metavar="REDIS_URL")
    p.add_argument("--start-at", type=float, default=0.0)
    p.add_argument("--out", type=Path)
    p.add_argument("--start-urls", type=int, default=200_000)
    p.add_argument("--distcrawl", type=Path, default=None)
    p.add_argument("--max-seconds", type=float, default=90)
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--shards", type=int, default=1, help="DISTCRAWL_SHARDS of the frontier")
    args = p.parse_args(argv)
    if args.worker:
        if args.distcrawl is not None:
            sys.path.insert(0, str(args.distcrawl))
        worker(args.worker, args.start_at, args.out, args.max_seconds, args.shards)
        return 0
    return suite_main(
        args.start_urls,
        args.distcrawl,
        args.output,
        args.max_seconds,
        tuple(args.workers),
        args.shards,
    )


def suite_main(
    count: int,
    distcrawl_dir: Path | None,
    output: Path | None,
    max_seconds: float = 90,
    worker_counts: tuple[int, ...] = (1, 2),
    shards: int = 1,
) -> int:
    if distcrawl_dir is not None:
        sys.path.insert(0, str(distcrawl_dir.resolve()))
    import distcrawl

    if (
        distcrawl_dir is not None
        and Path(distcrawl.__file__).resolve().parents[1] != Path(distcrawl_dir).resolve()
    ):
        raise SystemExit(f"distcrawl imported from {distcrawl.__file__}, not {distcrawl_dir}")
    results_dir = Path(__file__).resolve().parent / "results"
    output = output or results_dir / "start_urls.json"
    workdir = output.parent / "run-start-urls"
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows = run_suite(count, workdir, distcrawl_dir, max_seconds, worker_counts, shards)
    source = str(Path(distcrawl.__file__).resolve().parent)
    meta = {
        "distcrawl": source,
        "cpus": os.cpu_count(),
        "max_seconds": max_seconds,
        "shards": shards,
    }
    results = {"meta": meta, "configurations": rows}
    results["meta"]["suite_seconds"] = round(time.monotonic() - started, 1)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"\nStart URLs through the frontier ({count} entries, batches of {BATCH}, at most "
        f"{max_seconds:.0f} s per run; {source})"
    )
    print(table(rows))
    print(f"\nJSON: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
