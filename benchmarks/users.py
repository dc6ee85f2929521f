"""The ``users`` suite (issue 14): crawls configured as users run them.

The default suite opens ``CONCURRENT_REQUESTS_PER_DOMAIN`` up to 64 on one 0-latency host, so
that it measures the crawlers' CPU. Users keep the project's settings (``distcrawl/settings.py``:
the add-on on, ``CONCURRENT_REQUESTS = CONCURRENT_REQUESTS_PER_DOMAIN = 16``) and crawl sites
that take time to answer, often several at once. This suite crawls, with nothing set on the
command line but what selects the crawler:

- at site latency 0 ms and 100 ms, on one host (127.0.0.1) and on 8 hosts (one demo site on
  each of 127.0.0.2 ... 127.0.0.9, the pages split between them, one start URL per host: the
  ``site`` spider stays within the host of its start URL, and each host is a download slot);
- plain Scrapy (one process), distcrawl and scrapy-redis with 1 and 2 workers;
- sporadic 503s: 600 pages at 20 ms, 10% of the pages answer 503 twice (no ``Retry-After``),
  distcrawl with 1 worker and plain Scrapy, each next to the same crawl without failures; the
  crawl is cut off at ``--fail-timeout`` and its missing pages are counted.

A crawl ends when every worker has exited, or once the sites' logs hold every expected page
(then ``GRACE`` seconds more, and the workers are stopped), or at its timeout. Besides
pages/s it reports what the sites saw: the requests of each slot in flight at the site (max
and time-weighted mean, from each request's arrival and answer times in the site's log), each
worker's share of the pages (its User-Agent) and Redis CPU per page (``INFO`` ``used_cpu_user
+ used_cpu_sys`` delta).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.crawl import (
    CONFIGS,
    KINDS,
    POLL,
    PROGRESS_EVERY,
    SETTLE,
    Config,
    CrawlRun,
    read_monitor,
    scrapy_stats,
    seen_sizes,
    start_monitor,
    start_workers,
    stop_process,
    wait_ready,
)
from benchmarks.procs import ProcSampler
from benchmarks.redisstats import Snapshot, Traffic, own_traffic, traffic
from benchmarks.sitelog import FetchStats, count_lines, fetch_stats
from benchmarks.table import Column, num, render
from distcrawl import settings as project_settings
from distcrawl.demo.site import DemoSite, LogLine
from distcrawl.testing.redis_server import RedisServer
from distcrawl.testing.workers import Worker

#: nothing over the project's settings (the add-on, 16 requests, 16 per domain, robots.txt,
#: LOG_LEVEL INFO): the kinds add only what selects the crawler (scheduler, dupefilter, spider)
USER_SETTINGS: dict[str, Any] = {}
#: the per-slot limit the users' settings configure, which the site-seen concurrency is held to
SLOT_LIMIT = int(project_settings.CONCURRENT_REQUESTS_PER_DOMAIN)
ONE_HOST = "127.0.0.1"
#: seconds of the workers waiting, before the push, over which Redis' idle CPU is read (the
#: lean table's "idle" column: a floor a crawl pays per second, not per page)
IDLE_WINDOW = 2.0
#: Linux routes all of 127.0.0.0/8 to lo: 8 more addresses need no setup
EIGHT_HOSTS = tuple(f"127.0.0.{i}" for i in range(2, 10))
LINKS = 17
#: pages per crawl (all hosts together). At 0 ms a crawl is CPU-bound (~90-180 pages/s on
#: this machine): 1,000 pages is 6-12 s of crawling, well above start-up noise. At 100 ms one
#: worker is latency-bound (16 in flight: at most 160 pages/s), 800 pages keeps the crawl
#: several seconds long after its ramp-up (home -> 10 pages -> 170 links). Both keep
#: ``--suite users --repeat 3`` near 20 minutes.
PAGES_FAST = 1000
PAGES_SLOW = 800
PAGES_FAIL = 600
FAIL_TIMEOUT = 60.0
GRACE = 1.0  # seconds after the last expected page, for late duplicates to reach the log
CHECK_EVERY = 0.5  # seconds between two completeness checks of the site logs
STOP_TIMEOUT = 20.0


@dataclass(frozen=True)
class Setup:
    """The site side of a row: latency, hosts, size and failures."""

    key: str
    latency: float
    hosts: int
    pages: int
    fail_rate: float = 0.0
    fail_times: int = 2
    #: seconds allowed for the crawl; None: ``--timeout``
    timeout: float | None = None
    #: the setup whose same-configuration row this one's speed is compared with (None: plain
    #: Scrapy in this setup)
    compare_with: str | None = None

    @property
    def label(self) -> str:
        text = f"{self.latency * 1000:g} ms, {self.hosts} host{'s' if self.hosts > 1 else ''}"
        if self.fail_rate:
            text += f", {self.fail_rate:.0%} 503x{self.fail_times}"
        return text

    @property
    def addresses(self) -> tuple[str, ...]:
        return (ONE_HOST,) if self.hosts == 1 else EIGHT_HOSTS[: self.hosts]


@dataclass(frozen=True)
class Row:
    setup: Setup
    config: Config

    @property
    def key(self) -> str:
        return f"{self.setup.key}/{self.config.key}"

    @property
    def reference(self) -> str:
        """The row the ``x ref`` column divides by."""
        if self.setup.compare_with is not None:
            return f"{self.setup.compare_with}/{self.config.key}"
        return f"{self.setup.key}/scrapy"

    def selected(self, only: list[str] | None) -> bool:
        return not only or any(o in (self.key, self.setup.key, self.config.key) for o in only)


RECRAWL_CONFIG = Config(
    "distcrawl-recrawl-1", "distcrawl", 1, (("DISTCRAWL_RECRAWL_INTERVAL", 86400),)
)


def rows(pages: int | None = None, fail_timeout: float = FAIL_TIMEOUT) -> list[Row]:
    """Every row of the suite; ``pages`` (``--pages``) replaces every crawl's size."""
    out: list[Row] = []
    for latency, size in ((0.0, PAGES_FAST), (0.1, PAGES_SLOW)):
        for hosts in (1, 8):
            key = f"{latency * 1000:g}ms-{hosts}host{'s' if hosts > 1 else ''}"
            setup = Setup(key, latency, hosts, pages or size)
            out += [Row(setup, config) for config in CONFIGS]
            if hosts == 1:
                # revisits on (pages due again in a day): what judging each answer and storing
                # its revisit costs a crawl, beside the same crawl without
                out.append(Row(setup, RECRAWL_CONFIG))
    # plain Scrapy too: what the same 503s do to a crawl without distcrawl
    pair = [c for c in CONFIGS if c.key in ("scrapy", "distcrawl-1")]
    ok = Setup("20ms-1host", 0.02, 1, pages or PAGES_FAIL)
    failing = Setup(
        "20ms-503",
        0.02,
        1,
        pages or PAGES_FAIL,
        fail_rate=0.1,
        fail_times=2,
        timeout=fail_timeout,
        compare_with=ok.key,
    )
    out += [Row(setup, config) for setup in (ok, failing) for config in pair]
    return out


# --------------------------------------------------------------------------- one crawl


@dataclass
class UserRun:
    row: Row
    run: CrawlRun
    #: per host: the site's request log and the pages it must serve
    logs: dict[str, list[LogLine]]
    expected: dict[str, set[str]]
    site_names: list[str]
    timed_out: bool
    end_time: float
    redis_window_s: float | None = None
    per_host: dict[str, FetchStats] = field(default_factory=dict)
    #: Redis CPU (s per s) in IDLE_WINDOW s before the push: the server's own housekeeping
    #: and the idle workers' waiting, which a crawl pays for every second it lasts
    redis_idle_cpu: float | None = None
    #: every command Redis ran from the push to the end, when asked for (``slowlog``):
    #: SLOWLOG entries in order, scripts' inner commands included (script_split.py), and
    #: how many the log dropped before they were read
    slowlog: list[dict[str, Any]] = field(default_factory=list)
    slowlog_lost: int = 0


def start_sites(setup: Setup, workdir: Path, stack: ExitStack) -> list[DemoSite]:
    """One demo site per address, started in parallel (each imports Twisted: ~1 s of CPU)."""
    sites = [
        DemoSite(
            pages=setup.pages // setup.hosts,
            links=LINKS,
            delay=setup.latency,
            host=host,
            fail_rate=setup.fail_rate,
            fail_times=setup.fail_times,
            log_path=workdir / ("site.log" if setup.hosts == 1 else f"site-{host}.log"),
        )
        for host in setup.addresses
    ]
    for site in sites:
        stack.callback(site.stop)
    with ThreadPoolExecutor(max_workers=len(sites)) as pool:
        list(pool.map(DemoSite.start, sites))
    return sites


def all_fetched(sites: list[DemoSite]) -> bool:
    """Every expected page answered 200 at least once (a line count first: cheap)."""
    for site in sites:
        expected = site.expected_pages()
        if count_lines(site.log_path or "") < len(expected):
            return False
        fetched = {ln.path for ln in site.read_log() if ln.status == 200}
        if not expected <= fetched:
            return False
    return True


def wait_crawl(
    workers: list[Worker], sampler: ProcSampler, sites: list[DemoSite], timeout: float, label: str
) -> bool:
    """Samples /proc until the crawl is over; True if it timed out.

    Over means: every worker exited, or every expected page is in the sites' logs (and
    ``GRACE`` seconds passed since), so that neither scrapy-redis' idle close (15 s) nor
    distcrawl's idle timeout makes the suite longer; nothing measured depends on it.
    """
    start = time.monotonic()
    next_check, next_report = start, start + PROGRESS_EVERY
    done_at: float | None = None
    while any(w.alive() for w in workers):
        now = time.monotonic()
        sampler.sample(time.time())
        if done_at is not None and now >= done_at:
            return False
        if now - start > timeout:
            print(f"    {label}: timeout after {timeout:.0f}s, stopping the workers")
            return True
        if done_at is None and now >= next_check:
            next_check = now + CHECK_EVERY
            if all_fetched(sites):
                done_at = now + GRACE
        if now >= next_report:
            next_report = now + PROGRESS_EVERY
            logged = sum(count_lines(s.log_path or "") for s in sites)
            print(f"    {label}: {now - start:5.0f}s, {logged} requests logged")
        time.sleep(POLL)
    sampler.sample(time.time())
    return False


def stop_workers(workers: list[Worker]) -> None:
    """One SIGTERM each, all at once (a second SIGTERM would force an unclean shutdown), then
    SIGKILL for any worker still there after STOP_TIMEOUT."""
    for w in workers:
        if w.alive() and w.proc is not None:
            w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for w in workers:
        if w.wait(max(deadline - time.monotonic(), 0.1)) is None:
            w.kill()


def merge_fetch(stats: list[FetchStats]) -> FetchStats:
    """The sites' FetchStats as one crawl: sums, and the earliest and latest times."""
    out = FetchStats()
    agents: dict[str, int] = {}
    statuses: dict[str, int] = {}
    for s in stats:
        out.pages += s.pages
        out.unique += s.unique
        out.expected += s.expected
        out.duplicates += s.duplicates
        out.missing += s.missing
        for name, n in s.per_agent.items():
            agents[name] = agents.get(name, 0) + n
        for name, n in s.statuses.items():
            statuses[name] = statuses.get(name, 0) + n
    fetched = [s for s in stats if s.pages]
    if fetched:
        out.first = min(s.first for s in fetched)
        out.last = max(s.last for s in fetched)
    homes = [s.first_home for s in stats if s.first_home is not None]
    anys = [s.first_any for s in stats if s.first_any is not None]
    out.first_home = min(homes) if homes else None
    out.first_any = min(anys) if anys else None
    out.per_agent = dict(sorted(agents.items()))
    out.statuses = dict(sorted(statuses.items()))
    return out


#: redis-server options that log every command in SLOWLOG (``run_user_crawl(slowlog=True)``)
SLOWLOG_ALL = ("--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000")
SLOWLOG_EVERY = 0.2


class SlowlogDrain:
    """Reads SLOWLOG every SLOWLOG_EVERY s from ``start`` (after a reset) until ``stop``,
    on a thread of its own, keeping the entries it has not seen (by id), so that none is
    lost while the log holds an interval's worth; ``stop`` returns them in the order Redis
    ran them, ``lost`` counts those the log had dropped already. Its own SLOWLOG commands
    are left out."""

    READ = 20_000

    def __init__(self, client: Any) -> None:
        self._client = client
        self._entries: list[dict[str, Any]] = []
        self._last = -1
        self.lost = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slowlog-drain", daemon=True)

    def start(self) -> None:
        self._client.slowlog_reset()
        self._thread.start()

    def _read(self) -> None:
        new = [e for e in reversed(self._client.slowlog_get(self.READ)) if e["id"] > self._last]
        if new and self._last >= 0:
            self.lost += new[0]["id"] - self._last - 1
        for entry in new:
            self._last = entry["id"]
            command = entry["command"]
            if isinstance(command, bytes):
                command = command.decode("latin-1")
            if not command.upper().startswith("SLOWLOG"):
                entry["command"] = command
                self._entries.append(entry)

    def _run(self) -> None:
        while not self._done.wait(SLOWLOG_EVERY):
            self._read()

    def stop(self) -> list[dict[str, Any]]:
        if not self._done.is_set():
            self._done.set()
            self._thread.join()
            self._read()
            self._client.close()
        return self._entries


def run_user_crawl(
    row: Row, workdir: Path, timeout: float, monitor: bool = False, slowlog: bool = False
) -> UserRun:
    """One row from scratch: fresh Redis, fresh sites, the users' settings.

    ``monitor`` records ``redis-cli monitor`` from the push to the end (the lean suite's
    protocol pass: which commands the workers sent, which their scripts ran); never for a
    timed row, as MONITOR costs Redis CPU per command. ``slowlog`` logs every command Redis
    runs, scripts' inner commands included, with its duration (script_split.py): about a µs
    an entry, so not for a timed row either."""
    began = time.monotonic()
    setup, config = row.setup, row.config
    kind = KINDS[config.kind]
    timeout = setup.timeout if setup.timeout is not None else timeout
    shutil.rmtree(workdir, ignore_errors=True)  # the sites append to their logs: start empty
    (workdir / "redis").mkdir(parents=True)
    with ExitStack() as stack:
        options = SLOWLOG_ALL if slowlog else ()
        server = stack.enter_context(RedisServer(directory=workdir / "redis", options=options))
        sites = start_sites(setup, workdir, stack)
        client = server.client()
        stack.callback(client.close)
        workers: list[Worker] = []
        stack.callback(stop_workers, workers)
        urls = [site.url + "/" for site in sites]
        workers += start_workers(
            config, server.url, sites[0].url, workdir, common=USER_SETTINGS, start_urls=urls
        )
        site_names = ["site"] if len(sites) == 1 else [f"site@{s.host}" for s in sites]
        pids = {f"worker-{w.index}": w.pid for w in workers}
        pids.update({name: s.pid for name, s in zip(site_names, sites, strict=True)})
        pids.update({"redis": server.pid, "harness": os.getpid()})
        sampler = ProcSampler({k: v for k, v in pids.items() if v is not None})
        push_time: float | None = None
        before: Snapshot | None = None
        own: Traffic | None = None
        monitor_proc = None
        idle_cpu = None
        drain: SlowlogDrain | None = None
        if kind.start_key is not None:
            wait_ready(workers, kind.ready, timeout=120)
            time.sleep(SETTLE)
            idle_from = Snapshot.take(client)
            time.sleep(IDLE_WINDOW)
            idle_cpu = (Snapshot.take(client).cpu - idle_from.cpu) / IDLE_WINDOW
            own = own_traffic(client, push=True)
            if monitor:
                monitor_proc = start_monitor(server.port or 0, workdir / "monitor.txt")
                stack.callback(stop_process, monitor_proc)
            sampler.sample(time.time())
            if slowlog:
                drain = SlowlogDrain(server.client())
                drain.start()
                stack.callback(drain.stop)
            before = Snapshot.take(client)
            push_time = time.time()
            client.lpush(kind.start_key, *urls)
        timed_out = wait_crawl(workers, sampler, sites, timeout, row.key)
        entries = drain.stop() if drain is not None else []
        end_time = time.time()
        crawl_traffic = None
        if before is not None:
            crawl_traffic = traffic(before, Snapshot.take(client), own)
        counts = None
        if monitor_proc is not None:
            stop_process(monitor_proc)
            counts = read_monitor(workdir / "monitor.txt", client)
        stop_workers(workers)
        logs = {s.host: s.read_log() for s in sites}
        expected = {s.host: s.expected_pages() for s in sites}
        per_host = {h: fetch_stats(logs[h], expected[h]) for h in logs}
        run = CrawlRun(
            config=config,
            fetch=merge_fetch(list(per_host.values())),
            push_time=push_time,
            traffic=crawl_traffic,
            sampler=sampler,
            workers=[f"worker-{w.index}" for w in workers],
            exit_codes=[w.proc.poll() if w.proc else None for w in workers],
            seen=seen_sizes(client, kind.seen_key),
            scrapy_stats=[scrapy_stats(w) for w in workers],
            monitor=counts,
        )
    run.wall = time.monotonic() - began
    return UserRun(
        row=row,
        run=run,
        logs=logs,
        expected=expected,
        site_names=site_names,
        timed_out=timed_out,
        end_time=end_time,
        redis_window_s=end_time - push_time if push_time is not None else None,
        per_host=per_host,
        redis_idle_cpu=idle_cpu,
        slowlog=entries,
        slowlog_lost=drain.lost if drain is not None else 0,
    )


# --------------------------------------------------------------------------- metrics


def slot_concurrency(log: list[LogLine], expected: set[str]) -> dict[str, Any]:
    """Requests of one slot (one site) in flight at the site, from the site's own log.

    ``max``: the site's own count when a request arrived (``in_flight``, itself included),
    over the whole crawl. ``mean``: time-weighted, over the window of the page fetches (first
    to last, as pages/s): each request counts from ``arrived`` to ``time`` (its answer), so
    the mean is the sum of those intervals inside the window divided by its length. Every
    request counts (robots.txt, PDFs, 503s), as it does against a crawler's limit.
    """
    page_times = [ln.time for ln in log if ln.path in expected and ln.status == 200]
    if not log or len(page_times) < 2:
        return {"max": max((ln.in_flight for ln in log), default=0), "mean": None}
    start, end = min(page_times), max(page_times)
    busy = sum(max(0.0, min(ln.time, end) - max(ln.arrived, start)) for ln in log)
    over = sum(1 for ln in log if ln.in_flight > SLOT_LIMIT)
    return {
        "max": max(ln.in_flight for ln in log),
        "mean": busy / max(end - start, 1e-9),
        "requests": len(log),
        "requests_arriving_over_limit": over,
        "window_s": end - start,
    }


def user_metrics(ur: UserRun) -> dict[str, Any]:
    from benchmarks.metrics import crawl_metrics

    run, row = ur.run, ur.row
    out = crawl_metrics(run)
    f = run.fetch
    out["cpu_ms_per_page"]["site"] = (
        1000 * run.sampler.cpu_between(ur.site_names, f.first, f.last) / max(f.pages, 1)
    )
    out.update(
        {
            "key": row.key,
            "setup": row.setup.key,
            "setup_label": row.setup.label,
            "config": row.config.key,
            "latency_s": row.setup.latency,
            "hosts": row.setup.hosts,
            "fail_rate": row.setup.fail_rate,
            "fail_times": row.setup.fail_times,
            "timed_out": ur.timed_out,
            "reference": row.reference,
        }
    )
    if ur.timed_out and f.pages > 1:
        # cut off: the crawl was still going (or stuck) until the timeout, count all of it
        out["crawl_seconds"] = max(ur.end_time - f.first, 1e-9)
        out["pages_per_s"] = f.pages / out["crawl_seconds"]
    slots = {h: slot_concurrency(ur.logs[h], ur.expected[h]) for h in ur.logs}
    means = [s["mean"] for s in slots.values() if s["mean"] is not None]
    out["site_concurrency"] = {
        "limit": SLOT_LIMIT,
        "max": max((s["max"] for s in slots.values()), default=0),
        "mean": sum(means) / len(means) if means else None,
        "per_slot": slots,
    }
    out["pages_per_host"] = {h: s.pages for h, s in ur.per_host.items()}
    pages = max(f.pages, 1)
    out["worker_shares"] = {agent: n / pages for agent, n in f.per_agent.items()}
    if run.traffic is not None and ur.redis_window_s:
        out["redis_cpu_cores"] = run.traffic.cpu / ur.redis_window_s
        if ur.redis_idle_cpu is not None:
            # what Redis would have spent over the crawl's window had no page come: the
            # part of its CPU per page that is the crawl's length, not its pages
            out["redis_idle_cpu_ms_per_s"] = 1000 * ur.redis_idle_cpu
            out["redis_idle_us_per_page"] = 1e6 * ur.redis_idle_cpu * ur.redis_window_s / pages
    return out


def median_row(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median pages/s (as the default suite), with every run summarised, and
    the highest concurrency any run's site saw: a limit holds in every run or not at all."""
    ordered = sorted(found, key=lambda r: r["pages_per_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["runs"] = [
        {
            "pages_per_s": r["pages_per_s"],
            "missing": r["missing"],
            "site_concurrency_max": r["site_concurrency"]["max"],
            "worker_shares": r["worker_shares"],
            "redis_cpu_ms_per_page": _redis_cpu(r),
            "cpu_ms_per_page": r["cpu_ms_per_page"]["workers"],
            "background_cpu_cores": r["background_cpu_cores"],
        }
        for r in found
    ]
    chosen["site_concurrency_max_all_runs"] = max(r["site_concurrency"]["max"] for r in found)
    return chosen


def _redis_cpu(row: dict[str, Any]) -> float | None:
    redis = row.get("redis")
    return None if redis is None else float(redis["per_page"]["redis_cpu_ms"])


# --------------------------------------------------------------------------- report


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _mean(value: float | None) -> str:
    """Site-seen concurrency: below 1 (0 ms), two decimals say more than 0.0."""
    return num(value, ".2f" if value is not None and value < 1 else ".1f")


def _shares(row: dict[str, Any]) -> str:
    shares = row["worker_shares"]
    if not shares:
        return "-"
    return "/".join(f"{100 * shares[a]:.0f}" for a in sorted(shares))


def users_table(results: dict[str, Any]) -> str:
    rows: dict[str, dict[str, Any]] = results["configurations"]

    def ref(row: dict[str, Any]) -> str:
        other = rows.get(row["reference"])
        base = None if other is None else float(other["pages_per_s"])
        return num(_ratio(row["pages_per_s"], base), ".2f")

    def redis_vs(row: dict[str, Any]) -> str:
        if row["kind"] != "distcrawl":
            return "-"
        other = rows.get(f"{row['setup']}/scrapy-redis-{row['workers']}")
        base = None if other is None else _redis_cpu(other)
        return num(_ratio(_redis_cpu(row), base), ".2f")

    def conc(row: dict[str, Any]) -> str:
        c = row["site_concurrency"]
        return f"{c['max']} / {_mean(c['mean'])}"

    def pages(row: dict[str, Any]) -> str:
        mark = "*" if row["timed_out"] else ""
        return f"{row['unique_pages']}/{row['expected_pages']}{mark}"

    columns: list[Column] = [
        ("setup", 24, lambda r: r["setup_label"]),
        ("configuration", 23, lambda r: r["label"]),
        ("pages", 10, pages),
        ("pages/s", 7, lambda r: num(r["pages_per_s"], ".1f")),
        ("x ref", 5, ref),
        ("site max/mean", 13, conc),
        ("shares %", 8, _shares),
        ("Redis CPU ms/pg", 15, lambda r: num(_redis_cpu(r), ".3f")),
        ("x s-r", 5, redis_vs),
        ("dup", 4, lambda r: str(r["duplicates"])),
        ("CPU ms/pg", 9, lambda r: num(r["cpu_ms_per_page"]["workers"], ".2f")),
        ("other CPU", 9, lambda r: num(r.get("background_cpu_cores"), ".2f")),
    ]
    return render(columns, rows.values())


TABLE_NOTES = """\
pages: distinct pages fetched / expected (* cut off at the timeout). x ref: pages/s over
plain Scrapy's in the same setup; for the 503 rows, over the same crawler without failures.
site max/mean: requests of one slot (host) in flight at the site, from its own log (max over
the slots and the crawl; time-weighted mean over each slot's fetch window, averaged over the
slots); limit per slot {limit}. At 0 ms the single-threaded site answers each request before
reading the next, so it never sees more than one in flight. shares %: each worker's share of
the pages, from its User-Agent. Redis CPU: INFO used_cpu_user+used_cpu_sys delta per page;
x s-r: distcrawl's over scrapy-redis' with as many workers in the same setup. CPU ms/pg: the
workers' CPU per page; other CPU: CPUs used by other processes meanwhile."""


def users_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 14's targets, each on the row(s) it names."""
    from benchmarks.report import _target

    rows: dict[str, dict[str, Any]] = results["configurations"]

    def pps(key: str) -> float | None:
        row = rows.get(key)
        return None if row is None else float(row["pages_per_s"])

    out = []
    for ms in ("0ms", "100ms"):
        r = _ratio(pps(f"{ms}-1host/distcrawl-1"), pps(f"{ms}-1host/scrapy"))
        out.append(_target(f"1 worker vs plain Scrapy, {ms}, 1 host", r, ">= 0.95x", 0.95, "x"))
    for ms, goal in (("0ms", 1.5), ("100ms", 1.2)):
        r = _ratio(pps(f"{ms}-1host/distcrawl-1"), pps(f"{ms}-1host/scrapy-redis-1"))
        out.append(
            _target(f"1 worker vs scrapy-redis 1, {ms}, 1 host", r, f">= {goal}x", goal, "x")
        )
    r = _ratio(pps("100ms-8hosts/distcrawl-2"), pps("100ms-8hosts/distcrawl-1"))
    out.append(_target("2 workers vs 1, 100ms, 8 hosts", r, ">= 1.7x", 1.7, "x"))
    ours = [row for row in rows.values() if row["kind"] == "distcrawl"]
    seen = [row["site_concurrency_max_all_runs"] for row in ours]
    out.append(
        _target(
            "site-seen slot concurrency (distcrawl, max)",
            max(seen) if seen else None,
            f"<= {SLOT_LIMIT}",
            SLOT_LIMIT,
            note="every distcrawl run of every round",
        )
    )
    row = rows.get("100ms-1host/distcrawl-2")
    low = min(row["worker_shares"].values(), default=None) if row else None
    out.append(
        _target("smaller share of 2 workers, 100ms, 1 host", low, ">= 0.4", 0.4, note="0.4-0.6")
    )
    r = _ratio(pps("20ms-503/distcrawl-1"), pps("20ms-1host/distcrawl-1"))
    out.append(_target("sporadic 503s vs failure-free", r, ">= 0.5x", 0.5, "x"))
    failing = rows.get("20ms-503/distcrawl-1")
    missing = None if failing is None else float(failing["missing"])
    out.append(_target("sporadic 503s: pages never crawled", missing, "0", 0))
    return out


def run_suite(args: Any, workdir: Path) -> dict[str, Any]:
    """Every selected row ``--repeat`` times, in rounds (like the default suite)."""
    selected = [r for r in rows(args.pages, args.fail_timeout) if r.selected(args.only)]
    if not selected:
        raise SystemExit(f"benchmarks: --only {' '.join(args.only)} selects no row")
    runs: dict[str, list[dict[str, Any]]] = {r.key: [] for r in selected}
    for round_no in range(1, args.repeat + 1):
        for row in selected:
            suffix = f" (round {round_no} of {args.repeat})" if args.repeat > 1 else ""
            setup = row.setup
            print(f"Crawl: {setup.label}, {row.config.label}, {setup.pages} pages{suffix} ...")
            name = row.key.replace("/", "-") + (f"-{round_no}" if args.repeat > 1 else "")
            metrics = user_metrics(run_user_crawl(row, workdir / name, args.timeout))
            runs[row.key].append(metrics)
            print_user_run(metrics)
    return {key: median_row(found) for key, found in runs.items()}


def print_user_run(row: dict[str, Any]) -> None:
    conc = row["site_concurrency"]
    cut = " (cut off at the timeout)" if row["timed_out"] else ""
    print(
        f"  {row['unique_pages']} of {row['expected_pages']} pages{cut} in "
        f"{row['crawl_seconds']:.1f}s = {row['pages_per_s']:.1f}/s, {row['duplicates']} "
        f"duplicates; site saw {conc['max']} max / {_mean(conc['mean'])} mean in flight; "
        f"shares {_shares(row)}; Redis CPU {num(_redis_cpu(row), '.3f')} ms/page "
        f"({row['wall_seconds']:.0f}s with start-up and close; other load "
        f"{row['background_cpu_cores']:.2f} CPUs)"
    )


def print_users_report(results: dict[str, Any]) -> None:
    from benchmarks.report import load_warning, targets_table

    meta = results["meta"]
    print()
    print(
        f"Crawls as users run them: distcrawl/settings.py (CONCURRENT_REQUESTS = "
        f"CONCURRENT_REQUESTS_PER_DOMAIN = {SLOT_LIMIT}), DemoSite(links={LINKS}), "
        f"{meta['cpus']} CPUs, medians of {meta['repeat']} round(s)"
    )
    print(users_table(results))
    print(TABLE_NOTES.format(limit=SLOT_LIMIT))
    warning = load_warning(results)
    if warning:
        print(warning)
    print("\nTargets of issue 14")
    print(targets_table(results["targets"]))
