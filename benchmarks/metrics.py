"""Turns the raw material of one crawl into the numbers of the table and of the JSON.

Everything is normalised per page fetched (HTML pages with status 200 in the site's log),
and CPU is counted between the first and the last page fetch, so that start-up, the idle wait
before closing and shutdown weigh the same for every crawler: not at all.
"""

from __future__ import annotations

from typing import Any

from benchmarks.crawl import CrawlRun
from benchmarks.redisstats import MonitorCounts


def _cpu_ms_per_page(run: CrawlRun, names: list[str]) -> float:
    f = run.fetch
    seconds = run.sampler.cpu_between(names, f.first, f.last)
    return 1000 * seconds / max(f.pages, 1)


def _push_delay(run: CrawlRun, when: float | None) -> float | None:
    if run.push_time is None or when is None:
        return None
    return when - run.push_time


def crawl_metrics(run: CrawlRun) -> dict[str, Any]:
    """All metrics of one crawl; see README "Benchmarks" for how each one is measured."""
    f = run.fetch
    out: dict[str, Any] = {
        "label": run.config.label,
        "kind": run.config.kind,
        "workers": run.config.workers,
        "pages": f.pages,
        "unique_pages": f.unique,
        "expected_pages": f.expected,
        "duplicates": f.duplicates,
        "missing": f.missing,
        "crawl_seconds": f.seconds,
        "pages_per_s": f.pages_per_s,
        "pages_per_worker": f.per_agent,
        "site_statuses": f.statuses,
        "push_to_first_fetch_s": _push_delay(run, f.first_home),
        "push_to_first_request_s": _push_delay(run, f.first_any),
        "peak_rss_mib": {name: run.sampler.peak_mib(name) for name in run.workers},
        "cpu_ms_per_page": {
            "workers": _cpu_ms_per_page(run, run.workers),
            "site": _cpu_ms_per_page(run, ["site"]),
            "redis": _cpu_ms_per_page(run, ["redis"]) if run.traffic else 0.0,
        },
        "background_cpu_cores": run.sampler.background_cores(f.first, f.last),
        "exit_codes": run.exit_codes,
        "scrapy_stats": run.scrapy_stats,
        "wall_seconds": run.wall,
    }
    out["peak_rss_mib_max"] = max(out["peak_rss_mib"].values(), default=0.0)
    worker_ms = out["cpu_ms_per_page"]["workers"]
    out["pages_per_cpu_s"] = 1000 / worker_ms if worker_ms else None
    if run.traffic is not None:
        out["redis"] = {
            "per_page": run.traffic.per_page(f.pages),
            "totals": {
                "commands": run.traffic.commands,
                "round_trips": run.traffic.reads,
                "scripts": run.traffic.scripts,
                "net_in_bytes": run.traffic.net_in,
            },
            "commandstats_calls": run.traffic.calls,
            "commandstats_usec": run.traffic.usec,
        }
    if run.seen:
        out["seen_set"] = {**run.seen, "bytes_per_url": run.seen["bytes"] / run.seen["members"]}
    return out


def monitor_metrics(run: CrawlRun, counts: MonitorCounts) -> dict[str, Any]:
    """Client-sent vs script-run commands per page, from MONITOR; round trips from INFO."""
    pages = max(run.fetch.pages, 1)
    sent = sum(counts.client.values())
    in_scripts = sum(counts.script.values())
    out: dict[str, Any] = {
        "label": run.config.label,
        "pages": run.fetch.pages,
        "client_commands_per_page": sent / pages,
        "script_commands_per_page": in_scripts / pages,
        "client_commands": dict(counts.client.most_common()),
        "script_commands": dict(counts.script.most_common()),
    }
    if run.traffic is not None:
        out["round_trips_per_page"] = run.traffic.reads / pages
        out["executed_commands_per_page"] = run.traffic.commands / pages
    return out
