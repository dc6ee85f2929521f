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
#: the queued phase: requests leased per batch, batches between two reclaims, seconds
LEASE_WANT = 32
RECLAIM_EVERY = 10
QUEUED_SECONDS = 15.0
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


def worker(
    redis_url: str,
    start_at: float,
    out: Path,
    max_seconds: float,
    shards: int = 1,
    batch: int = BATCH,
) -> None:
    """One worker: read and store batches of ``batch`` entries until ``start_urls`` is empty
    or ``max_seconds`` have passed. With one shard a batch is committed by the engine's batch
    runner, as the scheduler commits (a checkout without it: ``Frontier.commit``). With
    ``shards`` above 1 (DISTCRAWL_SHARDS) each entry's request is stored in its site's shard
    (commit kind 'S'), then the batch leaves the claim list (claimed.lua), as the
    scheduler's sharded commits do."""
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
    commit = _committer(frontier)
    time.sleep(max(0.0, start_at - time.time()))
    first = time.time()
    enqueued = skipped = commits = 0
    while time.time() - first < max_seconds:
        raws = read(batch)
        if not raws:
            break
        entries = []
        for raw in raws:
            host = raw.split(b"/")[2].decode()
            fp = hashlib.sha1(raw).digest()
            entries.append(Entry(EntryKind.START_REQUEST, fp, 0, raw, raw, host))
        if shards == 1:
            result = commit(entries)
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


def _committer(frontier: Any) -> Any:
    """``entries -> CommitResult`` through the engine's batch runner (the scheduler's way,
    whose commits are cut into bounded calls), or ``Frontier.commit`` where there is none."""
    try:
        from distcrawl.codec.serialize import RequestCodec
        from distcrawl.engine._batch_types import Batch, Commit
        from distcrawl.engine.batch import Runner
    except ImportError:
        return lambda entries: frontier.commit([], entries)
    runner = Runner(frontier, RequestCodec(), lease_ms=60_000, worker_timeout_ms=60_000)

    def commit(entries: list[Any]) -> Any:
        res = runner.run(Batch(commits=[Commit([], entries, [])]))
        if res.committed is None:
            raise RuntimeError(f"commit failed: {res.commit_error or res.error}")
        return res.committed

    return commit


def crawler(redis_url: str, start_at: float, out: Path, max_seconds: float) -> None:
    """One worker on a full queue, as a crawl with instant pages: each batch acknowledges
    the requests leased by the one before, with a new link each (the queue stays as long),
    leases ``LEASE_WANT`` more, and every ``RECLAIM_EVERY`` batches runs the periodic reclaim
    (requeue.lua, sweep.lua). What is measured is the scripts' cost at that queue length."""
    import redis

    from distcrawl.codec.serialize import RequestCodec
    from distcrawl.engine._batch_types import Batch, Commit
    from distcrawl.engine.batch import Runner
    from distcrawl.model.frontier import Frontier
    from distcrawl.model.keys import FrontierKeys
    from distcrawl.model.records import Entry, EntryKind

    client = redis.Redis.from_url(redis_url)
    frontier = Frontier(client, FrontierKeys(NAMESPACE))
    runner = Runner(frontier, RequestCodec(), lease_ms=60_000, worker_timeout_ms=60_000)
    time.sleep(max(0.0, start_at - time.time()))
    first = time.time()
    held: list[Any] = []
    leased = batches = 0
    while time.time() - first < max_seconds:
        children = []
        for item in held:
            url = f"http://{item.slot}/next/{os.getpid()}/{leased}".encode()
            leased += 1
            fp = hashlib.sha1(url).digest()[:12]
            children.append(Entry(EntryKind.REQUEST, fp, 0, url, b"", item.slot))
        commits = [Commit([i.ref for i in held], children, [])] if held else []
        res = runner.run(
            Batch(commits=commits, want=LEASE_WANT, reclaim=batches % RECLAIM_EVERY == 0)
        )
        if res.error is not None:
            raise RuntimeError(f"batch failed: {res.error}")
        held = list(res.lease.items) if res.lease is not None else []
        batches += 1
    last = time.time()
    client.close()
    out.write_text(json.dumps({"first": first, "last": last, "leased": leased, "batches": batches}))


# ---------------------------------------------------------------------- the run


def _fill(client: Any, key: str, count: int) -> None:
    chunk = 10_000
    for at in range(0, count, chunk):
        client.lpush(key, *(entry(i) for i in range(at, min(count, at + chunk))))


def _cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _run_delay(pid: int) -> float:
    """Seconds the process has waited, runnable, for a CPU (/proc/<pid>/schedstat; 0 where
    there is none): what SLOWLOG's wall-clock durations include besides the work."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _launch(where: Path, name: str, argv: list[str], workers: int, timeout: float) -> list[Any]:
    """``workers`` processes of this module with ``argv`` and a common start; their reports."""
    start_at = time.time() + START_DELAY
    outs = [where / f"{name}-{i}.json" for i in range(workers)]
    # ``-m`` puts the working directory first on sys.path: the worker itself puts the
    # measured checkout before it (--distcrawl)
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "benchmarks.start_urls", *argv),
                *("--start-at", repr(start_at), "--out", str(out)),
            ],
            cwd=Path(__file__).resolve().parents[1],
        )
        for out in outs
    ]
    for proc in procs:
        try:
            proc.wait(timeout=timeout + START_DELAY + 60)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    failed = [p.returncode for p in procs if p.returncode]
    if failed:
        raise RuntimeError(f"worker exited with {failed}; logs in {where}")
    return [json.loads(out.read_text()) for out in outs]


def _slow_summary(slow: list[dict[str, Any]], names: dict[str, str]) -> dict[str, Any]:
    """The SLOWLOG's worst entry, and its entries by command (scripts by name); the
    benchmark's own SLOWLOG RESET is not the frontier's."""
    slow = [e for e in slow if not _command(e, names).upper().startswith("SLOWLOG")]
    worst = max(slow, key=lambda e: e["duration"], default=None)
    by_command: dict[str, dict[str, float]] = {}
    for e in slow:
        name = _command(e, names).split(" ")[0]
        row = by_command.setdefault(name, {"count": 0, "over_10ms": 0, "worst_ms": 0.0})
        ms = e["duration"] / 1000
        row["count"] += 1
        row["over_10ms"] += ms > SLOW_MS
        row["worst_ms"] = max(row["worst_ms"], round(ms, 3))
    scripts = [e for e in slow if _command(e, names).endswith(".lua")]
    worst_script = max(scripts, key=lambda e: e["duration"], default=None)
    return {
        "slowlog_entries": len(slow),
        "worst_ms": round(worst["duration"] / 1000, 3) if worst else 0.0,
        "worst_command": _command(worst, names),
        "over_10ms": sum(1 for e in slow if e["duration"] / 1000 > SLOW_MS),
        "script_calls_over_1ms": len(scripts),
        "script_calls_over_10ms": sum(1 for e in scripts if e["duration"] / 1000 > SLOW_MS),
        "worst_script_ms": round(worst_script["duration"] / 1000, 3) if worst_script else 0.0,
        "slowlog_by_command": by_command,
    }


def run_config(
    workers: int,
    count: int,
    workdir: Path,
    distcrawl_dir: Path | None,
    max_seconds: float,
    shards: int = 1,
    batch: int = BATCH,
    queued_seconds: float = 0.0,
    redis_nice: int = 0,
) -> dict[str, Any]:
    """``count`` entries, ``workers`` processes, one fresh Redis; then, with
    ``queued_seconds``, the same workers leasing and acknowledging on the queue that left.
    ``redis_nice`` (negative: needs CAP_SYS_NICE) runs this Redis at that niceness, as if
    it had a core of its own: what is left in SLOWLOG is the scripts' work, not the waits
    for a CPU the workers hold."""
    from distcrawl.testing.redis_server import RedisServer

    where = workdir / f"workers-{workers}"
    where.mkdir(parents=True, exist_ok=True)
    other = ["--distcrawl", str(distcrawl_dir.resolve())] if distcrawl_dir else []
    names = _script_names()
    queued_row: dict[str, Any] | None = None
    with RedisServer(directory=where) as server:
        client = server.client()
        try:
            _fill(client, f"{NAMESPACE}:start_urls", count)
            pid = int(client.info("server")["process_id"])
            if redis_nice:
                os.setpriority(os.PRIO_PROCESS, pid, redis_nice)
            client.config_set("slowlog-log-slower-than", SLOWLOG_US)
            client.config_set("slowlog-max-len", SLOWLOG_LEN)
            client.slowlog_reset()
            cpu0, wait0 = _cpu(client), _run_delay(pid)
            argv = ["--worker", server.url, *other, "--max-seconds", str(max_seconds)]
            argv += ["--shards", str(shards), "--batch", str(batch)]
            reports = _launch(where, "worker", argv, workers, max_seconds)
            cpu, waited = _cpu(client) - cpu0, _run_delay(pid) - wait0
            slow = client.slowlog_get(SLOWLOG_LEN)
            queued = int(client.zcard(f"{NAMESPACE}:queue"))
            if shards > 1:
                from distcrawl.model.keys import FrontierKeys

                crawl = FrontierKeys(NAMESPACE).sharded(shards)
                queued = sum(int(client.zcard(crawl.of_shard(i).queue)) for i in range(shards))
            left = int(client.llen(f"{NAMESPACE}:start_urls"))
            if queued_seconds > 0 and shards == 1:
                client.slowlog_reset()
                cpu0, wait0 = _cpu(client), _run_delay(pid)
                argv = ["--crawler", server.url, *other, "--max-seconds", str(queued_seconds)]
                crawls = _launch(where, "crawler", argv, workers, queued_seconds)
                span = max(r["last"] for r in crawls) - min(r["first"] for r in crawls)
                leased = sum(r["leased"] for r in crawls)
                queued_row = {
                    "queued": queued,
                    "seconds": round(span, 3),
                    "leased_per_s": leased / span if span > 0 else 0.0,
                    "batches": sum(r["batches"] for r in crawls),
                    "redis_cpu_seconds": round(_cpu(client) - cpu0, 3),
                    "redis_run_delay_seconds": round(_run_delay(pid) - wait0, 3),
                    **_slow_summary(client.slowlog_get(SLOWLOG_LEN), names),
                }
        finally:
            client.close()
    span = max(r["last"] for r in reports) - min(r["first"] for r in reports)
    row = {
        "workers": workers,
        "start_urls": count,
        "batch": batch,
        "queued": queued,
        "left": left,
        "seconds": round(span, 3),
        "start_urls_per_s": queued / span if span > 0 else 0.0,
        "skipped": sum(r["skipped"] for r in reports),
        "commits": sum(r["commits"] for r in reports),
        "redis_cpu_seconds": round(cpu, 3),
        # runnable but not running: SLOWLOG's durations are wall-clock, and on a machine
        # where the workers share Redis' cores this is what its slowest entries are made of
        "redis_run_delay_seconds": round(waited, 3),
        **_slow_summary(slow, names),
    }
    if queued_row is not None:
        row["queued_phase"] = queued_row
    return row


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
    batch: int = BATCH,
    queued_seconds: float = 0.0,
    redis_nice: int = 0,
) -> dict[str, Any]:
    rows = {}
    for workers in worker_counts:
        print(
            f"Start URLs: {count} entries, {workers} worker process(es), {shards} shard(s), "
            f"batches of {batch} ...",
            flush=True,
        )
        row = run_config(
            workers,
            count,
            workdir,
            distcrawl_dir,
            max_seconds,
            shards,
            batch,
            queued_seconds,
            redis_nice,
        )
        row["redis_nice"] = redis_nice
        print(
            f"  {row['queued']} stored in {row['seconds']:.1f}s = "
            f"{row['start_urls_per_s']:.0f}/s, Redis CPU {row['redis_cpu_seconds']:.1f}s "
            f"(waited {row['redis_run_delay_seconds']:.1f}s for a CPU), "
            f"worst SLOWLOG {row['worst_ms']:.1f} ms ({row['worst_command']}), "
            f"{row['over_10ms']} over {SLOW_MS:.0f} ms, script calls over 1 ms "
            f"{row['script_calls_over_1ms']}, {row['skipped']} skipped",
            flush=True,
        )
        if "queued_phase" in row:
            q = row["queued_phase"]
            print(
                f"  then {q['seconds']:.1f}s leasing at {q['queued']} queued: "
                f"{q['leased_per_s']:.0f} leased/s, worst SLOWLOG {q['worst_ms']:.1f} ms "
                f"({q['worst_command']}), {q['over_10ms']} over {SLOW_MS:.0f} ms, script "
                f"calls over 1 ms {q['script_calls_over_1ms']}, Redis waited "
                f"{q['redis_run_delay_seconds']:.1f}s for a CPU",
                flush=True,
            )
        rows[f"{workers}"] = row
    return rows


def table(rows: dict[str, Any]) -> str:
    head = f"{'workers':>7}  {'phase':>8}  {'per s':>8}  {'seconds':>7}  {'Redis CPU s':>11}  "
    head += f"{'CPU wait s':>10}  {'worst ms':>8}  {'over 10 ms':>10}  {'scripts > 1 ms':>14}  "
    head += f"{'skipped':>7}  {'left':>4}  worst"
    lines = [head]
    for row in rows.values():
        lines.append(
            f"{row['workers']:>7}  {'intake':>8}  {row['start_urls_per_s']:>8.0f}  "
            f"{row['seconds']:>7.1f}  {row['redis_cpu_seconds']:>11.1f}  "
            f"{row.get('redis_run_delay_seconds', 0.0):>10.1f}  {row['worst_ms']:>8.1f}  "
            f"{row['over_10ms']:>10}  {row.get('script_calls_over_1ms', '-'):>14}  "
            f"{row['skipped']:>7}  {row['left']:>4}  {row['worst_command']}"
        )
        q = row.get("queued_phase")
        if q:
            lines.append(
                f"{row['workers']:>7}  {'leasing':>8}  {q['leased_per_s']:>8.0f}  "
                f"{q['seconds']:>7.1f}  {q['redis_cpu_seconds']:>11.1f}  "
                f"{q['redis_run_delay_seconds']:>10.1f}  {q['worst_ms']:>8.1f}  "
                f"{q['over_10ms']:>10}  {q['script_calls_over_1ms']:>14}  {'':>7}  {'':>4}  "
                f"{q['worst_command']}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The worker entry points (``--worker URL``, ``--crawler URL``), or a stand-alone run
    of the suite."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.start_urls")
    p.add_argument("--worker", metavar="REDIS_URL")
    p.add_argument("--crawler", metavar="REDIS_URL")
    p.add_argument("--start-at", type=float, default=0.0)
    p.add_argument("--out", type=Path)
    p.add_argument("--start-urls", type=int, default=200_000)
    p.add_argument("--distcrawl", type=Path, default=None)
    p.add_argument("--max-seconds", type=float, default=90)
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--shards", type=int, default=1, help="DISTCRAWL_SHARDS of the frontier")
    p.add_argument("--batch", type=int, default=BATCH, help="entries read and committed at a time")
    p.add_argument(
        "--queued-seconds",
        type=float,
        default=0.0,
        help="then lease and acknowledge this long on the queue the run left (one shard)",
    )
    p.add_argument(
        "--redis-nice",
        type=int,
        default=0,
        help="niceness of the benchmark's Redis (e.g. -10: as if it had a core of its own)",
    )
    args = p.parse_args(argv)
    if args.worker or args.crawler:
        if args.distcrawl is not None:
            sys.path.insert(0, str(args.distcrawl))
        if args.crawler:
            crawler(args.crawler, args.start_at, args.out, args.max_seconds)
        else:
            worker(args.worker, args.start_at, args.out, args.max_seconds, args.shards, args.batch)
        return 0
    return suite_main(
        args.start_urls,
        args.distcrawl,
        args.output,
        args.max_seconds,
        tuple(args.workers),
        args.shards,
        args.batch,
        args.queued_seconds,
        args.redis_nice,
    )


def suite_main(
    count: int,
    distcrawl_dir: Path | None,
    output: Path | None,
    max_seconds: float = 90,
    worker_counts: tuple[int, ...] = (1, 2),
    shards: int = 1,
    batch: int = BATCH,
    queued_seconds: float = 0.0,
    redis_nice: int = 0,
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
    rows = run_suite(
        count,
        workdir,
        distcrawl_dir,
        max_seconds,
        worker_counts,
        shards,
        batch,
        queued_seconds,
        redis_nice,
    )
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
        f"\nStart URLs through the frontier ({count} entries, batches of {batch}, at most "
        f"{max_seconds:.0f} s per run; {source})"
    )
    print(table(rows))
    print(f"\nJSON: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
