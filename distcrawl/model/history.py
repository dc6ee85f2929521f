"""The crawl's recent history, kept in Redis as small fixed-size rollups for the web console.

Why rollups written by the workers: the console is no service of its own (it may be started
only when someone looks), so the history must already be in Redis; and the workers already
send one pipelined round trip per heartbeat (``WorkerMonitor._ops``), so the rollups ride in
it and cost no round trip.

The layout: one HASH per resolution (:data:`RESOLUTIONS`): ``<ns>:history:1m`` holds minute
buckets for the last hour, ``<ns>:history:10m`` ten-minute buckets for the last day. A
bucket is the server's time in seconds divided by the resolution; its fields are
``<bucket>:<series>``: the counters of :data:`COUNTED` (HINCRBY of the growth each worker
saw since its last beat, so that they add up over any number of workers) and the gauge
``queue`` (HSET: the queue's length the beat's worker read last; the last beat of the
bucket wins).

Memory is bounded: every beat deletes (HDEL) the buckets that left the window since the
worker's previous beat (on its first beat, the three windows before the window), and sets
the key to expire two windows after the last write. A bucket that left the window is
deleted by the next beat of any worker within the following two windows (a first beat
deletes back that far, a later one from where its previous beat stopped), or goes with the
key when no worker writes for two windows; so a HASH never holds more than four windows of
buckets: at most 960 fields for the hour and 2,304 for the day.

Reading a window is one HMGET of its buckets' fields (:func:`read_history`), O(window),
whatever the crawl's size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from distcrawl.model.keys import FrontierKeys
from distcrawl.model.ops import Op

#: the counters of ``<ns>:stats`` kept per bucket (their growth, HINCRBY)
COUNTED = ("pages", "items", "errors")
#: the gauges kept per bucket (the last value written in the bucket, HSET)
GAUGES = ("queue",)
SERIES = COUNTED + GAUGES


@dataclass(frozen=True)
class Resolution:
    """One rollup: its key's attribute in :class:`FrontierKeys`, the seconds of a bucket and
    how many buckets its window holds."""

    name: str
    key: str
    seconds: int
    buckets: int

    def key_of(self, keys: FrontierKeys) -> str:
        return str(getattr(keys, self.key))

    @property
    def window(self) -> int:
        """The seconds the window covers."""
        return self.seconds * self.buckets


#: the rollups: the last hour by minute, the last day by ten minutes
RESOLUTIONS = {
    "hour": Resolution("hour", "history_minutes", 60, 60),
    "day": Resolution("day", "history_ten_minutes", 600, 144),
}


def _same(reply: Any) -> Any:
    return reply


def field(bucket: int, series: str) -> str:
    return f"{bucket}:{series}"


class HistoryWriter:
    """What one worker adds to its beat for the rollups; it remembers, per resolution, the
    first bucket still in the window at its last beat, so that each beat deletes only the
    buckets that left the window since (see the module docstring)."""

    def __init__(self) -> None:
        self._kept_from: dict[str, int] = {}

    def ops(
        self,
        keys: FrontierKeys,
        now_s: float,
        deltas: Mapping[str, int],
        gauges: Mapping[str, int],
    ) -> list[Op[Any]]:
        """The commands of one beat at server time ``now_s``: the counters' growth
        (``deltas``, of :data:`COUNTED`), the gauges, the deletion of the buckets that left
        the window and the key's expiry. Plain commands, no reply to read."""
        ops: list[Op[Any]] = []
        counted = {name: int(deltas[name]) for name in COUNTED if deltas.get(name)}
        shown = {name: int(gauges[name]) for name in GAUGES if name in gauges}
        for res in RESOLUTIONS.values():
            key = res.key_of(keys)
            bucket = int(now_s) // res.seconds
            for name, delta in counted.items():
                ops.append(Op("", [], ["HINCRBY", key, field(bucket, name), delta], _same))
            for name, value in shown.items():
                ops.append(Op("", [], ["HSET", key, field(bucket, name), value], _same))
            first = bucket - res.buckets + 1
            oldest = first - 3 * res.buckets
            start = max(self._kept_from.get(res.name, oldest), oldest)
            old = [field(b, name) for b in range(start, first) for name in SERIES]
            if old:
                ops.append(Op("", [], ["HDEL", key, *old], _same))
            self._kept_from[res.name] = first
            if counted or shown:
                ops.append(Op("", [], ["PEXPIRE", key, 2 * res.window * 1000], _same))
        return ops


def read_history(
    client: redis.Redis, keys: FrontierKeys, span: str, now_s: float
) -> dict[str, Any]:
    """The window ``span`` (a name of :data:`RESOLUTIONS`) ending at server time ``now_s``:
    the start of each bucket (seconds) and, per series, its value in each bucket (None for
    a gauge no beat wrote; 0 for a counter). One HMGET of the window's fields."""
    res = RESOLUTIONS[span]
    last = int(now_s) // res.seconds
    buckets = list(range(last - res.buckets + 1, last + 1))
    fields = [field(b, name) for b in buckets for name in SERIES]
    raw: Sequence[Any] = client.hmget(res.key_of(keys), fields)
    series: dict[str, list[int | None]] = {name: [] for name in SERIES}
    at = 0
    for _bucket in buckets:
        for name in SERIES:
            value = raw[at]
            at += 1
            if value is None:
                series[name].append(0 if name in COUNTED else None)
            else:
                series[name].append(int(value))
    return {
        "span": span,
        "seconds": res.seconds,
        "times": [b * res.seconds for b in buckets],
        "series": series,
    }
