"""``python -m benchmarks.profile``: where a worker's CPU goes, per page, with py-spy.

Runs one worker of the chosen crawler on a fresh site and Redis, attaches ``py-spy record``
to it once it is up (a sampling profiler outside the process: no tracing overhead distorts
the Redis thread or the reactor, and start-up is not profiled), then attributes every sample:

- ``frontier``: any stack through distcrawl's own machinery (scheduler, frontier, codec,
  dupefilter, Redis thread), or through its counterparts in plain Scrapy (scheduler,
  priority queues, dupefilter) and scrapy-redis, broken down by the innermost such function;
- ``spider``: the ``site`` spider's parsing, the same code in every configuration;
- otherwise the library the sampled function belongs to (scrapy, twisted, lxml, ...).

Sample shares are converted to CPU milliseconds per page (the worker's CPU time from /proc
over the crawl, divided by the pages fetched), so that profiles of different crawlers
(``--kind scrapy`` for plain Scrapy) can be compared line by line. The collapsed stacks are
kept (``benchmarks/results/profile-<kind>.txt``) and open in speedscope.app as they are.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.crawl import Attach, Config, run_crawl
from benchmarks.metrics import crawl_metrics
from distcrawl.testing.workers import Worker

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ATTACH_DELAY = 0.5
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
_SPIDER_FILES = ("distcrawl/spiders/site.py", "benchmarks/spiders.py")
_NOT_MACHINERY = ("distcrawl/spiders/", "distcrawl/items.py", "distcrawl/demo/")
#: plain Scrapy's and scrapy-redis' counterparts of distcrawl's machinery
_FRONTIER_FILES = (
    "scrapy/core/scheduler.py",
    "scrapy/pqueues.py",
    "scrapy/squeues.py",
    "scrapy/dupefilters.py",
    "scrapy_redis/",
)
_LIBRARIES = (
    "scrapy_redis",
    "scrapy",
    "twisted",
    "parsel",
    "lxml",
    "w3lib",
    "redis",
    "msgpack",
    "hiredis",
    "urllib",
    "tldextract",
    "itemadapter",
    "protego",
    "logging",
    "asyncio",
)


def split_frame(frame: str) -> tuple[str, str]:
    """``func (path/file.py:123)`` -> (func, path/file.py)."""
    match = _FRAME.match(frame)
    return (match.group("func"), match.group("file")) if match else (frame, "")


def parse_collapsed(text: str) -> list[tuple[list[str], int]]:
    """py-spy's ``--format raw`` (Brendan Gregg's collapsed stacks), root frame first."""
    out = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out.append((stack.split(";"), int(count)))
    return out


def is_frontier(path: str) -> bool:
    """distcrawl's scheduler, frontier, codec and dupefilter, or their counterparts."""
    if "distcrawl/" in path:
        return not any(part in path for part in _NOT_MACHINERY)
    return any(part in path for part in _FRONTIER_FILES)


def library(path: str) -> str:
    for name in _LIBRARIES:
        if f"/{name}/" in path or path.startswith(f"{name}/"):
            return name
    return "python/other"


def category(stack: list[str]) -> tuple[str, str]:
    """(category, detail) of one sample; see the module docstring for the rules."""
    frames = [split_frame(f) for f in stack]
    inner = [(func, path) for func, path in frames if is_frontier(path)]
    if inner:
        func, path = inner[-1]
        return "frontier", f"{path.split('/')[0]}/{Path(path).stem}.{func}"
    if any(path.endswith(_SPIDER_FILES) for _, path in frames):
        return "spider", ""
    func, path = frames[-1]
    return library(path), ""


def summarize(stacks: list[tuple[list[str], int]], cpu_ms_per_page: float) -> dict[str, Any]:
    """CPU ms per page by category, by frontier function and by leaf function.

    py-spy samples on a wall clock: a worker preempted by other load while holding the GIL
    still yields samples. So samples only give *shares*, and the shares are scaled by the
    worker's real CPU per page (utime + stime from /proc over the crawl window).
    """
    categories: Counter[str] = Counter()
    machinery: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for stack, count in stacks:
        cat, detail = category(stack)
        categories[cat] += count
        if detail:
            machinery[detail] += count
        func, path = split_frame(stack[-1])
        leaves[f"{func} ({path})"] += count
    total = sum(categories.values())
    per_sample = cpu_ms_per_page / max(total, 1)

    def scale(counter: Counter[str], n: int) -> dict[str, float]:
        return {k: round(v * per_sample, 3) for k, v in counter.most_common(n)}

    return {
        "samples": total,
        "cpu_ms_per_page": round(cpu_ms_per_page, 3),
        "frontier_share": categories["frontier"] / max(total, 1),
        "by_category": scale(categories, 20),
        "frontier_functions": scale(machinery, 25),
        "top_leaf_functions": scale(leaves, 25),
    }


def py_spy(raw: Path, rate: int) -> Attach:
    """Attaches py-spy to the first worker once it is idle, so start-up is not profiled.

    ``--gil`` keeps only samples of the thread holding the GIL, i.e. Python CPU time: a
    thread waiting on a lock or a socket is not work. ``--nonblocking`` does not pause the
    worker to sample it, so the crawl runs at nearly its normal speed.
    """
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))

    def attach(workers: list[Worker]) -> list[subprocess.Popen[bytes]]:
        cmd = [spy, "record", "--pid", str(workers[0].pid), "--gil", "--nonblocking"]
        cmd += ["--rate", str(rate), "--format", "raw", "-o", str(raw)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(ATTACH_DELAY)
        return [proc]

    return attach


def profile(kind: str, pages: int, rate: int, timeout: float) -> dict[str, Any]:
    """One worker of ``kind`` under py-spy on a fresh site; returns the summary."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = RESULTS / f"profile-{kind}.txt"
    raw.unlink(missing_ok=True)
    config = Config(f"profile-{kind}", kind, 1)
    run = run_crawl(config, pages, RESULTS / "run" / config.key, timeout, attach=py_spy(raw, rate))
    cpu = crawl_metrics(run)["cpu_ms_per_page"]["workers"]
    summary = summarize(parse_collapsed(raw.read_text()), cpu)
    summary.update(kind=kind, pages=run.fetch.pages, pages_per_s=run.fetch.pages_per_s)
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    print(
        f"\n{summary['kind']}: {summary['pages']} pages, {summary['cpu_ms_per_page']:.2f} worker "
        f"CPU ms/page, {summary['frontier_share']:.1%} of it in the frontier "
        f"({summary['samples']} samples, {summary['pages_per_s']:.1f} pages/s under the profiler)"
    )
    for title, key in (
        ("by category", "by_category"),
        ("frontier (scheduler, queue, dupefilter, Redis)", "frontier_functions"),
        ("top leaf functions", "top_leaf_functions"),
    ):
        if summary[key]:
            print(f"  {title} (CPU ms/page):")
            for name, value in list(summary[key].items())[:15]:
                print(f"    {value:7.3f}  {name}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    p.add_argument(
        "--kind",
        choices=["distcrawl", "scrapy", "scrapy-redis"],
        nargs="+",
        default=["distcrawl", "scrapy"],
    )
    p.add_argument("--pages", type=int, default=3000)
    p.add_argument("--rate", type=int, default=200, help="samples per second")
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args(argv)
    summaries = {kind: profile(kind, args.pages, args.rate, args.timeout) for kind in args.kind}
    for summary in summaries.values():
        print_summary(summary)
    out = RESULTS / "profile.json"
    out.write_text(json.dumps(summaries, indent=2) + "\n")
    print(f"\nJSON: {out}; collapsed stacks: {RESULTS}/profile-<kind>.txt (speedscope.app)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
