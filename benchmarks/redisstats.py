"""Redis traffic of a crawl, counted by the Redis server itself.

What the counters mean was checked empirically against redis-server 7 (and is re-checked by
:func:`calibrate` on every run, the result going into the JSON):

- ``total_commands_processed`` and the ``calls`` of ``INFO commandstats`` count every
  command executed, *including* each ``redis.call()`` inside a Lua script (an EVALSHA running
  10 calls adds 11) and MULTI/EXEC themselves. They measure server work, not traffic.
- ``total_reads_processed`` counts socket reads. A request (one command, a pipeline or a
  MULTI/EXEC block) arrives in one read on loopback unless it is larger than the 16 KiB read
  buffer, so it counts client round trips, slightly over-counting very large requests.
- Which commands a client sent and which a script ran is only visible in ``MONITOR``
  (script calls are tagged ``lua``); :func:`parse_monitor` reads ``redis-cli monitor`` output
  for the separate, smaller protocol pass, so that MONITOR never slows the timed crawls.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")


@dataclass
class Snapshot:
    """The counters of one ``INFO all`` call."""

    commands: int
    reads: int
    net_in: int
    net_out: int
    calls: dict[str, int]
    cpu: float
    usec: dict[str, int] = field(default_factory=dict)

    @classmethod
    def take(cls, client: redis.Redis) -> Snapshot:
        info: dict[str, Any] = client.info("all")
        calls = {
            key[len("cmdstat_") :]: int(value["calls"])
            for key, value in info.items()
            if key.startswith("cmdstat_")
        }
        return cls(
            commands=int(info["total_commands_processed"]),
            reads=int(info["total_reads_processed"]),
            net_in=int(info["total_net_input_bytes"]),
            net_out=int(info["total_net_output_bytes"]),
            calls=calls,
            cpu=float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            usec={
                key[len("cmdstat_") :]: int(value["usec"])
                for key, value in info.items()
                if key.startswith("cmdstat_")
            },
        )


@dataclass
class Traffic:
    """Counter deltas between two snapshots, minus what the benchmark itself sent."""

    commands: int = 0
    reads: int = 0
    scripts: int = 0
    net_in: int = 0
    net_out: int = 0
    cpu: float = 0.0
    calls: dict[str, int] = field(default_factory=dict)
    #: microseconds Redis spent in each command (a script's includes its inner calls)
    usec: dict[str, int] = field(default_factory=dict)

    def per_page(self, pages: int) -> dict[str, float]:
        n = max(pages, 1)
        return {
            "commands": self.commands / n,
            "round_trips": self.reads / n,
            "scripts": self.scripts / n,
            "net_in_bytes": self.net_in / n,
            "net_out_bytes": self.net_out / n,
            "redis_cpu_ms": 1000 * self.cpu / n,
        }


def traffic(before: Snapshot, after: Snapshot, own: Traffic | None = None) -> Traffic:
    """Deltas; ``own`` is the benchmark's own share (its INFO calls, its LPUSH)."""
    calls = {k: v - before.calls.get(k, 0) for k, v in after.calls.items()}
    calls = {k: v for k, v in calls.items() if v}
    own = own or Traffic()
    for name, count in own.calls.items():
        calls[name] = calls.get(name, 0) - count
    return Traffic(
        commands=after.commands - before.commands - own.commands,
        reads=after.reads - before.reads - own.reads,
        scripts=sum(calls.get(name, 0) for name in SCRIPT_COMMANDS),
        net_in=after.net_in - before.net_in - own.net_in,
        net_out=after.net_out - before.net_out,
        cpu=after.cpu - before.cpu,
        calls={k: v for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v},
        usec={
            k: v - before.usec.get(k, 0)
            for k, v in sorted(after.usec.items(), key=lambda kv: -kv[1])
            if v - before.usec.get(k, 0)
        },
    )


def own_traffic(client: redis.Redis, push: bool) -> Traffic:
    """What two back-to-back snapshots (and the start-URL push) add by themselves."""
    a = Snapshot.take(client)
    b = Snapshot.take(client)
    idle = traffic(a, b)
    if push:
        idle.commands += 1
        idle.reads += 1
        idle.calls["lpush"] = idle.calls.get("lpush", 0) + 1
    idle.net_in = 0  # a few dozen bytes; not worth pretending to know them exactly
    return idle


def calibrate(client: redis.Redis) -> dict[str, dict[str, int]]:
    """Shows, on this server, what one command, a pipeline and a script add to each counter."""

    def measure(action: Any) -> dict[str, int]:
        base = own_traffic(client, push=False)
        before = Snapshot.take(client)
        action()
        delta = traffic(before, Snapshot.take(client), base)
        return {"commands": delta.commands, "reads": delta.reads, "scripts": delta.scripts}

    def pipeline() -> None:
        pipe = client.pipeline(transaction=False)
        for i in range(10):
            pipe.set(f"bench:calibrate:{i}", i)
        pipe.execute()

    script = client.register_script("for i = 1, 10 do redis.call('SET', KEYS[1], i) end return 1")
    script(keys=["bench:calibrate"])  # loads it, so the measurement is one EVALSHA
    out = {
        "1 command": measure(lambda: client.set("bench:calibrate", 1)),
        "pipeline of 10 commands": measure(pipeline),
        "script running 10 commands": measure(lambda: script(keys=["bench:calibrate"])),
    }
    client.delete("bench:calibrate", *(f"bench:calibrate:{i}" for i in range(10)))
    return out


_MONITOR_LINE = re.compile(r'^\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]+)"')


@dataclass
class MonitorCounts:
    """Commands seen by MONITOR, split into sent by a client and run inside a script."""

    client: Counter[str] = field(default_factory=Counter)
    script: Counter[str] = field(default_factory=Counter)


def parse_monitor(lines: list[str], exclude_addr: str | None = None) -> MonitorCounts:
    """``redis-cli monitor`` lines; ``exclude_addr`` is the benchmark's own connection."""
    counts = MonitorCounts()
    for line in lines:
        match = _MONITOR_LINE.match(line)
        if match is None:
            continue
        source, command = match.group(1), match.group(2).lower()
        if source == "lua":
            counts.script[command] += 1
        elif source != exclude_addr:
            counts.client[command] += 1
    return counts


def wakeup_cost(client: redis.Redis, count: int = 300, gap: float = 0.005) -> dict[str, float]:
    """Redis CPU (µs, ``used_cpu_user + used_cpu_sys``) per round trip on this machine, for a
    ``PING`` and for a script that only reads ``TIME``, sent back to back and ``gap`` s
    apart. A crawl wakes Redis for each pipeline, caches cold: what it costs Redis per page is
    mostly round trips per page times the spaced figure, and that figure is the machine's."""
    import time

    script = client.register_script("local t = redis.call('TIME') return 1")
    script()  # loaded, so that what follows is EVALSHA alone

    def cpu() -> float:
        info = client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def measure(call: Any, pause: float) -> float:
        before = cpu()
        for _ in range(count):
            if pause:
                time.sleep(pause)
            call()
        return round(1e6 * (cpu() - before) / count, 1)

    return {
        "gap_s": gap,
        "ping_back_to_back_us": measure(client.ping, 0.0),
        "ping_spaced_us": measure(client.ping, gap),
        "script_back_to_back_us": measure(script, 0.0),
        "script_spaced_us": measure(script, gap),
    }
