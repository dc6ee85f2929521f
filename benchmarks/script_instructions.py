"""What a worker's batch costs Redis in instructions, per script call: deterministic.

The crawl rows' Redis CPU moves by 20-30% from run to run on a shared 2-CPU machine, and the
scripts part (script_costs.py) times calls with SLOWLOG, which moves with the machine too. This
part runs the same batch as script_costs.py (places.lua reporting the last lease, commit.lua
acknowledging the one before and storing children, lease.lua taking the next ``size``)
against a redis-server under ``valgrind --tool=callgrind``, one profile dumped after each
``EVALSHA`` and collected only inside it (the server's cron between two calls, ~0.1M
instructions a tick, is not the script's, nor is SLOWLOG's entry for a call callgrind made
slow), and reports each script's instructions per call (the median over the cycles): within
a few tenths of a percent run after run, whatever else the machine does, so that a
change of a few percent in a script shows. Half of each batch's children repeat an earlier
fingerprint (duplicates, as two workers' links are), the rest are new.

It needs valgrind (Debian's package); the redis-server is the one the tests use
(``DISTCRAWL_REDIS_SERVER``). Instructions are not seconds: a call's cache misses, which a
crawl's batches pay (they come tens of ms apart), do not show here.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from benchmarks.script_costs import PAYLOAD, SCRIPTS, SLOT, _frontier, lua_from, send_batch

#: (requests a lease takes, children a commit stores): a batch's fixed cost, and a batch of a
#: worker at 100 ms a page with the 0.2 s interval (12 pages, ~2.4 entries a page)
SHAPES = ((1, 0), (12, 29))
CYCLES = 40
#: the first cycles fill the scripts' and the server's structures; their calls are left out
WARM = 4


def _dumps(folder: Path) -> list[int]:
    """The instructions of each dumped profile, in the order of the calls."""

    def number(path: Path) -> int:
        return int(path.name.rsplit(".", 1)[1].split("-")[0])

    totals = []
    for path in sorted(folder.glob("calls.out.*"), key=number):
        for line in path.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                totals.append(int(line.split()[1]))
                break
    return totals


def _batches(client: redis.Redis, size: int, children: int, filled: Callable[[], None]) -> None:
    """``CYCLES`` batches; ``filled`` is called once the frontier is filled, before them."""
    from distcrawl.model.records import Entry, EntryKind

    frontier = _frontier(client, f"i{size}c{children}", (CYCLES + 2) * size + 10)
    filled()
    leased: list[Any] = []
    done: list[Any] = []
    child = 0
    for cycle in range(CYCLES):
        entries = []
        for n in range(children if leased else 0):
            child += 1
            # every other child repeats an earlier fingerprint: a duplicate
            fp = b"c%019d" % (child if n % 2 == 0 else child // 7)
            entries.append(Entry(EntryKind.REQUEST, fp, 0, b"y" * PAYLOAD, b"", SLOT))
        got = send_batch(client, frontier, leased, done, entries, size, cycle)
        done, leased = [x.ref for x in leased], got


def _shape(workdir: Path, size: int, children: int) -> dict[str, float]:
    """Each script's median instructions per call, one server under callgrind."""
    from distcrawl.testing.redis_server import HOST, REDIS_BINARY, find_free_port

    folder = workdir / f"callgrind-{size}-{children}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    port = find_free_port()
    with (folder / "valgrind.log").open("wb") as log:
        server = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                "--dump-after=evalShaCommand",
                # only what a call runs: the server's cron between two calls (its jemalloc
                # statistics, ~0.1M instructions a tick) is not the script's
                "--toggle-collect=evalShaCommand",
                f"--callgrind-out-file={folder / 'calls.out'}",
                REDIS_BINARY,
                *("--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"),
                # callgrind's calls take more than SLOWLOG's 10 ms, the server's would not: an
                # entry made a call would be counted as the script's
                *("--slowlog-log-slower-than", "-1"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    client = redis.Redis(host=HOST, port=port)

    def instrument() -> None:
        # the fill (thousands of requests) is not measured: only the batches are
        subprocess.run(
            ["callgrind_control", "-i", "on", str(server.pid)], check=True, capture_output=True
        )

    try:
        for _ in range(600):  # valgrind starts a server in seconds
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        _batches(client, size, children, instrument)
        with contextlib.suppress(redis.ConnectionError):  # the shutdown closes the connection
            client.shutdown(nosave=True)
    finally:
        client.close()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
    totals = _dumps(folder)
    # the first dump is the first lease alone; then places, commit, lease per cycle
    names = ["lease"] + [n for _ in range(CYCLES) for n in ("places", "commit", "lease")]
    calls: dict[str, list[int]] = {n: [] for n in SCRIPTS}
    for name, total in zip(names, totals, strict=False):
        calls[name].append(total)
    return {n: float(statistics.median(v[WARM:])) if v[WARM:] else 0.0 for n, v in calls.items()}


def run_script_instructions(args: Any, workdir: Path) -> dict[str, Any]:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("\nThe batch's scripts in instructions: not run, valgrind is not installed")
        return {"skipped": "valgrind is not installed (apt install valgrind)"}
    against: Path | None = getattr(args, "scripts_against", None)
    versions: dict[str, Path | None] = {"this checkout": None}
    if against is not None:
        versions = {str(against): against, **versions}
    began = time.monotonic()
    out: dict[str, Any] = {"versions": {}, "cycles": CYCLES}
    for label, checkout in versions.items():
        with lua_from(checkout):
            out["versions"][label] = [
                {"size": size, "children": children, "per_call": _shape(workdir, size, children)}
                for size, children in SHAPES
            ]
    out["seconds"] = time.monotonic() - began
    print_script_instructions(out)
    return out


def print_script_instructions(out: dict[str, Any]) -> None:
    print("\nThe batch's scripts in instructions per call (callgrind, medians)")
    head = "  ".join(f"{n:>10}" for n in SCRIPTS)
    for label, shapes in out["versions"].items():
        print(f"{label}:\n{'requests':>8} {'children':>8}  {head}  {'batch':>10}  per request")
        for shape in shapes:
            per = shape["per_call"]
            batch = sum(per.values())
            cells = "  ".join(f"{per[n]:10.0f}" for n in SCRIPTS)
            print(
                f"{shape['size']:>8} {shape['children']:>8}  {cells}  {batch:10.0f}"
                f"  {batch / shape['size']:10.0f}"
            )
    if len(out["versions"]) == 2:
        (_, a), (_, b) = out["versions"].items()
        print("this checkout over the other, per script and batch:")
        for x, y in zip(a, b, strict=True):
            ratios = "  ".join(
                f"{n} {y['per_call'][n] / x['per_call'][n]:.3f}x"
                for n in SCRIPTS
                if x["per_call"][n]
            )
            total = sum(y["per_call"].values()) / sum(x["per_call"].values())
            print(f"  {x['size']} requests, {x['children']} children: {ratios}  batch {total:.3f}x")
