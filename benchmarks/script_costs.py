"""What a worker's batch costs Redis per script call and per request, without a crawl's noise.

The crawl rows give Redis CPU per page on a machine shared with the workers and the sites, and
move by 20-30% from run to run there: too much to see a change worth 10%. This part runs the
scripts of a busy worker's batch against a fresh redis-server, in one pipeline as batch.py
sends them (places.lua for the requests that left the downloader, commit.lua acknowledging
the batch before and storing three children, lease.lua taking the next ``size``), at several
batch sizes, and splits each script's time per call (SLOWLOG, every call logged) into a fixed
part and a part per request (least squares over the sizes). It also measures, on the same
server, the unit costs that explain those figures: a ``redis.call``, a number given to one
(Redis formats it), a closure, a 200-byte string made in Lua.

Everything here runs warm, back to back: a crawl's batches come tens of ms apart, and each
finds Redis' caches cold (``wakeup`` in the lean report), so a crawl pays more per call.

``--scripts-against DIR`` compares two versions of the scripts: DIR's ``.lua`` files (another
checkout) and these, alternating round by round on the same server, each version's fits and
the ratios printed side by side; the machine's drift (tens of percent over minutes here) then
falls on both alike. Only the Lua differs: the arguments are built by this checkout's Python,
so the two versions must take the same KEYS and ARGV.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

#: batch sizes (requests a lease takes, then reports and acknowledges)
SIZES = (1, 2, 4, 8, 14)
#: cycles per size, after one to warm up
CYCLES = 200
#: the sizes are run in turn this many times, each size's medians taken over the rounds: the
#: machine is shared, and its speed moves by tens of percent over seconds
ROUNDS = 3
#: bytes of a request's payload (an encoded Scrapy request of the demo site is about this)
PAYLOAD = 220
SLOT = "127.0.0.1:8000"
SCRIPTS = ("places", "commit", "lease")


@contextmanager
def lua_from(checkout: Path | None) -> Iterator[None]:
    """Scripts registered meanwhile are built from ``checkout``'s ``.lua`` files (None: this
    package's own)."""
    import distcrawl.model.lua as lua

    if checkout is None:
        yield
        return
    folder = checkout / "distcrawl" / "model" / "lua"
    if not (folder / "lease.lua").is_file():
        raise SystemExit(f"--scripts-against: no distcrawl/model/lua/lease.lua in {checkout}")
    own = lua.source
    lua.source = lambda name: (folder / f"{name}.lua").read_text(encoding="utf-8")
    lua.lib_definitions.cache_clear()
    try:
        yield
    finally:
        lua.source = own
        lua.lib_definitions.cache_clear()


def _frontier(client: redis.Redis, namespace: str, queued: int) -> Any:
    from distcrawl.model.frontier import Frontier
    from distcrawl.model.keys import FrontierKeys
    from distcrawl.model.records import Entry, EntryKind, Politeness

    frontier = Frontier(client, FrontierKeys(namespace), Politeness(concurrency=16))
    entries = [
        Entry(EntryKind.REQUEST, b"%020d" % i, 0, b"x" * PAYLOAD + b"%d" % i, b"", SLOT)
        for i in range(queued)
    ]
    for at in range(0, queued, 1000):
        frontier.commit([], entries[at : at + 1000])
    frontier.run(frontier.alive_op())
    frontier.scripts.load(client)
    return frontier


def send_batch(
    client: redis.Redis,
    frontier: Any,
    leased: list[Any],
    acked: list[Any],
    children: list[Any],
    size: int,
    cycle: int,
) -> list[Any]:
    """One batch in one pipeline, as batch.py sends it: places.lua for ``leased`` (they left
    the downloader), commit.lua acknowledging ``acked`` and storing ``children``, then
    lease.lua taking ``size`` more. Returns what the lease gave."""
    from distcrawl.model.records import Feedback

    ops = []
    if leased:
        ops.append(frontier.places_op([x.ref for x in leased]))
        feedback = [Feedback(SLOT, len(leased), 10 * len(leased), 0, 0)]
        ops.append(frontier.commit_op(acked, children, feedback, commit_id=f"c{cycle}"))
    ops.append(frontier.lease_op(size, 60_000))
    pipe = client.pipeline(transaction=False)
    for op in ops:
        pipe.evalsha(getattr(frontier.scripts, op.script).sha, len(op.keys), *op.keys, *op.args)
    replies = pipe.execute()
    return list(ops[-1].parse(replies[-1]).items)


def _cycles(client: redis.Redis, size: int, namespace: str) -> dict[str, Any]:
    """``CYCLES`` batches of ``size`` requests: each script's median µs per call, and Redis
    CPU per request over the whole loop (the pipelines' round trips included)."""
    from distcrawl.model.records import Entry, EntryKind

    frontier = _frontier(client, namespace, (CYCLES + 2) * size + 10)
    names = {getattr(frontier.scripts, n).sha: n for n in SCRIPTS}
    child = 0
    leased: list[Any] = []
    done: list[Any] = []
    pages = 0

    def cpu() -> float:
        info = client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    started = cpu()
    for cycle in range(CYCLES + 1):
        if cycle == 1:  # the first lease only warms up
            client.slowlog_reset()
            started, pages = cpu(), 0
        children = []
        for _ in range(3 if leased else 0):
            child += 1
            fp = b"c%019d" % child
            children.append(Entry(EntryKind.REQUEST, fp, 0, b"y" * PAYLOAD, b"", SLOT))
        got = send_batch(client, frontier, leased, done, children, size, cycle)
        # a request is leased, reported (it left the downloader) in the next batch, and
        # acknowledged in the one after, as its children are stored
        done = [x.ref for x in leased]
        leased = got
        pages += len(leased)
    spent = cpu() - started
    calls: dict[str, list[int]] = {n: [] for n in SCRIPTS}
    for entry in client.slowlog_get(10 * CYCLES):
        command = entry["command"].split()
        if command and command[0].upper() == b"EVALSHA":
            name = names.get(command[1].decode())
            if name is not None:
                calls[name].append(int(entry["duration"]))
    return {
        "size": size,
        "us_per_call": {n: statistics.median(v) if v else None for n, v in calls.items()},
        "redis_cpu_us_per_request": 1e6 * spent / max(pages, 1),
    }


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One size's runs: the median of each figure."""
    per_call = {
        n: statistics.median(r["us_per_call"][n] for r in runs if r["us_per_call"][n])
        for n in SCRIPTS
    }
    cpu = statistics.median(r["redis_cpu_us_per_request"] for r in runs)
    return {"size": runs[0]["size"], "us_per_call": per_call, "redis_cpu_us_per_request": cpu}


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares: (fixed µs per call, µs per request)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


def unit_costs(client: redis.Redis, repeat: int = 1000) -> dict[str, float]:
    """µs per operation inside a script, warm: each script does 40 of them, less an empty
    script's time (INFO commandstats, EVALSHA's usec)."""
    client.hset("bench:unit:h", "x", "1")
    client.zadd("bench:unit:z", {"a": 1})
    bodies = {
        "redis.call HGET": "redis.call('HGET', KEYS[1], 'x')",
        "redis.call TIME": "redis.call('TIME')",
        "redis.call ZADD, score a string": "redis.call('ZADD', KEYS[2], '1796586636255', 'a')",
        "redis.call ZADD, score a number": "redis.call('ZADD', KEYS[2], 1796586636255 + i, 'a')",
        "closure": "local f = function() return i end",
        "200-byte string": "local s = big .. i",
        "string.format %012x": "local s = string.format('%012x', 123456789 + i)",
    }
    keys = ["bench:unit:h", "bench:unit:z"]

    def usec(body: str) -> float:
        source = f"local big = string.rep('x', 200) for i = 1, 40 do {body} end return 1"
        script = client.register_script(source)
        script(keys=keys)
        before = client.info("commandstats").get("cmdstat_evalsha", {"usec": 0, "calls": 0})
        for _ in range(repeat):
            script(keys=keys)
        after = client.info("commandstats")["cmdstat_evalsha"]
        return (after["usec"] - before["usec"]) / (after["calls"] - before["calls"])

    empty = usec("")
    out = {"empty script (µs per call)": round(empty, 2)}
    for name, body in bodies.items():
        out[name] = round((usec(body) - empty) / 40, 3)
    client.delete(*keys)
    return out


def _fits(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    fits = {}
    for name in SCRIPTS:
        points = [(r["size"], r["us_per_call"][name]) for r in runs if r["us_per_call"][name]]
        fixed, per_request = _fit(points)
        fits[name] = {"fixed_us": round(fixed, 1), "per_request_us": round(per_request, 2)}
    return fits


def run_script_costs(args: Any, workdir: Path) -> dict[str, Any]:
    from distcrawl.testing.redis_server import RedisServer

    against: Path | None = getattr(args, "scripts_against", None)
    versions: dict[str, Path | None] = {"this checkout": None}
    if against is not None:
        versions = {str(against): against, **versions}
    (workdir / "scripts").mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    rounds: dict[str, list[list[dict[str, Any]]]] = {v: [] for v in versions}
    with RedisServer(directory=workdir / "scripts") as server:
        client = server.client()
        try:
            client.config_set("slowlog-log-slower-than", 0)
            client.config_set("slowlog-max-len", 10 * CYCLES)
            for n in range(ROUNDS):
                for v, (label, checkout) in enumerate(versions.items()):
                    with lua_from(checkout):
                        rounds[label].append(
                            [_cycles(client, size, f"v{v}r{n}s{size}") for size in SIZES]
                        )
            units = unit_costs(client)
        finally:
            client.close()
    out: dict[str, Any] = {"versions": {}, "units": units}
    for label, found in rounds.items():
        runs = [_median_run([r[i] for r in found]) for i in range(len(SIZES))]
        out["versions"][label] = {"runs": runs, "fit": _fits(runs)}
    out["seconds"] = time.monotonic() - began
    print_script_costs(out)
    return out


def print_script_costs(out: dict[str, Any]) -> None:
    for label, version in out["versions"].items():
        print(
            f"\nThe batch's scripts ({label}), warm, one pipeline a batch (µs per call: medians"
            f" of {ROUNDS} rounds of each call's median, SLOWLOG)"
        )
        head = "  ".join(f"{n:>8}" for n in SCRIPTS)
        print(f"{'requests':>8}  {head}  Redis CPU µs/request")
        for run in version["runs"]:
            cells = "  ".join(f"{run['us_per_call'][n] or 0:8.1f}" for n in SCRIPTS)
            print(f"{run['size']:>8}  {cells}  {run['redis_cpu_us_per_request']:20.1f}")
        fit = version["fit"]
        print(f"{'fixed':>8}  " + "  ".join(f"{fit[n]['fixed_us']:8.1f}" for n in SCRIPTS))
        print(f"{'/request':>8}  " + "  ".join(f"{fit[n]['per_request_us']:8.2f}" for n in SCRIPTS))
    if len(out["versions"]) == 2:
        (_, a), (_, b) = out["versions"].items()
        print("this checkout over the other, per script: fixed / per request / at 14 requests")
        for n in SCRIPTS:
            ratios = [
                b["fit"][n][part] / a["fit"][n][part] if a["fit"][n][part] else float("nan")
                for part in ("fixed_us", "per_request_us")
            ]
            at_14 = b["runs"][-1]["us_per_call"][n] / a["runs"][-1]["us_per_call"][n]
            print(f"  {n:8s} {ratios[0]:5.2f}x / {ratios[1]:5.2f}x / {at_14:5.2f}x")
        cpu = b["runs"][-1]["redis_cpu_us_per_request"] / a["runs"][-1]["redis_cpu_us_per_request"]
        print(f"  Redis CPU a request at {SIZES[-1]} a batch: {cpu:5.2f}x")
    print("Unit costs inside a script, warm (µs each):")
    for name, value in out["units"].items():
        print(f"  {name:34s} {value}")
