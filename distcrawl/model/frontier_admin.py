"""The operator's side of the frontier: plain commands over its keys, no script, off the
workers' hot path (``distcrawl slots``, ``limit`` and ``reset``, the dashboard, the producer's
sizes). A ``Frontier`` holds one as ``frontier.admin`` (its reset must forget the Bloom
state the worker cached); the operator's tools build their own from a client and keys,
without the scripts a ``Frontier`` registers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from distcrawl.model.connection import execute_timed
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import worker_tags
from distcrawl.model.replies import throttle_state
from distcrawl.model.seen import BloomFilter, BloomState, part_keys
from distcrawl.model.sizes import queue_size_reads, recorded_count, sizes_from


class FrontierAdmin:
    """The operator's commands over one keyset (see the module's docstring). ``bloom`` is
    the Bloom filter of the frontier this belongs to, if any: ``clear`` drops its cached
    state."""

    def __init__(
        self, client: redis.Redis, keys: FrontierKeys, bloom: BloomFilter | None = None
    ) -> None:
        self.client = client
        self.keys = keys
        self.bloom = bloom

    def set_limit(self, slot: str, delay: float | None, concurrency: int | None) -> None:
        """A cluster-wide override for one slot, applied from the next lease on; both None
        removes it (the settings apply again). In every shard: a slot that is not a host
        name (an IP, a ``download_slot``) may be in any of them."""
        value = f"{'' if delay is None else int(delay * 1000)}:{concurrency or ''}"
        for keys in (self.keys, *recorded_shards(self.client, self.keys)):
            if delay is None and concurrency is None:
                self.client.hdel(keys.limits, slot)
            else:
                self.client.hset(keys.limits, slot, value)

    def slot_states(self, limit: int = 20, scan: int = 10_000) -> list[dict[str, Any]]:
        """The politeness state of the slots with the most requests queued or in flight,
        among at most ``scan`` slots with queued requests and ``scan`` with requests in
        flight: a broad crawl has millions, and reading them all in one reply would hold
        Redis (``slot_count`` says how many there are).

        A sharded crawl's slots are read in every shard its layout record names (``scan``
        shared among them) and merged: a slot found in several shards (an IP address, a
        ``download_slot``) is one line, its counts summed, with the ``shards`` holding its
        requests."""
        parts = recorded_shards(self.client, self.keys)
        if not parts:
            out = self._slot_states(self.keys, scan)
        else:
            each = -(-scan // len(parts))
            found = [(k.shard or 0, s) for k in parts for s in self._slot_states(k, each)]
            out = _merged_states(found)
        out.sort(key=lambda d: (-(d["queued"] + d["in_flight"]), d["slot"]))
        return out[:limit]

    def _slot_states(self, k: FrontierKeys, scan: int) -> list[dict[str, Any]]:
        """The state of the slots of one keyset (the crawl's, or one shard's)."""
        names: set[bytes] = set()
        for found in (
            self.client.zscan_iter(k.ready, count=1000),
            self.client.hscan_iter(k.inflight, count=1000),
        ):
            for n, item in enumerate(found):
                if n >= scan:
                    break
                names.add(item[0])
        names |= set(self.client.hkeys(k.limits))  # type: ignore[arg-type]
        return self._states(k, sorted(names))

    def states_of(self, slots: Sequence[str]) -> list[dict[str, Any]]:
        """The politeness state of the named ``slots`` (as :meth:`slot_states` gives it), in
        the order given: one pipelined read of seven fields per slot (per shard of a sharded
        crawl), so that a console page showing N slots costs O(N) whatever the crawl's
        size, where :meth:`slot_states` must scan to find the busiest."""
        names = [s.encode() for s in slots]
        parts = recorded_shards(self.client, self.keys)
        if not parts:
            found = self._states(self.keys, names)
        else:
            found = _merged_states(
                [(k.shard or 0, s) for k in parts for s in self._states(k, names)]
            )
        by_slot = {state["slot"]: state for state in found}
        return [by_slot[s] for s in slots if s in by_slot]

    def set_paused(self, paused: bool) -> None:
        """Pause or resume the crawl: every worker reads the flag with its next heartbeat
        (``distcrawl pause``/``resume`` and the web console's buttons)."""
        if paused:
            self.client.set(self.keys.paused, b"1")
        else:
            self.client.delete(self.keys.paused)

    def _states(self, k: FrontierKeys, ordered: Sequence[bytes]) -> list[dict[str, Any]]:
        """The state of the named slots in one keyset, in one pipelined round trip."""
        pipe = self.client.pipeline(transaction=False)
        for name in ordered:
            lo, hi = b"[" + name + b"\0", b"(" + name + b"\1"
            pipe.zlexcount(k.queue, lo, hi)
            pipe.hget(k.inflight, name)
            pipe.hget(k.slots, name)
            pipe.hget(k.throttle, name)
            pipe.hget(k.robots, name)
            pipe.hget(k.limits, name)
            pipe.hget(k.throttle_state, name)
        values = execute_timed(self.client, pipe, k.queue)
        seconds, micros = values[-1]
        now_ms = seconds * 1000 + micros // 1000
        out = []
        for i, name in enumerate(ordered):
            queued, inflight, next_at, throttle, robots, limits, state = values[i * 7 : i * 7 + 7]
            cap, share = throttle_state(state)
            out.append(
                {
                    "slot": name.decode(errors="backslashreplace"),
                    "queued": int(queued),
                    "in_flight": int(inflight or 0),
                    "next_in": max(0.0, (int(next_at or 0) - now_ms) / 1000),
                    "throttle_delay": int(throttle or 0) / 1000,
                    "throttle_concurrency": cap,
                    "throttled_share": share,
                    "crawl_delay": None if robots is None else max(0, int(robots)) / 1000,
                    "override": None if limits is None else limits.decode(),
                }
            )
        return out

    def slot_count(self) -> int:
        """Slots with requests queued plus slots with requests in flight (a slot with both
        counts twice, a slot in two shards too): how many ``slot_states`` would have to look
        at, in every shard of a sharded crawl."""
        pipe = self.client.pipeline(transaction=False)
        for keys in recorded_shards(self.client, self.keys) or [self.keys]:
            pipe.zcard(keys.ready)
            pipe.hlen(keys.inflight)
        return sum(int(x) for x in pipe.execute())

    def sizes(self) -> dict[str, int]:
        """The sizes of this keyset alone (a shard's, or a crawl of one shard's): the
        scheduler adds up its shards'. ``read_frontier_sizes`` reads a whole crawl."""
        pipe = self.client.pipeline(transaction=False)
        queue_size_reads(pipe, self.keys)
        return sizes_from(pipe.execute()).as_dict()

    def netloc_keys(self) -> list[bytes]:
        """The per-netloc keys (robots.txt and its download lock): found by SCAN, which only
        the operator's reset pays for."""
        return list(self.client.scan_iter(match=self.keys.robots_txt_pattern, count=1000))

    def claim_keys(self) -> list[str]:
        """The claim lists of the workers registered in ``claimants`` (for a reset)."""
        tags: set[bytes] = self.client.smembers(self.keys.claimants)  # type: ignore[assignment]
        return [self.keys.claims(tag) for tag in worker_tags(sorted(tags))]

    def clear(self, shards: Sequence[FrontierKeys] = ()) -> int:
        """Remove the crawl's keys with UNLINK: a seen-set or queue of millions is freed in
        the background instead of holding Redis while every worker waits. The shards' keys
        go too: those given, and those the layout record names."""
        if self.bloom is not None:
            self.bloom.state = None  # re-read (and re-create) on the next commit
        per_netloc = self.netloc_keys()
        removed = 0
        for at in range(0, len(per_netloc), 1000):
            removed += int(self.client.unlink(*per_netloc[at : at + 1000]))
        parts = {*shards, *recorded_shards(self.client, self.keys)} - {self.keys}
        for keys in sorted(parts, key=lambda k: k.shard or 0):
            bloom = BloomState.parse(self.client.hgetall(keys.bloom))
            # one UNLINK per shard: on a cluster each shard is a hash slot of its own
            removed += int(self.client.unlink(*keys.all()[1:], *part_keys(keys, bloom)))
        bloom = BloomState.parse(self.client.hgetall(self.keys.bloom))
        fixed = (*self.keys.all(), *part_keys(self.keys, bloom), *self.claim_keys())
        return removed + int(self.client.unlink(*fixed))


def recorded_shards(client: redis.Redis, keys: FrontierKeys) -> list[FrontierKeys]:
    """The keys of the shards the crawl's layout record names, for the operator's tools
    (none when the crawl has one shard: its keys are the crawl's own)."""
    if keys.shard is not None:
        return []
    count = recorded_count(client.hget(keys.meta, "shards"))
    if count == 1:
        return []
    return keys.parts(count)


def _merged_states(found: Sequence[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """slot_states of several shards, one line per slot: counts summed, the soonest turn,
    the strongest throttle and Crawl-delay, and the shards holding its requests (queued or
    in flight; a slot known only by its override, which is in every shard, has none)."""
    out: dict[str, dict[str, Any]] = {}
    for shard, state in found:
        busy = [shard] if state["queued"] or state["in_flight"] else []
        have = out.get(state["slot"])
        if have is None:
            out[state["slot"]] = {**state, "shards": busy}
            continue
        have["queued"] += state["queued"]
        have["in_flight"] += state["in_flight"]
        have["next_in"] = min(have["next_in"], state["next_in"])
        have["throttle_delay"] = max(have["throttle_delay"], state["throttle_delay"])
        have["throttled_share"] = max(have["throttled_share"], state["throttled_share"])
        for name, pick in (("throttle_concurrency", min), ("crawl_delay", max)):
            values = [v for v in (have[name], state[name]) if v is not None]
            have[name] = pick(values) if values else None
        have["override"] = have["override"] or state["override"]
        have["shards"] += busy
    return list(out.values())
