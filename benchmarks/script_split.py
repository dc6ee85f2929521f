"""``python -m benchmarks.script_split``: what each frontier script costs inside a real crawl.

``INFO commandstats`` counts every script as one ``evalsha`` line, so a crawl's Redis CPU
cannot be put to commit.lua, lease.lua or places.lua from it. This crawls the lean suite's
distcrawl rows (users' settings, fresh Redis and site each) with every command logged in
``SLOWLOG`` (``run_user_crawl(slowlog=True)``), then puts each logged command to the script
that ran it: a script runs atomically, so its inner commands are the entries logged just
before it, under the scripts' own client (address ``?:0``, which tells them from the plain
commands of the workers). For each script it reports calls a page, µs a call (the script's
whole duration), the part of it its inner commands' own code took, and inner commands a
call, with the commands that cost most.

Logging every command costs Redis about a µs an entry and the drain reads the log every
0.2 s, so the rows are slower than the lean suite's timed ones: compare scripts with each
other and builds with each other here, and take Redis CPU a page from ``--suite lean``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.lean import FOUR, crawl_rows
from benchmarks.table import Column, num, render
from distcrawl.model.lua import NAMES, SEEN_MODES, script_source

SCRIPT_COMMANDS = ("EVALSHA", "EVAL", "FCALL")
#: the client address SLOWLOG gives the commands a script runs (Redis 7's Lua client)
SCRIPT_CLIENT = "?:0"


def script_names() -> dict[str, str]:
    """SHA1 -> script name, for every script with every seen-set it can carry."""
    names = {}
    for name in NAMES:
        for seen in SEEN_MODES:
            source = script_source(name, seen)
            names[hashlib.sha1(source.encode("utf-8")).hexdigest()] = name
    return names


@dataclass
class ScriptCost:
    calls: int = 0
    micros: int = 0
    #: the inner commands run, and their µs, per command name
    inner: Counter[str] = field(default_factory=Counter)
    inner_time: Counter[str] = field(default_factory=Counter)

    @property
    def inner_calls(self) -> int:
        return sum(self.inner.values())

    @property
    def inner_micros(self) -> int:
        return sum(self.inner_time.values())


def _client(entry: dict[str, Any]) -> str:
    address = entry.get("client_address", "")
    return address.decode("latin-1") if isinstance(address, bytes) else str(address)


def split(entries: list[dict[str, Any]], names: dict[str, str]) -> dict[str, ScriptCost]:
    """Each script's calls and the inner commands logged just before each (see the module
    docstring); the workers' plain commands go under ``(plain)``."""
    costs: dict[str, ScriptCost] = defaultdict(ScriptCost)
    inner: list[dict[str, Any]] = []
    for entry in entries:
        words = str(entry["command"]).split(" ", 2)
        command = words[0].upper()
        if command in SCRIPT_COMMANDS:
            name = names.get(words[1], words[1][:8]) if len(words) > 1 else command
            cost = costs[name]
            for e in inner:
                verb = str(e["command"]).split(" ", 1)[0].upper()
                cost.inner[verb] += 1
                cost.inner_time[verb] += int(e["duration"])
            inner = []
        elif _client(entry) == SCRIPT_CLIENT:
            inner.append(entry)  # a script's: it is logged after them
            continue
        else:
            cost = costs["(plain)"]
        cost.calls += 1
        cost.micros += int(entry["duration"])
    return dict(costs)


def report(key: str, pages: int, costs: dict[str, ScriptCost]) -> list[dict[str, Any]]:
    out = []
    for name, c in sorted(costs.items(), key=lambda item: -item[1].micros):
        calls = max(c.calls, 1)
        top = ", ".join(
            f"{verb} {c.inner[verb] / calls:.1f} ({c.inner_time[verb] / c.inner[verb]:.1f} µs)"
            for verb, _ in c.inner_time.most_common(4)
        )
        out.append(
            {
                "row": key,
                "script": name,
                "calls_per_page": c.calls / max(pages, 1),
                "us_per_page": c.micros / max(pages, 1),
                "us_per_call": c.micros / calls,
                "inner_us_per_call": c.inner_micros / calls,
                "inner_calls_per_call": c.inner_calls / calls,
                "top_inner": top,
            }
        )
    return out


COLUMNS: list[Column] = [
    ("row", 24, lambda r: r["row"]),
    ("script", 10, lambda r: r["script"]),
    ("calls/pg", 8, lambda r: num(r["calls_per_page"], ".3f")),
    ("µs/pg", 6, lambda r: num(r["us_per_page"], ".1f")),
    ("µs/call", 7, lambda r: num(r["us_per_call"], ".0f")),
    ("inner µs", 8, lambda r: num(r["inner_us_per_call"], ".0f")),
    ("inner/call", 10, lambda r: num(r["inner_calls_per_call"], ".1f")),
    ("costliest inner commands a call (µs each)", 40, lambda r: r["top_inner"]),
]


def main(argv: list[str] | None = None) -> int:
    from benchmarks.users import run_user_crawl

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", default=list(FOUR), help="lean rows (default: the four)")
    p.add_argument("--pages", type=int, default=3000)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--output", type=Path, default=Path("benchmarks/results/script-split.json"))
    args = p.parse_args(argv)
    names = script_names()
    workdir = args.output.parent / "run-script-split"
    results: list[dict[str, Any]] = []
    for row in crawl_rows("full", args.pages):
        if row.config.kind != "distcrawl" or not row.selected(args.only):
            continue
        print(f"Crawl: {row.setup.label}, {row.config.label}, {row.setup.pages} pages, SLOWLOG on")
        run = run_user_crawl(row, workdir / row.key.replace("/", "-"), args.timeout, slowlog=True)
        pages = run.run.fetch.pages
        results += report(row.key, pages, split(run.slowlog, names))
        print(f"  {pages} pages, {len(run.slowlog)} commands logged, {run.slowlog_lost} lost")
    print(render(COLUMNS, results, group="row"))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"JSON: {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
