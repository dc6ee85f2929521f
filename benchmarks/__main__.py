"""``python -m benchmarks``: plain Scrapy vs scrapy-redis 0.9.1 vs distcrawl, on one machine.

One command, nothing to set up but redis-server and the ``baseline`` extra: it starts its own
Redis and demo sites on 127.0.0.1, and runs, each against a fresh Redis and a fresh site:

1. the capacity of the demo site alone (so that it is visibly not the bottleneck);
2. the timed crawls: plain Scrapy (one process), scrapy-redis with 1 and 2 workers,
   distcrawl with 1 and 2 workers, all the same ``site`` parsing on the same site;
3. a protocol pass: a smaller crawl per Redis-based crawler under ``MONITOR``, to split the
   commands the workers send from those their scripts run (never during the timed crawls);
4. the storage pass: both frontiers filled with the same requests, bytes per request and URL.

It prints the tables and the targets of issue 8, and writes everything to
``benchmarks/results/latest.json`` (logs of every process stay in ``benchmarks/results/run``).

``--suite users`` runs instead the crawls of issue 14, configured as users run them (the
project's settings, site latency 0 and 100 ms, 1 and 8 hosts, sporadic 503s; see
``benchmarks/users.py``), into ``benchmarks/results/users.json`` and ``results/run-users``.

``--suite lean`` runs issue 28's table in one run (``benchmarks/lean.py``): Redis CPU,
commands and commands sent per page with users' settings at 0 and 100 ms, 1 and 2 workers,
beside plain Scrapy and scrapy-redis; 2 workers on 8 hosts; idle workers (4 and 200) and push
to lease (1 and 20 idle workers); the slowest script call with 1,000,000 start URLs. ``--quick``
is its development variant (100,000 start URLs, 4 and 20 idle workers, shorter crawls), into
``benchmarks/results/lean.json`` and ``results/run-lean``.

``--suite start-urls`` measures start URLs through the frontier alone (no HTTP), 1 and 2
worker processes side by side (``benchmarks/start_urls.py``): ``--start-urls N`` entries
(200,000 by default), ``--distcrawl DIR`` to measure another checkout's package instead.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--suite",
        choices=("default", "users", "lean", "start-urls"),
        default="default",
        help="default: the crawler comparison of issue 8; users: issue 14's configurations; "
        "lean: issue 28's table (Redis work per page, idle workers, slowest script); "
        "start-urls: start URLs through the frontier alone, 1 and 2 workers",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="lean suite: the development variant (100,000 start URLs, 4 and 20 idle workers, "
        "500-page crawls, 10 s idle windows)",
    )
    p.add_argument(
        "--start-urls",
        type=int,
        default=None,
        help="entries of the start-urls suite (default 200000) and of the lean suite "
        "(1000000, 100000 with --quick)",
    )
    p.add_argument(
        "--start-url-workers",
        type=int,
        nargs="+",
        default=None,
        help="lean suite: worker processes of the start-URL runs (default 2)",
    )
    p.add_argument(
        "--start-url-batch",
        type=int,
        default=None,
        help="start-URL runs: entries read and committed at a time (default 100, "
        "DISTCRAWL_START_URLS_BATCH's default)",
    )
    p.add_argument(
        "--queued-seconds",
        type=float,
        default=None,
        help="start-URL runs: then lease and acknowledge this long on the queue they left "
        "(default 0 for the start-urls suite, 15 for the lean suite)",
    )
    p.add_argument(
        "--idle-workers",
        type=int,
        nargs="+",
        default=None,
        help="lean suite: idle worker counts whose cost is measured (default 4 200; --quick 4 20)",
    )
    p.add_argument(
        "--pickup-workers",
        type=int,
        nargs="+",
        default=None,
        help="lean suite: idle worker counts a pushed URL is timed with (default 1 20)",
    )
    p.add_argument(
        "--idle-seconds",
        type=float,
        default=None,
        help="lean suite: measuring window of each idle run (default 60, --quick 30)",
    )
    p.add_argument(
        "--parts",
        nargs="*",
        choices=("crawls", "protocol", "idle", "start_urls", "scripts", "instructions"),
        help="lean suite: run only these parts",
    )
    p.add_argument(
        "--scripts-against",
        type=Path,
        default=None,
        help="lean suite, scripts and instructions parts: another checkout whose .lua files run"
        " alternately with these, the two compared",
    )
    p.add_argument(
        "--distcrawl",
        type=Path,
        default=None,
        help="start-urls suite: a checkout whose distcrawl package is measured instead",
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="start-urls and lean suites: seconds each start-URL run takes at most "
        "(default 90; lean 300)",
    )
    p.add_argument(
        "--pages",
        type=int,
        default=None,
        help="pages of the demo site (timed crawls); default 5000, and for the users suite "
        "1000 at 0 ms, 800 at 100 ms, 600 for the 503 rows (--pages sets them all)",
    )
    p.add_argument("--monitor-pages", type=int, default=500, help="pages of the protocol pass")
    p.add_argument("--fill", type=int, default=100_000, help="requests of the storage pass")
    p.add_argument("--timeout", type=float, default=300, help="seconds allowed per crawl")
    p.add_argument("--repeat", type=int, default=1, help="rounds of timed crawls (median)")
    p.add_argument(
        "--fail-timeout",
        type=float,
        default=60,
        help="seconds allowed for the users suite's sporadic-503 crawl (its missing pages "
        "are reported)",
    )
    p.add_argument(
        "--only",
        nargs="*",
        help="run only these configurations (for development); in the users suite a row "
        "key (100ms-8hosts/distcrawl-2), a setup (100ms-8hosts) or a crawler (distcrawl-2)",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help="JSON results (default results/latest.json, or results/users.json)",
    )
    args = p.parse_args(argv)
    if args.output is None:
        name = {"users": "users.json", "lean": "lean.json", "start-urls": "start_urls.json"}.get(
            args.suite
        )
        args.output = RESULTS / (name or "latest.json")
    if args.pages is None and args.suite == "default":
        args.pages = 5000
    lean_defaults(args)
    return args


def lean_defaults(args: argparse.Namespace) -> None:
    """The size options whose defaults depend on the suite (and on ``--quick``)."""
    from benchmarks import lean

    mode = "quick" if args.quick else "full"
    args.mode = mode
    if args.suite != "lean":
        args.start_urls = 200_000 if args.start_urls is None else args.start_urls
        args.max_seconds = 90.0 if args.max_seconds is None else args.max_seconds
        return
    if args.start_urls is None:
        args.start_urls = lean.START_URLS[mode]
    if args.max_seconds is None:
        args.max_seconds = 300.0
    if args.start_url_workers is None:
        args.start_url_workers = list(lean.START_URL_WORKERS)
    if args.idle_workers is None:
        args.idle_workers = list(lean.IDLE_WORKERS[mode])
    if args.pickup_workers is None:
        args.pickup_workers = list(lean.PICKUP_WORKERS)
    if args.idle_seconds is None:
        args.idle_seconds = lean.IDLE_SECONDS[mode]


def check_requirements() -> str | None:
    """A clear message instead of a traceback half-way through a ten-minute run."""
    if shutil.which("redis-server") is None and not os.environ.get("DISTCRAWL_REDIS_SERVER"):
        return "redis-server not found (apt-get install redis-server redis-tools)"
    if shutil.which("redis-cli") is None:
        return "redis-cli not found (apt-get install redis-tools)"
    try:
        version = importlib.metadata.version("scrapy-redis")
    except importlib.metadata.PackageNotFoundError:
        return "scrapy-redis is not installed: pip install -e '.[baseline]'"
    if version != "0.9.1":
        return f"scrapy-redis {version} installed; the baseline is 0.9.1"
    return None


def environment() -> dict[str, Any]:
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "-"

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": {n: version(n) for n in ("scrapy", "scrapy-redis", "redis", "twisted")},
    }


def site_capacity(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from benchmarks.capacity import measure_site
    from benchmarks.crawl import LINKS

    print("Demo site alone: 16 keep-alive connections for 3 s ...")
    cap = measure_site(args.pages, LINKS, workdir / "capacity")
    print(
        f"  {cap['requests_per_s']:.0f} requests/s, site CPU {cap['site_cpu_utilisation']:.0%} "
        "of one core (single-threaded: ~100% means this is the site's own limit)"
    )
    return cap


def timed_crawls(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every configuration ``--repeat`` times, in rounds, so that a burst of other load on
    the machine hits one round rather than one configuration; the median run by pages/s is
    reported, every run's pages/s and CPU per page are kept."""
    from benchmarks.crawl import CONFIGS, run_crawl
    from benchmarks.metrics import crawl_metrics

    configs = [c for c in CONFIGS if not args.only or c.key in args.only]
    runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in configs}
    for round_no in range(1, args.repeat + 1):
        for config in configs:
            suffix = f" (round {round_no} of {args.repeat})" if args.repeat > 1 else ""
            print(f"Crawl: {config.label}, {args.pages} pages{suffix} ...")
            where = workdir / (config.key + (f"-{round_no}" if args.repeat > 1 else ""))
            row = crawl_metrics(run_crawl(config, args.pages, where, args.timeout))
            runs[config.key].append(row)
            print_run(row)
    return {key: median_run(rows) for key, rows in runs.items()}


def print_run(row: dict[str, Any]) -> None:
    print(
        f"  {row['pages']} pages in {row['crawl_seconds']:.1f}s = {row['pages_per_s']:.1f}/s, "
        f"{row['duplicates']} duplicates, {row['missing']} missing, "
        f"{row['cpu_ms_per_page']['workers']:.2f} worker CPU ms/page "
        f"({row['wall_seconds']:.0f}s with start-up and close; other load on the machine "
        f"{row['background_cpu_cores']:.2f} CPUs)"
    )


def median_run(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median pages/s, plus a summary of all runs."""
    ordered = sorted(rows, key=lambda r: r["pages_per_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["runs"] = [
        {
            "pages_per_s": r["pages_per_s"],
            "cpu_ms_per_page": r["cpu_ms_per_page"]["workers"],
            "background_cpu_cores": r["background_cpu_cores"],
        }
        for r in rows
    ]
    return chosen


def protocol_pass(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from benchmarks.crawl import Config, run_crawl
    from benchmarks.metrics import monitor_metrics

    out: dict[str, Any] = {}
    passes = [Config("scrapy-redis-1", "scrapy-redis", 1), Config("distcrawl-1", "distcrawl", 1)]
    for config in passes:
        if args.only and config.key not in args.only:
            continue
        print(f"Protocol pass (MONITOR): {config.label}, {args.monitor_pages} pages ...")
        where = workdir / f"monitor-{config.key}"
        run = run_crawl(config, args.monitor_pages, where, args.timeout, monitor=True)
        assert run.monitor is not None
        out[config.key] = monitor_metrics(run, run.monitor)
    return out


def storage_pass(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from benchmarks.redisstats import calibrate
    from benchmarks.storage import distcrawl_storage, scrapy_redis_storage
    from distcrawl.testing.redis_server import RedisServer

    print(f"Storage pass: {args.fill} requests into each frontier ...")
    (workdir / "storage").mkdir(parents=True, exist_ok=True)
    with RedisServer(directory=workdir / "storage") as server:
        client = server.client()
        try:
            return {
                "requests": args.fill,
                "counter_calibration": calibrate(client),
                "distcrawl": distcrawl_storage(client, args.fill),
                "distcrawl bloom": distcrawl_storage(client, args.fill, seen="bloom"),
                "scrapy-redis": scrapy_redis_storage(client, args.fill),
            }
        finally:
            client.close()


def print_report(results: dict[str, Any]) -> None:
    from benchmarks.report import (
        crawl_table,
        load_warning,
        protocol_table,
        storage_table,
        targets_table,
    )

    meta = results["meta"]
    cap = results["site_capacity"]
    print()
    print(
        f"Timed crawls: DemoSite(pages={meta['pages']}, links=17), {meta['cpus']} CPUs; "
        f"site capacity alone {cap['requests_per_s']:.0f} req/s"
    )
    print(crawl_table(results))
    warning = load_warning(results)
    if warning:
        print(warning)
    if results.get("protocol"):
        print(f"\nRedis commands per page under MONITOR ({meta['monitor_pages']} pages, 1 worker)")
        print(protocol_table(results["protocol"]))
    if results.get("storage"):
        print(f"\nRedis memory, {results['storage']['requests']} queued requests")
        print(storage_table(results["storage"]))
    print("\nTargets of issue 8")
    print(targets_table(results["targets"]))


def users_suite(args: argparse.Namespace) -> int:
    """``--suite users``: issue 14's rows, one table, its own JSON and log directory."""
    from benchmarks.users import print_users_report, run_suite, users_targets

    started = time.monotonic()
    workdir = args.output.parent / "run-users"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    results: dict[str, Any] = {
        "meta": {**environment(), "suite": "users", "pages": args.pages, "repeat": args.repeat},
        "configurations": run_suite(args, workdir),
    }
    results["targets"] = users_targets(results)
    results["meta"]["suite_seconds"] = time.monotonic() - started
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print_users_report(results)
    print(f"\nSuite time {results['meta']['suite_seconds']:.0f}s; JSON: {args.output}")
    print(f"Logs of every worker, site and Redis: {workdir}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.suite == "start-urls":  # redis-server only: no crawler, no baseline
        from benchmarks.start_urls import suite_main

        return suite_main(
            args.start_urls,
            args.distcrawl,
            args.output,
            args.max_seconds,
            batch=args.start_url_batch or 100,
            queued_seconds=args.queued_seconds or 0.0,
        )
    problem = check_requirements()
    if problem:
        print(f"benchmarks: {problem}", file=sys.stderr)
        return 2
    if args.suite == "users":
        return users_suite(args)
    if args.suite == "lean":
        from benchmarks.lean import lean_suite

        return lean_suite(args, environment())
    from benchmarks.report import targets

    started = time.monotonic()
    workdir = args.output.parent / "run"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    results: dict[str, Any] = {
        "meta": {**environment(), "pages": args.pages, "monitor_pages": args.monitor_pages},
        "site_capacity": site_capacity(args, workdir),
        "configurations": timed_crawls(args, workdir),
        "protocol": protocol_pass(args, workdir),
        "storage": storage_pass(args, workdir),
    }
    results["targets"] = targets(results)
    results["meta"]["suite_seconds"] = time.monotonic() - started
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print_report(results)
    print(f"\nSuite time {results['meta']['suite_seconds']:.0f}s; JSON: {args.output}")
    print(f"Logs of every worker, site and Redis: {workdir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
