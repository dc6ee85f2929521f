"""The frontier's layout record (``<ns>:meta``): what every worker of a crawl must agree on.

Workers of one crawl that disagree on how the frontier is laid out do not fail loudly, they
quietly corrupt it: a worker with ``DISTCRAWL_SERIALIZER = "json"`` cannot read what a
msgpack worker queued (every request would go to the dead letters), one with another
fingerprinter or seen-set checks URLs against a set the others never fill (pages fetched
twice), and once the frontier is sharded a different shard count would send a URL to a
shard nobody else looks in. So the first worker records the layout, and every worker after
it compares its own and refuses to start, naming each difference, instead of joining.

A frontier made before the record existed has none: the first worker to open it records its
own layout, which is what every worker of that crawl used anyway.

The record also holds the crawl's *generation*, a random token written with the first record:
a reset (``distcrawl reset``, ``FLUSHDB``, ``DISTCRAWL_FLUSH_ON_START``) removes it, so a
worker that outlived the frontier it joined finds the token gone or changed. It must not go
on with what it remembers of the old crawl (the URLs it pushed, robots.txt, politeness state):
its local seen cache alone would drop every link of the next crawl. Workers read the token in
the batches that lease or claim work (``generation_op``, no round trip of its own) and, when
it changed, forget those and join the new crawl as a worker starting then would.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from distcrawl.model.keys import FrontierKeys
from distcrawl.model.ops import Op

#: the version of the key layout and entry formats this code reads and writes; a change that
#: older workers would misread raises it
FORMAT_VERSION = 1

#: the field of ``<ns>:meta`` holding the crawl's generation (see the module docstring)
GENERATION = "generation"

#: where each field comes from, for the message that names a difference
SOURCES = {
    "format": "distcrawl's frontier format version",
    "shards": "DISTCRAWL_SHARDS",
    "seen": "DISTCRAWL_SEEN",
    "serializer": "DISTCRAWL_SERIALIZER",
    "fingerprinter": "REQUEST_FINGERPRINTER_CLASS",
}


#: the field of ``<ns>:meta`` that says the crawl has a legacy seen-set
#: (``FrontierKeys.legacy_seen``) and whose fingerprints it holds; not part of the layout
#: a worker must agree on: it is the crawl's, written by ``distcrawl import scrapy-redis``
LEGACY_SEEN = "legacy_seen"
#: the one kind of legacy seen-set there is: scrapy-redis 0.9.1's fingerprints
#: (distcrawl.dupefilter.scrapy_redis_fingerprint)
LEGACY_SCRAPY_REDIS = "scrapy-redis"


class LayoutMismatch(RuntimeError):
    """This worker's configuration disagrees with the layout recorded in ``<ns>:meta``."""

    def __init__(self, namespace: str, differences: list[str]) -> None:
        self.namespace = namespace
        self.differences = differences
        super().__init__(
            f"this worker's settings disagree with the frontier {namespace!r} in Redis: "
            + "; ".join(differences)
            + ". Start it with the crawl's settings, or start the crawl over "
            "(distcrawl reset, or DISTCRAWL_FLUSH_ON_START) to use the new ones"
        )


@dataclass(frozen=True)
class Layout:
    shards: int
    seen: str
    serializer: str
    #: the import path of the crawler's request fingerprinter class
    fingerprinter: str
    format: int = FORMAT_VERSION

    def fields(self) -> dict[str, str]:
        return {name: str(value) for name, value in asdict(self).items()}

    def differences(self, stored: Mapping[str, str]) -> list[str]:
        """Each field the record holds with another value, as "<setting>: this worker
        <mine>, the frontier <theirs>". Fields the record lacks (written by an older
        version) are not differences: the worker adds them."""
        out = []
        for name, mine in self.fields().items():
            theirs = stored.get(name)
            if theirs is not None and theirs != mine:
                out.append(f"{SOURCES[name]}: this worker {mine!r}, the frontier {theirs!r}")
        return out


def class_path(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass
class Joined:
    """The crawl a worker joined: its layout, recorded again when the frontier is set up
    anew, and the generation it last saw (the batch runner's, on the Redis thread)."""

    layout: Layout
    generation: str | None
    #: the crawl keeps scrapy-redis' fingerprints as a legacy seen-set (LEGACY_SEEN)
    legacy_seen: bool = False

    def rejoin(
        self, seen: str | None, record: Callable[[Mapping[str, str]], dict[str, str]]
    ) -> Rejoined | None:
        """None when ``seen`` (the generation a batch read) is the one joined; else join the
        crawl now in Redis: ``record`` (``Frontier.record_layout``) sets a frontier that is
        gone up again, as a worker starting now would, and the record says whether this
        worker may work in it."""
        if seen is not None and seen == self.generation:
            return None
        stored = record(self.layout.fields())
        self.generation = stored.get(GENERATION)
        return Rejoined(gone=seen is None, differences=self.layout.differences(stored))


@dataclass(frozen=True)
class Rejoined:
    """A batch found the frontier this worker joined gone or set up anew, and joined the
    crawl that is there now."""

    #: the layout record was missing (a reset, FLUSHDB), not replaced by another's
    gone: bool
    #: this worker's settings against the new record's (LayoutMismatch): must not work in it
    differences: list[str]


def new_generation() -> str:
    """A crawl generation: random, so that a frontier set up again never repeats one."""
    return os.urandom(8).hex()


def generation_op(keys: FrontierKeys) -> Op[str | None]:
    """Read the crawl's generation (None: no layout record, the frontier is gone), to ride
    with a batch: on a cluster ``<ns>:meta`` is in the crawl's hash slot, as every key is."""
    return Op("", [], ["HGET", keys.meta, GENERATION], _text_or_none)


def _text_or_none(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
