"""Sizing and growth of the Bloom-filter seen-set (``DISTCRAWL_SEEN = "bloom"``).

The membership test itself runs in Redis (``lua/seen_bloom.lua``), atomically with the push
in ``commit.lua``. This side decides how big each layer is and creates layers, because Lua
may only touch keys it is given, and the bitmap keys of a layer are built in ``keys.py``:
a worker keeps the list of layers it knows (read from the ``bloom`` HASH), passes all their
keys to every script, and re-reads it only when a script answers that a layer is missing or
full.

A scalable Bloom filter (Almeida et al., 2007): layer 0 holds ``DISTCRAWL_BLOOM_CAPACITY``
URLs at ``DISTCRAWL_BLOOM_ERROR_RATE``; when it is full a new layer is added with
:data:`GROWTH` times the capacity at :data:`TIGHTENING` times the error rate, and so on.
Lookups test every layer, inserts go to the newest, so the false-positive rate of the whole
filter stays below ``p / (1 - TIGHTENING)`` = 2 p however many URLs arrive, instead of
rising towards 1 as a full filter's would.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import redis

from distcrawl.model.keys import FrontierKeys
from distcrawl.model.lua import LuaScript

logger = logging.getLogger(__name__)

DEFAULT_CAPACITY = 10_000_000
DEFAULT_ERROR_RATE = 1e-6
#: capacity of each new layer relative to the one before; doubling keeps the number of
#: layers (each one a lookup per URL) logarithmic in the overflow
GROWTH = 2
#: error rate of each new layer relative to the one before; the sum over all layers
#: p (1 + 1/2 + 1/4 + ...) then stays below 2 p
TIGHTENING = 0.5
#: a Redis string holds at most 2^32 bits (512 MB), so a bigger layer is split in parts
MAX_PART_BITS = 2**32


@dataclass(frozen=True)
class LayerSize:
    capacity: int
    error_rate: float
    k: int
    parts: int
    part_bits: int

    @property
    def bits(self) -> int:
        return self.parts * self.part_bits

    @property
    def bytes_per_url(self) -> float:
        return self.bits / 8 / self.capacity


def layer_size(capacity: int, error_rate: float, max_part_bits: int = MAX_PART_BITS) -> LayerSize:
    """The optimal Bloom filter for ``capacity`` URLs at ``error_rate`` false positives:
    m = -n ln p / (ln 2)^2 bits and k = m/n ln 2 bits per URL (rounded).

    Then laid out in Redis memory: jemalloc (Redis' allocator) hands out large blocks in 4
    size classes per power of two, so one 36 MB bitmap would take a 42 MB block, 4.2
    instead of 3.6 bytes per URL at 1e-6. A few equal parts often fit their classes
    better: the fewest parts (of 1 MiB or more) within 5% of m are used, and every
    allocated byte becomes a filter bit (which only lowers the false-positive rate).
    """
    if capacity <= 0:
        raise ValueError(f"capacity must be > 0, not {capacity}")
    if not 0 < error_rate < 1:
        raise ValueError(f"error rate must be between 0 and 1, not {error_rate}")
    bits = math.ceil(-capacity * math.log(error_rate) / math.log(2) ** 2)
    k = max(1, round(bits / capacity * math.log(2)))
    fewest = max(1, math.ceil(bits / max_part_bits))
    best = (fewest, max_part_bits)
    for parts in range(fewest, fewest + 32):
        if parts > fewest and bits / parts < MIN_SPLIT_BITS:
            break
        block = _allocation(math.ceil(bits / parts / 8))
        part_bits = min(max_part_bits, (block - SDS_OVERHEAD) * 8)
        if parts == fewest or parts * part_bits < best[0] * best[1]:
            best = (parts, part_bits)
        if parts * part_bits <= bits * 1.05:
            break
    return LayerSize(capacity, error_rate, k, *best)


#: parts are not made smaller than this (1 MiB) to fit a size class: each key costs its own
#: ~100 bytes and a lookup per part touched
MIN_SPLIT_BITS = 8 << 20
#: bytes Redis adds to a bitmap of 64 KiB or more: an sdshdr32 header and a final NUL
SDS_OVERHEAD = 10


def _allocation(nbytes: int) -> int:
    """The jemalloc size class (4 per power of two) of a Redis string of ``nbytes``."""
    size = nbytes + SDS_OVERHEAD
    step = max(16, 1 << max(0, (size - 1).bit_length() - 3))
    return -(-size // step) * step


def bytes_per_url(error_rate: float) -> float:
    """Memory of an optimal Bloom filter per URL: -ln p / (ln 2)^2 / 8, at any capacity."""
    return -math.log(error_rate) / math.log(2) ** 2 / 8


def nth_layer(
    index: int, capacity: int, error_rate: float, max_part_bits: int = MAX_PART_BITS
) -> LayerSize:
    """Layer ``index`` of a filter whose layer 0 has ``capacity`` and ``error_rate``."""
    return layer_size(capacity * GROWTH**index, error_rate * TIGHTENING**index, max_part_bits)


@dataclass(frozen=True)
class BloomState:
    """What the ``bloom`` HASH says, as far as a worker needs it."""

    layers: int
    parts: tuple[int, ...]
    counts: tuple[int, ...]
    capacities: tuple[int, ...]
    capacity: int | None
    error_rate: float | None

    @classmethod
    def parse(cls, raw: dict[Any, Any]) -> BloomState:
        info = {_text(k): _text(v) for k, v in raw.items()}
        layers = int(info.get("layers", 0))
        return cls(
            layers=layers,
            parts=tuple(int(info[f"{i}:parts"]) for i in range(layers)),
            counts=tuple(int(info[f"{i}:n"]) for i in range(layers)),
            capacities=tuple(int(info[f"{i}:cap"]) for i in range(layers)),
            capacity=int(info["capacity"]) if "capacity" in info else None,
            error_rate=float(info["error_rate"]) if "error_rate" in info else None,
        )

    @property
    def count(self) -> int:
        return sum(self.counts)

    @property
    def full(self) -> bool:
        return self.layers == 0 or self.counts[-1] >= self.capacities[-1]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def part_keys(keys: FrontierKeys, state: BloomState) -> list[str]:
    return [keys.bloom_part(i, j) for i in range(state.layers) for j in range(state.parts[i])]


class BloomFilter:
    """A worker's view of the shared Bloom filter: the keys to pass, and adding layers.

    Not thread-safe; the frontier uses it from one thread.
    """

    #: how often a script may answer "act first" in a row before the commit gives up; each
    #: answer means another worker changed the layers in between, so this is never reached
    #: in practice
    MAX_SYNCS = 10
    #: bits per bitmap key; smaller only in tests, to exercise layers of several parts
    max_part_bits = MAX_PART_BITS

    def __init__(
        self,
        client: redis.Redis,
        keys: FrontierKeys,
        grow: LuaScript,
        *,
        capacity: int = DEFAULT_CAPACITY,
        error_rate: float = DEFAULT_ERROR_RATE,
    ) -> None:
        layer_size(capacity, error_rate)  # fails now on values no layer can have
        self.client = client
        self.keys = keys
        self.grow_script = grow
        self.capacity = capacity
        self.error_rate = error_rate
        self.state: BloomState | None = None
        self._keys: list[str] = []

    def script_keys(self) -> list[str]:
        """The ``bloom`` HASH and every layer's bitmaps, as seen_bloom.lua wants them."""
        if self.state is None:
            self.sync()
        return self._keys

    def read(self) -> BloomState:
        return BloomState.parse(self.client.hgetall(self.keys.bloom))

    def sync(self) -> None:
        """Re-read the layers and add the next one if the newest is full (or none exists)."""
        state = self.read()
        if state.full:
            state = self._grow(state)
        if self.state is None and state.capacity is not None:
            if (state.capacity, state.error_rate) != (self.capacity, self.error_rate):
                logger.info(
                    "Bloom seen-set %s was created for %d URLs at error rate %g; keeping "
                    "that, not DISTCRAWL_BLOOM_CAPACITY=%d, DISTCRAWL_BLOOM_ERROR_RATE=%g",
                    self.keys.bloom,
                    state.capacity,
                    state.error_rate,
                    self.capacity,
                    self.error_rate,
                )
        elif self.state is not None and state.layers > self.state.layers:
            logger.info("Bloom seen-set %s now has %d layers", self.keys.bloom, state.layers)
        self.state = state
        self._keys = [self.keys.bloom, *part_keys(self.keys, state)]

    def _grow(self, state: BloomState) -> BloomState:
        index = state.layers
        base_capacity = state.capacity or self.capacity
        base_error = state.error_rate or self.error_rate
        size = nth_layer(index, base_capacity, base_error, self.max_part_bits)
        parts = [self.keys.bloom_part(index, j) for j in range(size.parts)]
        _, added = self.grow_script(
            keys=[*self.keys.script_keys("bloom_grow"), *parts],
            args=[index, size.capacity, size.k, size.part_bits, base_capacity, base_error],
        )
        if added and index > 0:
            logger.warning(
                "Bloom seen-set %s is full (%d URLs in %d layers): added layer %d for %d more "
                "URLs at error rate %g, %.0f MB; the false-positive rate of the whole filter "
                "stays below %g. Raise DISTCRAWL_BLOOM_CAPACITY for the next crawl.",
                self.keys.bloom,
                state.count,
                state.layers,
                index,
                size.capacity,
                size.error_rate,
                size.bits / 8 / 1e6,
                base_error / (1 - TIGHTENING),
            )
        elif added:
            logger.info(
                "Bloom seen-set %s created for %d URLs at error rate %g (%.0f MB, %d bits per URL)",
                self.keys.bloom,
                size.capacity,
                size.error_rate,
                size.bits / 8 / 1e6,
                size.k,
            )
        return self.read()

    def run(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        """Run a script that has the Bloom snippet, syncing and retrying when it asks to."""
        for _ in range(self.MAX_SYNCS):
            res = script(keys=[*keys, *self.script_keys()], args=args)
            if not (res and res[0] in (b"bloom", "bloom")):
                return res
            self.sync()
        raise redis.RedisError(
            f"Bloom seen-set {self.keys.bloom}: layers kept changing during {self.MAX_SYNCS} "
            "attempts"
        )
