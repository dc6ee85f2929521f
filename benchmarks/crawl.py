"""One configuration, one crawl: fresh Redis, fresh demo site, real ``scrapy crawl`` workers.

Every configuration gets its own redis-server and site process (same pages, links and seed),
so no counter, log line, cache or half-closed connection leaks from one crawl into the next.
The workers are the same subprocesses the tests and the quick start use
(:class:`distcrawl.testing.workers.Worker`, one User-Agent each); only their settings differ.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks.procs import ProcSampler
from benchmarks.redisstats import (
    MonitorCounts,
    Snapshot,
    Traffic,
    own_traffic,
    parse_monitor,
    traffic,
)
from benchmarks.sitelog import FetchStats, count_lines, fetch_stats
from benchmarks.spiders import SPIDER_NAME
from distcrawl.demo.site import DemoSite
from distcrawl.testing.redis_server import RedisServer
from distcrawl.testing.workers import Worker

Attach = Callable[[list[Worker]], list[subprocess.Popen[bytes]]]
LINKS = 17
SETTLE = 1.0  # seconds between "worker ready" and the push: the workers are idle by then
POLL = 0.1
PROGRESS_EVERY = 10.0
#: scrapy-redis' MAX_IDLE_TIME_BEFORE_CLOSE counts from when the spider class was imported, or
#: from the last heartbeat that saw start_urls non-empty; 15 s covers start-up, the settle time
#: and a 5 s heartbeat, so that a second worker never closes before the crawl reaches it
SCRAPY_REDIS_IDLE_CLOSE = 15

COMMON_SETTINGS: dict[str, Any] = {
    "ROBOTSTXT_OBEY": True,
    "CONCURRENT_REQUESTS": 16,
    # the one benchmark site stands for many sites: per-domain limits must not be what is
    # measured (distcrawl's hold for the whole cluster, the others' per process)
    "CONCURRENT_REQUESTS_PER_DOMAIN": 64,
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
}


@dataclass(frozen=True)
class Kind:
    """How to run one crawler: spider, settings, where to push, what "ready" looks like."""

    spider: str
    settings: dict[str, Any]
    start_key: str | None
    ready: str
    seen_key: str | None


KINDS: dict[str, Kind] = {
    "scrapy": Kind(
        spider="site",
        settings={
            "ADDONS": "{}",
            "SCHEDULER": "scrapy.core.scheduler.Scheduler",
            "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
        },
        start_key=None,
        ready="",
        seen_key=None,
    ),
    "scrapy-redis": Kind(
        spider=SPIDER_NAME,
        settings={
            "ADDONS": "{}",
            "SPIDER_MODULES": "benchmarks.spiders",
            "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
            "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
            "SCHEDULER_PERSIST": True,
            "MAX_IDLE_TIME_BEFORE_CLOSE": SCRAPY_REDIS_IDLE_CLOSE,
        },
        start_key=f"{SPIDER_NAME}:start_urls",
        ready="Spider opened",
        seen_key=f"{SPIDER_NAME}:dupefilter",
    ),
    "distcrawl": Kind(
        spider="site",
        settings={"DISTCRAWL_IDLE_TIMEOUT": 1},
        start_key="site:start_urls",
        ready="Frontier: ",
        seen_key="site:seen",
    ),
}


@dataclass(frozen=True)
class Config:
    key: str
    kind: str
    workers: int
    #: settings this configuration adds to its kind's (a feature turned on)
    settings: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        noun = "process" if self.kind == "scrapy" else "worker" + ("s" if self.workers > 1 else "")
        extra = "".join(f", {name}={value}" for name, value in self.settings)
        return f"{self.kind}, {self.workers} {noun}{extra}"


#: in this order every pair that a target compares runs back to back, so that a change in the
#: machine's other load during the suite skews a comparison as little as possible
CONFIGS = [
    Config("scrapy", "scrapy", 1),
    Config("distcrawl-1", "distcrawl", 1),
    Config("scrapy-redis-1", "scrapy-redis", 1),
    Config("scrapy-redis-2", "scrapy-redis", 2),
    Config("distcrawl-2", "distcrawl", 2),
]


class BenchWorker(Worker):
    """A demo worker that can also take spider arguments (``-a``), for plain Scrapy."""

    def __init__(self, *args: Any, spider_args: dict[str, str] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.spider_args = dict(spider_args or {})

    def command(self) -> list[str]:
        cmd = super().command()
        for key, value in self.spider_args.items():
            cmd += ["-a", f"{key}={value}"]
        return cmd


@dataclass
class CrawlRun:
    """Raw material of one crawl, turned into metrics by :func:`metrics`."""

    config: Config
    fetch: FetchStats
    push_time: float | None
    traffic: Traffic | None
    sampler: ProcSampler
    workers: list[str]
    exit_codes: list[int | None]
    seen: dict[str, int] = field(default_factory=dict)
    scrapy_stats: list[dict[str, int]] = field(default_factory=list)
    monitor: MonitorCounts | None = None
    wall: float = 0.0


def start_workers(
    config: Config,
    redis_url: str,
    site_url: str,
    logdir: Path,
    *,
    common: dict[str, Any] | None = None,
    start_urls: list[str] | None = None,
) -> list[Worker]:
    """``common`` replaces COMMON_SETTINGS (the users suite runs the project's own settings);
    ``start_urls`` replaces ``[site_url + "/"]`` for plain Scrapy, which takes them as a
    spider argument instead of from Redis."""
    kind = KINDS[config.kind]
    urls = start_urls if start_urls is not None else [site_url + "/"]
    spider_args = {"start_urls": ",".join(urls)} if kind.start_key is None else {}
    settings = {
        **(COMMON_SETTINGS if common is None else common),
        **kind.settings,
        **dict(config.settings),
    }
    return [
        BenchWorker(
            i,
            redis_url=redis_url,
            log_path=logdir / f"worker-{i}.log",
            spider=kind.spider,
            settings=settings,
            spider_args=spider_args,
        ).start()
        for i in range(1, config.workers + 1)
    ]


def wait_ready(workers: list[Worker], text: str, timeout: float) -> None:
    for w in workers:
        if not w.wait_for_log(text, timeout=timeout):
            raise RuntimeError(f"worker {w.index} not ready; see {w.log_path}")


def wait_done(
    workers: list[Worker], sampler: ProcSampler, site_log: str, timeout: float, label: str
) -> None:
    """Sample /proc until every worker has exited on its own (bounded by ``timeout``)."""
    start = time.monotonic()
    next_report = start + PROGRESS_EVERY
    while any(w.alive() for w in workers):
        now = time.monotonic()
        sampler.sample(time.time())
        if now - start > timeout:
            print(f"    {label}: timeout after {timeout:.0f}s, stopping the workers")
            return
        if now >= next_report:
            next_report = now + PROGRESS_EVERY
            print(f"    {label}: {now - start:5.0f}s, {count_lines(site_log)} requests logged")
        time.sleep(POLL)
    sampler.sample(time.time())


def seen_sizes(client: redis.Redis, key: str | None) -> dict[str, int]:
    """Exact bytes (``SAMPLES 0``) and members of the seen-set the crawl left behind."""
    if key is None or not client.exists(key):
        return {}
    return {
        "bytes": int(client.memory_usage(key, samples=0) or 0),
        "members": int(client.scard(key)),
    }


_STAT = re.compile(r"'(item_scraped_count|memusage/max|response_received_count)': (\d+)")


def scrapy_stats(worker: Worker) -> dict[str, int]:
    """A few of Scrapy's own final stats, as a cross-check of the ground truth."""
    return {key: int(value) for key, value in _STAT.findall(worker.log())}


def start_monitor(port: int, path: Path) -> subprocess.Popen[bytes]:
    """``redis-cli monitor`` into a file: C, so parsing costs nothing during the crawl."""
    out = path.open("wb")
    proc = subprocess.Popen(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "monitor"],
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    time.sleep(0.2)
    return proc


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@dataclass
class _Crawl:
    """The services and processes of one crawl, handed between the steps of run_crawl."""

    config: Config
    kind: Kind
    workdir: Path
    server: RedisServer
    site: DemoSite
    client: redis.Redis
    workers: list[Worker]
    sampler: ProcSampler
    push_time: float | None = None
    traffic: Traffic | None = None
    monitor: MonitorCounts | None = None


def _sampler(workers: list[Worker], site: DemoSite, server: RedisServer) -> ProcSampler:
    pids = {f"worker-{w.index}": w.pid for w in workers}
    pids.update({"site": site.pid, "redis": server.pid, "harness": os.getpid()})
    return ProcSampler({k: v for k, v in pids.items() if v is not None})


def _prepare(crawl: _Crawl, attach: Attach | None) -> list[subprocess.Popen[bytes]]:
    """Waits until the workers are up and idle, then lets ``attach`` start its helpers."""
    if crawl.kind.start_key is not None:
        wait_ready(crawl.workers, crawl.kind.ready, timeout=120)
        time.sleep(SETTLE)
    elif attach is not None:
        wait_ready(crawl.workers, "Spider opened", timeout=120)
    return attach(crawl.workers) if attach is not None else []


def _push_and_wait(crawl: _Crawl, timeout: float, monitor: bool) -> None:
    """The measured window: Redis counters around the push and the whole crawl."""
    site_log = str(crawl.site.log_path)
    if crawl.kind.start_key is None:
        wait_done(crawl.workers, crawl.sampler, site_log, timeout, crawl.config.key)
        return
    own = own_traffic(crawl.client, push=True)
    monitor_file = crawl.workdir / "monitor.txt"
    monitor_proc = start_monitor(crawl.server.port or 0, monitor_file) if monitor else None
    try:
        crawl.sampler.sample(time.time())
        before = Snapshot.take(crawl.client)
        crawl.push_time = time.time()
        crawl.client.lpush(crawl.kind.start_key, crawl.site.url + "/")
        wait_done(crawl.workers, crawl.sampler, site_log, timeout, crawl.config.key)
        after = Snapshot.take(crawl.client)
    finally:
        if monitor_proc is not None:
            stop_process(monitor_proc)
    crawl.traffic = traffic(before, after, own)
    if monitor:
        crawl.monitor = read_monitor(monitor_file, crawl.client)


def _collect(crawl: _Crawl) -> CrawlRun:
    return CrawlRun(
        config=crawl.config,
        fetch=fetch_stats(crawl.site.read_log(), crawl.site.expected_pages()),
        push_time=crawl.push_time,
        traffic=crawl.traffic,
        sampler=crawl.sampler,
        workers=[f"worker-{w.index}" for w in crawl.workers],
        exit_codes=[w.proc.poll() if w.proc else None for w in crawl.workers],
        seen=seen_sizes(crawl.client, crawl.kind.seen_key),
        scrapy_stats=[scrapy_stats(w) for w in crawl.workers],
        monitor=crawl.monitor,
    )


def _stop_all(procs: list[subprocess.Popen[bytes]], workers: list[Worker]) -> None:
    for w in workers:
        w.stop()
    for proc in procs:
        try:
            proc.wait(30)  # a profiler writes its output once its target has exited
        except subprocess.TimeoutExpired:
            stop_process(proc)


def run_crawl(
    config: Config,
    pages: int,
    workdir: Path,
    timeout: float,
    monitor: bool = False,
    attach: Attach | None = None,
) -> CrawlRun:
    """Runs one configuration from scratch and returns what the site, Redis and /proc saw.

    ``monitor`` records ``redis-cli monitor`` during the crawl; ``attach`` is called with the
    ready workers just before the push (a profiler attaching to them) and returns the
    processes it started, which must end on their own when the workers do.
    """
    began = time.monotonic()
    shutil.rmtree(workdir, ignore_errors=True)  # the site appends to its log: start empty
    (workdir / "redis").mkdir(parents=True)
    with ExitStack() as stack:
        server = stack.enter_context(RedisServer(directory=workdir / "redis"))
        site = stack.enter_context(
            DemoSite(pages=pages, links=LINKS, log_path=workdir / "site.log")
        )
        client = server.client()
        stack.callback(client.close)
        workers: list[Worker] = []
        helpers: list[subprocess.Popen[bytes]] = []
        stack.callback(_stop_all, helpers, workers)
        workers += start_workers(config, server.url, site.url, workdir)
        crawl = _Crawl(
            config,
            KINDS[config.kind],
            workdir,
            server,
            site,
            client,
            workers,
            _sampler(workers, site, server),
        )
        helpers += _prepare(crawl, attach)
        _push_and_wait(crawl, timeout, monitor)
        _stop_all(helpers, [])
        run = _collect(crawl)
        run.wall = time.monotonic() - began
        return run


def read_monitor(path: Path, client: redis.Redis) -> MonitorCounts:
    own = client.client_info().get("addr")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return parse_monitor(lines, exclude_addr=str(own) if own else None)
