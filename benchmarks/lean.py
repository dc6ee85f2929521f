"""The ``lean`` suite (issue 28): what the frontier costs Redis per page, per idle second and
per script call, beside plain Scrapy and scrapy-redis 0.9.1, in one run.

``python -m benchmarks --suite lean`` (``--quick`` for a development run of a few minutes).
It calls the suites that own each measurement and only puts their numbers side by side:

1. crawls with users' settings (``benchmarks/users.py``: the add-on, 16 requests and 16 per
   domain, ~17 links a page, nothing overridden), each against a fresh Redis and fresh sites:
   site latency 0 and 100 ms on one host for plain Scrapy, distcrawl and scrapy-redis with 1
   and 2 workers, and distcrawl with 1 and 2 workers at 100 ms on 8 hosts. Per row: pages/s,
   worker CPU per page, Redis CPU per page (``INFO`` ``used_cpu_user + used_cpu_sys`` from the
   push to the end of the crawl), Redis commands per page (``INFO`` ``total_commands_processed``:
   scripts' inner calls included), script calls and round trips (``total_reads_processed``)
   per page, and push to first fetch (the workers idle for ``SETTLE`` before the push);
2. a protocol pass: smaller crawls of the same setups under ``MONITOR`` (never a timed row),
   which tags the calls a script runs ``lua``: the commands the workers *sent* per page and
   those their scripts ran (INFO counts both in the same ``cmdstat_*`` entries). A timed row
   with no pass of its own (scrapy-redis with 2 workers, 8 hosts) gets an estimate: the
   1-worker pass's sent commands per round trip times the row's round trips;
3. idle workers (``benchmarks/idle.py``, real worker processes on an empty frontier):
   commands/s per worker and Redis CPU per second for ``--idle-workers`` (4 and 200), and push
   to lease of a pushed start URL with ``--pickup-workers`` (1 and 20) idle workers;
4. start URLs through the frontier (``benchmarks/start_urls.py``): ``--start-urls`` entries
   (1,000,000; 100,000 with ``--quick``) with 2 worker processes on one shard, and the slowest
   script call in ``SLOWLOG`` (every call over 1 ms is logged);
5. the batch's scripts alone (``benchmarks/script_costs.py``): places, commit and lease in a
   loop at batch sizes 1 to 14, each script's µs per call split into a fixed part and a part
   per request, and the unit costs inside a script (a ``redis.call``, a closure, a string):
   warm and without the crawls' noise, the part to compare two versions of a script with.

It prints one table per part, the targets of issue 28 with met / NOT met, and writes
``benchmarks/results/lean.json`` (after every part, so a run cut short keeps what it measured;
the logs of every process are in ``benchmarks/results/run-lean/``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from benchmarks.crawl import CONFIGS
from benchmarks.script_costs import run_script_costs
from benchmarks.script_instructions import run_script_instructions
from benchmarks.table import Column, num, render
from benchmarks.users import Row, Setup

#: pages of each crawl: (0 ms, 100 ms) for the full run and for --quick
PAGES = {"full": (1000, 800), "quick": (500, 500)}
MONITOR_PAGES = {"full": 500, "quick": 500}
IDLE_WORKERS = {"full": (4, 200), "quick": (4, 20)}
PICKUP_WORKERS = (1, 20)
#: an idle worker's periodic steps come every 3.3, 5, 30 and 60 s: a full run's window holds
#: each at its rate (a 20 s window missed or doubled the monitor's 60 s beat)
IDLE_SECONDS = {"full": 60.0, "quick": 30.0}
PUSHES = {"full": 5, "quick": 3}
START_URLS = {"full": 1_000_000, "quick": 100_000}
START_URL_WORKERS = (2,)
#: issue 28's bounds
REDIS_CPU_US = 50.0
IDLE_COMMANDS_PER_S = 1.0
PICKUP_S = 1.0
IDLE_200_CORE_SHARE = 0.05
SCRIPT_MS = 10.0
#: "not growing with latency or worker count": the largest of the four rows' Redis CPU per
#: page over the smallest, with room for the machine's noise
GROWTH = 1.25

BY_KEY = {c.key: c for c in CONFIGS}
FOUR = (
    "0ms-1host/distcrawl-1",
    "0ms-1host/distcrawl-2",
    "100ms-1host/distcrawl-1",
    "100ms-1host/distcrawl-2",
)


def crawl_rows(mode: str, pages: int | None = None) -> list[Row]:
    """The timed rows, in an order where the rows a target compares run back to back."""
    fast, slow = (pages, pages) if pages else PAGES[mode]
    out: list[Row] = []
    order = ("scrapy", "distcrawl-1", "distcrawl-2", "scrapy-redis-1", "scrapy-redis-2")
    for latency, size in ((0.0, fast), (0.1, slow)):
        setup = Setup(f"{latency * 1000:g}ms-1host", latency, 1, size)
        out += [Row(setup, BY_KEY[key]) for key in order]
    eight = Setup("100ms-8hosts", 0.1, 8, slow)
    out += [Row(eight, BY_KEY[key]) for key in ("distcrawl-1", "distcrawl-2")]
    return out


def monitor_rows(mode: str) -> list[Row]:
    size = MONITOR_PAGES[mode]
    out = []
    for latency in (0.0, 0.1):
        setup = Setup(f"{latency * 1000:g}ms-1host", latency, 1, size)
        out += [Row(setup, BY_KEY[k]) for k in ("distcrawl-1", "distcrawl-2", "scrapy-redis-1")]
    return out


# --------------------------------------------------------------------------- the parts


def run_crawls(args: Any, workdir: Path) -> dict[str, Any]:
    from benchmarks.users import median_row, print_user_run, run_user_crawl, user_metrics

    selected = [r for r in crawl_rows(args.mode, args.pages) if r.selected(args.only)]
    runs: dict[str, list[dict[str, Any]]] = {r.key: [] for r in selected}
    for round_no in range(1, args.repeat + 1):
        for row in selected:
            suffix = f" (round {round_no} of {args.repeat})" if args.repeat > 1 else ""
            print(f"Crawl: {row.setup.label}, {row.config.label}, {row.setup.pages} pages{suffix}")
            name = row.key.replace("/", "-") + (f"-{round_no}" if args.repeat > 1 else "")
            metrics = user_metrics(run_user_crawl(row, workdir / name, args.timeout))
            runs[row.key].append(metrics)
            print_user_run(metrics)
    return {key: median_row(found) for key, found in runs.items()}


def run_protocol(args: Any, workdir: Path) -> dict[str, Any]:
    from benchmarks.metrics import monitor_metrics
    from benchmarks.users import run_user_crawl

    out = {}
    for row in monitor_rows(args.mode):
        if not row.selected(args.only):
            continue
        print(f"Protocol pass (MONITOR): {row.setup.label}, {row.config.label}, ...")
        where = workdir / ("monitor-" + row.key.replace("/", "-"))
        run = run_user_crawl(row, where, args.timeout, monitor=True)
        assert run.run.monitor is not None
        found = monitor_metrics(run.run, run.run.monitor)
        scripts = run.run.traffic.scripts if run.run.traffic else 0
        found["inner_per_script"] = (
            sum(run.run.monitor.script.values()) / scripts if scripts else 0.0
        )
        found["scripts_per_page"] = scripts / max(run.run.fetch.pages, 1)
        out[row.key] = found
        print(
            f"  sent {found['client_commands_per_page']:.2f}/page, in scripts "
            f"{found['script_commands_per_page']:.2f}/page, "
            f"{found['inner_per_script']:.1f} inner calls per script call"
        )
    return out


#: idle worker counts above this are measured with the load generator (benchmarks.idle_load,
#: the workers' own idle code in one process): so many Scrapy processes do not start on 2 CPUs
REAL_IDLE_MAX = 40


def run_idle(args: Any, workdir: Path) -> dict[str, Any]:
    """``benchmarks.idle`` once per worker count, through its CLI entry point
    (``benchmarks.idle_load`` above ``REAL_IDLE_MAX`` workers)."""
    from benchmarks import idle, idle_load

    out: dict[str, Any] = {}
    counts = sorted(set(args.idle_workers) | set(args.pickup_workers))
    for n in counts:
        pickup = n in args.pickup_workers
        argv = ["--workers", str(n), "--seconds", str(args.idle_seconds)]
        argv += ["--pushes", str(PUSHES[args.mode] if pickup else 1)]
        argv += ["--output", str(workdir / f"idle-{n}.json")]
        tool = idle_load if n > REAL_IDLE_MAX else idle
        print(f"Idle: python -m {tool.__name__} {' '.join(argv)}")
        began = time.monotonic()
        try:
            tool.main(argv)
            found = json.loads((workdir / f"idle-{n}.json").read_text())
        except (SystemExit, Exception) as exc:  # a count the machine cannot start
            found = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"  not measured: {found['error']}")
        found["argv"] = argv
        found["suite_seconds"] = round(time.monotonic() - began, 1)
        out[str(n)] = found
    return out


def run_start_urls(args: Any, workdir: Path) -> dict[str, Any]:
    from benchmarks.start_urls import BATCH, QUEUED_SECONDS, run_suite

    queued = QUEUED_SECONDS if args.queued_seconds is None else args.queued_seconds
    return run_suite(
        args.start_urls,
        workdir / "start-urls",
        None,
        args.max_seconds,
        tuple(args.start_url_workers),
        batch=args.start_url_batch or BATCH,
        queued_seconds=queued,
    )


# --------------------------------------------------------------------------- derived numbers


def _per_page(row: dict[str, Any] | None, key: str) -> float | None:
    if row is None or row.get("redis") is None:
        return None
    return float(row["redis"]["per_page"][key])


def redis_cpu_us(row: dict[str, Any] | None) -> float | None:
    ms = _per_page(row, "redis_cpu_ms")
    return None if ms is None else 1000 * ms


def sent_estimate(key: str, row: dict[str, Any], protocol: dict[str, Any]) -> float | None:
    """Commands sent per page without MONITOR: the 1-worker, 1-host protocol pass of the same
    crawler and latency, its sent commands per round trip times this row's round trips per page (a
    round trip is one pipeline, whose commands are the batch's)."""
    trips = _per_page(row, "round_trips")
    latency = key.split("-")[0]
    ref = protocol.get(f"{latency}-1host/{row['kind']}-1")
    if trips is None or ref is None or not ref.get("round_trips_per_page"):
        return None
    return trips * float(ref["client_commands_per_page"]) / float(ref["round_trips_per_page"])


def derive(results: dict[str, Any]) -> None:
    rows = results.get("crawls", {})
    for key, row in rows.items():
        row["redis_cpu_us_per_page"] = redis_cpu_us(row)
        passed = results.get("protocol", {}).get(key)
        if passed is not None:
            row["sent_commands_per_page"] = passed["client_commands_per_page"]
            row["sent_commands_source"] = "protocol pass (MONITOR), same setup and crawler"
        else:
            row["sent_commands_per_page"] = sent_estimate(key, row, results.get("protocol", {}))
            row["sent_commands_source"] = "estimate: 1-worker pass's sent per round trip"


def lean_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks.report import _ratio, _target

    rows: dict[str, dict[str, Any]] = results.get("crawls", {})

    def pps(key: str) -> float | None:
        row = rows.get(key)
        return None if row is None else float(row["pages_per_s"])

    out = []
    for ms in ("0ms", "100ms"):
        r = _ratio(pps(f"{ms}-1host/distcrawl-1"), pps(f"{ms}-1host/scrapy"))
        out.append(_target(f"1 worker vs plain Scrapy, {ms}", r, ">= 0.95x", 0.95, "x"))
    r = _ratio(pps("100ms-8hosts/distcrawl-2"), pps("100ms-8hosts/distcrawl-1"))
    out.append(_target("2 workers vs 1, 100 ms, 8 hosts", r, ">= 1.7x", 1.7, "x"))
    cpus = {}
    for key in FOUR:
        cpus[key] = redis_cpu_us(rows.get(key))
        latency, workers = key.split("-1host/distcrawl-")
        name = f"Redis CPU/page, {latency[:-2]} ms, {workers} worker{'s' if workers != '1' else ''}"
        goal = f"<= {REDIS_CPU_US:g}"
        out.append(_target(name, cpus[key], goal, REDIS_CPU_US, " µs"))
    known = [v for v in cpus.values() if v]
    growth = max(known) / min(known) if len(known) == len(FOUR) else None
    out.append(
        _target(
            "Redis CPU/page, largest/smallest of 4",
            growth,
            f"<= {GROWTH}x",
            GROWTH,
            "x",
            "not growing with latency or workers",
        )
    )
    idle = results.get("idle", {})
    for n, found in sorted(idle.items(), key=lambda kv: int(kv[0])):
        if "idle" not in found or int(n) not in (4, 200):
            continue
        per = found["idle"]["commands_per_s_per_worker"]
        out.append(
            _target(
                f"idle worker commands/s, {n} workers",
                per,
                f"<= {IDLE_COMMANDS_PER_S:g}",
                IDLE_COMMANDS_PER_S,
                note="INFO total_commands_processed, scripts' calls included",
            )
        )
    share = _get_idle(idle, "200", "redis_cpu_ms_per_s")
    out.append(
        _target(
            "200 idle workers, share of a Redis core",
            None if share is None else share / 1000,
            f"<= {IDLE_200_CORE_SHARE}",
            IDLE_200_CORE_SHARE,
            note="" if share is not None else _idle_error(idle, "200"),
        )
    )
    for n in PICKUP_WORKERS:
        found = idle.get(str(n), {})
        most = found.get("pickup_leased_max_s")
        out.append(
            _target(
                f"push to lease, {n} idle worker{'s' if n > 1 else ''} (max)",
                most,
                f"<= {PICKUP_S:g} s",
                PICKUP_S,
                " s",
                "" if most is not None else _idle_error(idle, str(n)),
            )
        )
    from benchmarks.start_urls import SLOWLOG_LEN

    for n, found in results.get("start_urls", {}).items():
        logged = found["slowlog_entries"]
        # SLOWLOG keeps its last SLOWLOG_LEN entries: a full log is a lower bound
        over_1ms = f">= {logged}" if logged >= SLOWLOG_LEN else str(logged)
        out.append(
            _target(
                f"slowest script, {found['start_urls']:,} start URLs, {n} workers",
                found["worst_ms"],
                f"<= {SCRIPT_MS:g} ms",
                SCRIPT_MS,
                " ms",
                f"{found['over_10ms']} over 10 ms (in the last {logged}), {over_1ms} over 1 ms",
            )
        )
        queued = found.get("queued_phase")
        if queued:
            out.append(
                _target(
                    f"slowest script, leasing at {queued['queued']:,} queued, {n} workers",
                    queued["worst_script_ms"],
                    f"<= {SCRIPT_MS:g} ms",
                    SCRIPT_MS,
                    " ms",
                    f"{queued['script_calls_over_10ms']} script calls over 10 ms, "
                    f"{queued['script_calls_over_1ms']} over 1 ms",
                )
            )
    return out


def _get_idle(idle: dict[str, Any], n: str, key: str) -> float | None:
    value = idle.get(n, {}).get("idle", {}).get(key)
    return None if value is None else float(value)


def _idle_error(idle: dict[str, Any], n: str) -> str:
    return str(idle.get(n, {}).get("error", "not run"))


# --------------------------------------------------------------------------- report


def crawl_table(results: dict[str, Any]) -> str:
    rows: dict[str, dict[str, Any]] = results.get("crawls", {})
    protocol = results.get("protocol", {})

    def ref(row: dict[str, Any]) -> str:
        key = row["reference"]
        if row["setup"] == "100ms-8hosts":
            key = "100ms-8hosts/distcrawl-1"
        other = rows.get(key)
        if other is None or not other["pages_per_s"]:
            return "n/a"
        return f"{row['pages_per_s'] / other['pages_per_s']:.2f}"

    def sent(row: dict[str, Any]) -> str:
        value = row.get("sent_commands_per_page")
        if row["kind"] == "scrapy" or value is None:
            return "-" if row["kind"] == "scrapy" else "n/a"
        return f"{value:.2f}" + ("" if row["key"] in protocol else "~")

    columns: list[Column] = [
        ("setup", 15, lambda r: r["setup_label"]),
        ("configuration", 23, lambda r: r["label"]),
        ("pages", 9, lambda r: f"{r['unique_pages']}/{r['expected_pages']}"),
        ("pages/s", 7, lambda r: num(r["pages_per_s"], ".1f")),
        ("x ref", 5, ref),
        ("wkr CPU ms/pg", 13, lambda r: num(r["cpu_ms_per_page"]["workers"], ".2f")),
        ("Redis CPU µs/pg", 15, lambda r: num(r.get("redis_cpu_us_per_page"), ".0f")),
        ("idle µs/pg", 10, lambda r: num(r.get("redis_idle_us_per_page"), ".0f")),
        ("cmd/pg", 6, lambda r: num(_per_page(r, "commands"), ".1f")),
        ("sent/pg", 7, sent),
        ("scripts/pg", 10, lambda r: num(_per_page(r, "scripts"), ".2f")),
        ("RT/pg", 5, lambda r: num(_per_page(r, "round_trips"), ".2f")),
        ("push->1st s", 11, lambda r: num(r.get("push_to_first_fetch_s"), ".2f")),
        ("other CPU", 9, lambda r: num(r.get("background_cpu_cores"), ".2f")),
    ]
    return render(columns, rows.values())


CRAWL_NOTES = """\
x ref: pages/s over plain Scrapy's in the same setup (8 hosts: over 1 distcrawl worker).
Redis CPU: INFO used_cpu_user+used_cpu_sys from the push to the end of the crawl, per page.
idle: of that, what the same Redis used per second in 2 s before the push (its own
housekeeping, the workers waiting) times the crawl's length, per page: a floor that grows with
how long the crawl lasts, not with its pages.
cmd/pg: INFO total_commands_processed (scripts' inner calls included); sent/pg: commands the
workers sent, counted under MONITOR in a separate crawl of the same setup and crawler (the
protocol pass below), ~ estimated where the pass has no such crawl as the 1-worker pass's sent
commands per round trip x this row's RT/pg; RT/pg: round trips (INFO total_reads_processed,
a pipeline is one). push->1st: LPUSH to the first fetch of the home page, the workers idle
for 1 s before. other CPU: CPUs other processes used meanwhile (the machine is shared)."""


def protocol_table(protocol: dict[str, Any]) -> str:
    head = f"{'row':30}{'cmd/pg':>8}{'sent/pg':>9}{'in scripts/pg':>15}{'scripts/pg':>12}"
    head += f"{'inner/script':>14}{'RT/pg':>8}"
    lines = [head + "  top commands sent (per crawl)"]
    for key, row in protocol.items():
        top = ", ".join(f"{k} {v}" for k, v in list(row["client_commands"].items())[:5])
        lines.append(
            f"{key:30}{row.get('executed_commands_per_page', 0.0):8.1f}"
            f"{row['client_commands_per_page']:9.2f}{row['script_commands_per_page']:15.2f}"
            f"{row.get('scripts_per_page', 0.0):12.2f}{row['inner_per_script']:14.1f}"
            f"{row.get('round_trips_per_page', 0.0):8.2f}  {top}"
        )
    return "\n".join(lines)


def idle_table(idle: dict[str, Any]) -> str:
    head = f"{'workers':>7}  {'cmd/s/worker':>12}  {'RT/s/worker':>11}  {'scripts/s/wkr':>13}  "
    head += f"{'Redis CPU ms/s':>14}  {'push->lease mean/max s':>22}"
    lines = [head]
    for n, found in sorted(idle.items(), key=lambda kv: int(kv[0])):
        if "idle" not in found:
            lines.append(f"{n:>7}  not measured: {found.get('error')}")
            continue
        i = found["idle"]
        if "pickup_leased_mean_s" in found:
            pickup = f"{found['pickup_leased_mean_s']:10.3f} / {found['pickup_leased_max_s']:.3f}"
        else:  # the load generator: to the claim, no Scrapy to lease
            mean, most = found["pickup_claimed_mean_s"], found["pickup_claimed_max_s"]
            pickup = f"{mean:10.3f} / {most:.3f} (claimed; generator)"
        lines.append(
            f"{n:>7}  {i['commands_per_s_per_worker']:12.2f}  "
            f"{i['round_trips_per_s_per_worker']:11.2f}  {i['scripts_per_s_per_worker']:13.2f}  "
            f"{i['redis_cpu_ms_per_s']:14.2f}  {pickup}"
        )
    return "\n".join(lines)


def print_lean_report(results: dict[str, Any]) -> None:
    from benchmarks.report import targets_table
    from benchmarks.start_urls import table as start_urls_table

    meta = results["meta"]
    print()
    print(
        f"Lean suite ({meta['mode']}): users' settings (add-on, CONCURRENT_REQUESTS = "
        f"CONCURRENT_REQUESTS_PER_DOMAIN = 16), ~17 links a page, {meta['cpus']} CPUs, "
        f"load average before {meta.get('load_before')}, after {meta.get('load_after')}"
    )
    wake = meta.get("wakeup")
    if wake:
        print(
            f"Redis CPU per round trip on this machine: PING {wake['ping_back_to_back_us']} µs "
            f"back to back, {wake['ping_spaced_us']} µs {wake['gap_s'] * 1000:g} ms apart; a "
            f"script reading TIME {wake['script_back_to_back_us']} and "
            f"{wake['script_spaced_us']} µs"
        )
    if results.get("crawls"):
        print(crawl_table(results))
        print(CRAWL_NOTES)
    if results.get("protocol"):
        print("\nProtocol pass under MONITOR (not timed)")
        print(protocol_table(results["protocol"]))
    if results.get("idle"):
        print("\nIdle workers on an empty frontier (benchmarks/idle.py)")
        print(idle_table(results["idle"]))
    if results.get("start_urls"):
        print("\nStart URLs through the frontier, one shard (benchmarks/start_urls.py)")
        print(start_urls_table(results["start_urls"]))
    print("\nTargets of issue 28")
    print(targets_table(results["targets"]))


def measure_wakeup(workdir: Path) -> dict[str, float]:
    """What one round trip costs a fresh redis-server on this machine (redisstats)."""
    from benchmarks.redisstats import wakeup_cost
    from distcrawl.testing.redis_server import RedisServer

    (workdir / "wakeup").mkdir(parents=True, exist_ok=True)
    with RedisServer(directory=workdir / "wakeup") as server:
        client = server.client()
        try:
            return wakeup_cost(client)
        finally:
            client.close()


def _load() -> str:
    """The machine's load average (1, 5, 15 min): it is shared, so the report says how busy."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def lean_suite(args: Any, environment: dict[str, Any]) -> int:
    import shutil

    started = time.monotonic()
    workdir = args.output.parent / "run-lean"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    results: dict[str, Any] = {
        "meta": {
            **environment,
            "suite": "lean",
            "mode": args.mode,
            "repeat": args.repeat,
            "start_urls": args.start_urls,
            "load_before": _load(),
        },
    }
    parts = [
        ("crawls", run_crawls),
        ("protocol", run_protocol),
        ("idle", run_idle),
        ("start_urls", run_start_urls),
        ("scripts", run_script_costs),
        ("instructions", run_script_instructions),
    ]
    results["meta"]["wakeup"] = measure_wakeup(workdir)
    for name, part in parts:
        if args.parts and name not in args.parts:
            continue
        began = time.monotonic()
        results[name] = part(args, workdir)
        results["meta"][f"{name}_seconds"] = round(time.monotonic() - began, 1)
        derive(results)
        results["targets"] = lean_targets(results)
        results["meta"]["load_after"] = _load()
        results["meta"]["suite_seconds"] = round(time.monotonic() - started, 1)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print_lean_report(results)
    print(f"\nSuite time {results['meta']['suite_seconds']:.0f}s; JSON: {args.output}")
    print(f"Logs of every worker, site and Redis: {workdir}/")
    return 0
