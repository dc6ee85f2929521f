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
"""

from __future__ import annotations

import statistics
import time
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


def _cycles(client: redis.Redis, size: int, namespace: str) -> dict[str, Any]:
    """``CYCLES`` batches of ``size`` requests: each script's median µs per call, and Redis
    CPU per request over the whole loop (the pipelines' round trips included)."""
    from distcrawl.model.records import Entry, EntryKind, Feedback

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
        ops = []
        if leased:
            ops.append(frontier.places_op([x.ref for x in leased]))
            children = []
            for _ in range(3):
                child += 1
                fp = b"c%019d" % child
                children.append(Entry(EntryKind.REQUEST, fp, 0, b"y" * PAYLOAD, b"", SLOT))
            feedback = [Feedback(SLOT, len(leased), 10 * len(leased), 0, 0)]
            ops.append(frontier.commit_op(done, children, feedback, commit_id=f"c{cycle}"))
        ops.append(frontier.lease_op(size, 60_000))
        pipe = client.pipeline(transaction=False)
        for op in ops:
            pipe.evalsha(getattr(frontier.scripts, op.script).sha, len(op.keys), *op.keys, *op.args)
        replies = pipe.execute()
        # a request is leased, reported (it left the downloader) in the next batch, and
        # acknowledged in the one after, as its children are stored
        done = [x.ref for x in leased]
        leased = ops[-1].parse(replies[-1]).items
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


def run_script_costs(args: Any, workdir: Path) -> dict[str, Any]:
    from distcrawl.testing.redis_server import RedisServer

    (workdir / "scripts").mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with RedisServer(directory=workdir / "scripts") as server:
        client = server.client()
        try:
            client.config_set("slowlog-log-slower-than", 0)
            client.config_set("slowlog-max-len", 10 * CYCLES)
            rounds = [
                [_cycles(client, size, f"r{n}s{size}") for size in SIZES] for n in range(ROUNDS)
            ]
            runs = [_median_run([r[i] for r in rounds]) for i in range(len(SIZES))]
            units = unit_costs(client)
        finally:
            client.close()
    fits = {}
    for name in SCRIPTS:
        points = [(r["size"], r["us_per_call"][name]) for r in runs if r["us_per_call"][name]]
        fixed, per_request = _fit(points)
        fits[name] = {"fixed_us": round(fixed, 1), "per_request_us": round(per_request, 2)}
    out = {"runs": runs, "fit": fits, "units": units, "seconds": time.monotonic() - began}
    print_script_costs(out)
    return out


def print_script_costs(out: dict[str, Any]) -> None:
    print(
        f"\nThe batch's scripts, warm, one pipeline a batch (µs per call: medians of {ROUNDS}"
        " rounds of each call's median, SLOWLOG)"
    )
    print(f"{'requests':>8}  " + "  ".join(f"{n:>8}" for n in SCRIPTS) + "  Redis CPU µs/request")
    for run in out["runs"]:
        cells = "  ".join(f"{run['us_per_call'][n] or 0:8.1f}" for n in SCRIPTS)
        print(f"{run['size']:>8}  {cells}  {run['redis_cpu_us_per_request']:20.1f}")
    fixed = "  ".join(f"{out['fit'][n]['fixed_us']:8.1f}" for n in SCRIPTS)
    slope = "  ".join(f"{out['fit'][n]['per_request_us']:8.2f}" for n in SCRIPTS)
    print(f"{'fixed':>8}  {fixed}")
    print(f"{'/request':>8}  {slope}")
    print("Unit costs inside a script, warm (µs each):")
    for name, value in out["units"].items():
        print(f"  {name:34s} {value}")
