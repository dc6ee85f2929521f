"""Every Redis key distcrawl uses, built in this one place.

All keys of one crawl share the ``<namespace>:`` prefix (the spider name by default), so
that ``distcrawl reset`` can remove exactly one crawl and nothing else, and so that the
Lua scripts never build a key themselves: they receive every key through KEYS.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FrontierKeys:
    namespace: str

    def __post_init__(self) -> None:
        if not self.namespace or any(c.isspace() for c in self.namespace):
            raise ValueError(f"invalid namespace {self.namespace!r}")

    def _key(self, suffix: str) -> str:
        return f"{self.namespace}:{suffix}"

    @property
    def start_urls(self) -> str:
        """LIST anyone may LPUSH to: plain URLs or JSON objects."""
        return self._key("start_urls")

    @property
    def queue(self) -> str:
        """ZSET of request ids, score = -priority; ties pop in id (FIFO) order."""
        return self._key("queue")

    @property
    def requests(self) -> str:
        """HASH request id -> ``<priority>:<payload>``, for queued and leased requests."""
        return self._key("requests")

    @property
    def leases(self) -> str:
        """ZSET of leased request ids, score = lease deadline (Redis server time, ms)."""
        return self._key("leases")

    @property
    def delayed(self) -> str:
        """ZSET of request ids waiting for a retry, score = due time (Redis server time, ms)."""
        return self._key("delayed")

    @property
    def seen(self) -> str:
        """SET of binary request fingerprints."""
        return self._key("seen")

    @property
    def bloom(self) -> str:
        """HASH describing the Bloom-filter seen-set (``DISTCRAWL_SEEN = "bloom"``): its
        layers, their sizes and how many URLs each holds; see ``distcrawl/seen.py``."""
        return self._key("bloom")

    def bloom_part(self, layer: int, part: int) -> str:
        """STRING bitmap holding part ``part`` of Bloom layer ``layer`` (both from 0)."""
        if layer < 0 or part < 0:
            raise ValueError(f"invalid Bloom layer {layer} part {part}")
        return self._key(f"bloom:{layer}:{part}")

    @property
    def seq(self) -> str:
        """Counter that numbers requests so that equal priorities pop first-in first-out."""
        return self._key("seq")

    @property
    def dead(self) -> str:
        """LIST of JSON dead-letter records (newest first)."""
        return self._key("dead")

    @property
    def workers(self) -> str:
        """HASH worker id -> JSON heartbeat (host, pid, counters, last beat); kept after exit."""
        return self._key("workers")

    @property
    def stats(self) -> str:
        """HASH of counters summed over all workers (HINCRBY): pages, items, errors, ..."""
        return self._key("stats")

    @property
    def domains(self) -> str:
        """ZSET domain -> pages fetched, for the busiest domains."""
        return self._key("domains")

    @property
    def paused(self) -> str:
        """STRING present while the crawl is paused (``distcrawl pause``)."""
        return self._key("paused")

    def all(self) -> tuple[str, ...]:
        """Every fixed key of this crawl, for an explicit reset; the Bloom filter's bitmaps
        (``bloom_part``) are listed in its ``bloom`` HASH, see ``Frontier.clear``."""
        return (
            self.start_urls,
            self.queue,
            self.requests,
            self.leases,
            self.delayed,
            self.seen,
            self.bloom,
            self.seq,
            self.dead,
            self.workers,
            self.stats,
            self.domains,
            self.paused,
        )
