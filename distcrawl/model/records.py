"""What a worker hands the frontier's scripts: the entries of a commit, the politeness
feedback of its responses, the dead letters to re-drive, and the cluster-wide limits."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple


class EntryKind(str, Enum):
    """What a commit entry is (the ARGV section of ``commit.lua``). A ``str``: the value, one
    letter, is what is sent to the script, byte for byte."""

    #: a new request: filtered by its fingerprint, dropped at the pending caps
    REQUEST = "r"
    #: a request made from a start_urls entry (``raw``), which leaves the claim list with it
    START_REQUEST = "s"
    #: a start_urls entry (``raw``) that goes to the dead letters (its record in ``payload``)
    BAD_START = "x"
    #: a dead letter (its record in ``payload``)
    DEAD_LETTER = "d"
    #: a request to retry later (its delay in ms in ``raw``): never filtered or dropped
    RETRY = "l"
    #: a request made from a start_urls entry claimed in the crawl's keys while a shard
    #: stores it (DISTCRAWL_SHARDS): the worker takes the entry out of its claim list after
    SHARD_START = "S"
    #: a page to fetch again (its delay in ms in ``raw``, -1: never again): never filtered
    #: or dropped, and it replaces the page's revisit still waiting, found by ``fingerprint``
    REVISIT = "v"


#: the kinds of entry made from a claimed start_urls entry: stored, it leaves the claim list
START_KINDS = (EntryKind.START_REQUEST, EntryKind.BAD_START)


class Entry(NamedTuple):
    """One thing to store: see the ARGV section of ``commit.lua`` for the kinds."""

    kind: EntryKind
    fingerprint: bytes
    priority: int
    payload: bytes
    raw: bytes = b""
    slot: str = ""
    #: the request it was made from, kept (never sent) for request_dropped and
    #: DUPEFILTER_DEBUG when Redis finds it is a duplicate or over the pending cap
    request: Any = None


class Feedback(NamedTuple):
    """What one slot's responses said since the last commit (see ``commit.lua``)."""

    slot: str
    responses: int
    latency_ms: int
    throttled: int
    retry_after_ms: int


class RedriveKind(str, Enum):
    """Where redrive.lua moves a dead letter back to (its ARGV section); sent as the letter."""

    #: into the queue: the encoded request, its slot and priority
    QUEUE = "q"
    #: into start_urls: the raw entry in ``payload``
    START_URLS = "u"


class Redrive(NamedTuple):
    """A dead letter to move back (redrive.lua): see ``RedriveKind``."""

    record: bytes
    kind: RedriveKind
    slot: str
    priority: int
    payload: bytes
    #: where it was read: a negative index from the oldest end (0: unknown, found by value)
    at: int = 0


@dataclass(frozen=True)
class Politeness:
    """The cluster-wide limits the scripts apply; built once from DistcrawlConfig."""

    delay_ms: int = 0
    concurrency: int = 2**31 - 1
    #: JSON {slot: [delay ms, concurrency]} from DOWNLOAD_SLOTS (-1: not set), or ""
    overrides: str = ""
    #: "<probe timeout ms>:<max Crawl-delay ms>" when robots.txt is obeyed, else ""
    robots: str = ""
    #: "<start ms>:<max ms>:<target concurrency>:<window>:<share>" (see commit.lua)
    throttle: str = "1000:60000:0:30:0.3"
    max_pending: int = 0
    #: DISTCRAWL_MAX_PENDING_PER_SLOT (0: none)
    max_pending_per_slot: int = 0
    keep_priority: int = 2**31
    scan: int = 64
    #: the share of a slot's turns due revisits take while new requests wait too
    revisit_share: float = 0.0
    #: reserves a worker may hold per place it holds in a slot (config.reserves_per_place)
    reserves_per_place: int = 1


def slot_overrides(text: str) -> dict[str, list[int]]:
    """Politeness.overrides as ``{slot: [delay ms, concurrency]}``."""
    return json.loads(text) if text else {}
