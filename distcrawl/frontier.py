"""The shared frontier: synchronous Redis operations, one round trip each.

Nothing here touches the reactor: the scheduler runs these methods on its I/O thread and
hands the results back. Each step a batch runs also exists as an ``Op`` (``commit_op``,
``lease_op``...): its script call and how its reply is read, so that the batch runner can
send a whole batch in one pipeline and read each reply exactly as the method does. Keeping
them synchronous and free of Scrapy state makes them easy to test against a real server and
to reuse from the ``distcrawl`` command.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Concatenate, Generic, NamedTuple, ParamSpec, TypeVar

import redis

from distcrawl.connection import execute_timed
from distcrawl.keys import FrontierKeys
from distcrawl.lua import SEEN_MODES, Scripts
from distcrawl.seen import DEFAULT_CAPACITY, DEFAULT_ERROR_RATE, BloomFilter, BloomState, part_keys

#: bytes of a lease token: the holder's 4-byte worker tag, then 4 bytes that differ per lease
TOKEN_BYTES = 8
#: longest politeness slot (``meta["download_slot"]`` or a host name) a queue entry may carry
MAX_SLOT_BYTES = 255
#: raw bytes a dead-letter record keeps of what it quarantines (plus their length and SHA1)
DEAD_RAW_BYTES = 65536

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True)
class Op(Generic[T]):
    """One frontier step as Redis sees it, and how its reply is read.

    ``script`` names a script of ``Scripts`` (sent as EVALSHA with ``keys`` and ``args``);
    empty, ``args`` is a plain command. The Frontier's methods build an Op and send it
    alone (``Frontier.run``); the batch runner sends the Ops of a whole batch in one
    pipeline (batch.py), and both read the replies with the same ``parse``.
    """

    script: str
    keys: Sequence[Any]
    args: Sequence[Any]
    parse: Callable[[Any], T]


class QueueEntryError(ValueError):
    """A queue member that is not a request entry (see ``lua/lib.lua``)."""


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


class LeaseRef(NamedTuple):
    """What a worker must present to acknowledge, renew or give back a lease."""

    id: str
    token: bytes


class Feedback(NamedTuple):
    """What one slot's responses said since the last commit (see ``commit.lua``)."""

    slot: str
    responses: int
    latency_ms: int
    throttled: int
    retry_after_ms: int


class Leased(NamedTuple):
    id: str
    priority: int
    payload: bytes
    slot: str = ""
    #: taken at the start of a turn of a slot with a delay (see lease.lua)
    paced: bool = False
    token: bytes = b""
    #: leased ahead, holding no place in its slot: sent only in the place of a request of
    #: the same slot that left the downloader (see lease.lua, places.lua)
    reserve: bool = False

    @property
    def ref(self) -> LeaseRef:
        return LeaseRef(self.id, self.token)


class BadLease(NamedTuple):
    """A leased member that is not a request entry: acknowledged with its dead letter."""

    ref: LeaseRef
    raw: bytes
    reason: str


class LeaseResult(NamedTuple):
    items: list[Leased]
    queue_size: int
    delayed: int
    released: int
    #: seconds until some slot's turn comes or a retry is due (None: neither)
    wait: float | None = None
    #: the server's clock at the lease (ms), for ``sent``
    leased_at: int = 0
    #: queue members the script moved to the dead letters (malformed)
    quarantined: int = 0
    #: due retries whose record was gone (Redis lost data, or a bug)
    missing_retries: int = 0
    #: slots that had queued entries but were missing from ``ready``
    rearmed: int = 0
    #: leased members that do not parse, for the worker to dead-letter
    bad: list[BadLease] = []


class SweepResult(NamedTuple):
    forgotten: int
    looked: int
    #: every scan came round to its start: each slot was looked at since the last time
    wrapped: bool


class Redrive(NamedTuple):
    """A dead letter to move back (redrive.lua): into the queue (``kind`` 'q': the encoded
    request, its slot and priority) or into start_urls ('u': the raw entry in ``payload``)."""

    record: bytes
    kind: str
    slot: str
    priority: int
    payload: bytes
    #: where it was read: a negative index from the oldest end (0: unknown, found by value)
    at: int = 0


class RequeueResult(NamedTuple):
    requeued: int = 0
    #: leases that had no record (removed)
    orphans: int = 0
    #: workers whose liveness beats had lapsed
    dead_workers: int = 0
    #: leases of those workers given back
    released: int = 0
    #: start_urls entries claimed by workers no longer alive, given back to start_urls
    unclaimed: int = 0
    #: tags of the workers no longer alive that hold claims (given back by unclaim.lua)
    orphan_claims: tuple[str, ...] = ()


class Drained(NamedTuple):
    """Whether the whole crawl ran out of work, read in one transaction."""

    start_urls: int
    queued: int
    leased: int
    #: ms until the next retry is due (None: none waits)
    next_retry_ms: int | None
    #: workers holding claimed start_urls entries not stored yet (their requests are coming)
    claimants: int = 0

    def idle(self, within_ms: int) -> bool:
        """Nothing to do now, and no retry due within ``within_ms``."""
        soon = self.next_retry_ms is not None and self.next_retry_ms <= within_ms
        return not (self.start_urls or self.claimants or self.queued or self.leased or soon)


@dataclass(frozen=True)
class CommitResult:
    enqueued: int = 0
    duplicates: int = 0
    dead: int = 0
    #: start_urls entries no longer in the worker's claim list (it was taken for dead and
    #: they went back to start_urls): not stored by this commit
    skipped: int = 0
    queue_size: int = 0
    #: new requests dropped because the queue was at DISTCRAWL_MAX_PENDING
    dropped: int = 0
    #: start_urls entries left in the worker's claim list for the same reason
    held: int = 0
    #: 1 when this commit had already run (its reply was lost): nothing was changed
    replayed: int = 0
    #: acknowledgements of requests whose lease had expired and that were still queued
    late: int = 0
    #: acknowledgements whose token no longer matched (leased again): no-ops
    stale: int = 0
    #: acknowledgements of requests with no record (already done, or lost by Redis): no-ops
    missing: int = 0
    #: new requests dropped because their slot had DISTCRAWL_MAX_PENDING_PER_SLOT queued
    slot_dropped: int = 0
    #: positions of the entries not stored (duplicates, dropped), when asked for
    not_stored: tuple[int, ...] = ()

    def __add__(self, other: CommitResult) -> CommitResult:
        """The totals of two commits of one batch (``not_stored`` is not combined)."""
        return CommitResult.of([a + b for a, b in zip(self.counts(), other.counts(), strict=True)])

    @classmethod
    def of(cls, counts: Sequence[int], not_stored: Sequence[int] = ()) -> CommitResult:
        """From the counts in the order of ``counts()`` (commit.lua's reply)."""
        return cls(*counts, not_stored=tuple(not_stored))  # type: ignore[arg-type,misc]

    def counts(self) -> tuple[int, ...]:
        return (
            self.enqueued,
            self.duplicates,
            self.dead,
            self.skipped,
            self.queue_size,
            self.dropped,
            self.held,
            self.replayed,
            self.late,
            self.stale,
            self.missing,
            self.slot_dropped,
        )


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


def _overrides(text: str) -> dict[str, list[int]]:
    return json.loads(text) if text else {}


def _throttle_state(raw: bytes | None) -> tuple[int | None, float]:
    """(adaptive concurrency cap or None, throttled share) from a ``throttle_state`` value
    (``<cap>:<share>:<hold>``, see commit.lua)."""
    try:
        cap, share, _ = (raw or b"0:0:0").split(b":")
        return (int(float(cap)) if float(cap) >= 1 else None), float(share)
    except ValueError:
        return None, 0.0


def make_entry(slot: str, priority: int, seq: int, payload: bytes) -> bytes:
    """A queue entry as ``lua/lib.lua`` builds it (for tools and tests)."""
    priority = max(-(2**31) + 1, min(2**31 - 1, priority))
    key = (2**31 - priority).to_bytes(4, "big") + seq.to_bytes(6, "big")
    return slot.encode() + b"\0" + key + payload


def bad_slot(slot: str) -> str | None:
    """Why ``slot`` cannot be a politeness slot in a queue entry (None: it can); the same
    rule as ``bad_slot`` in lua/lib.lua, checked where entries are made."""
    if not slot:
        return "empty slot"
    if "\0" in slot:
        return "slot contains NUL"
    if len(slot.encode("utf-8", "surrogatepass")) > MAX_SLOT_BYTES:
        return f"slot over {MAX_SLOT_BYTES} bytes"
    return None


def parse_entry(entry: bytes) -> Leased:
    """Split a queue entry (layout in ``lua/lib.lua``) into id, priority, payload, slot;
    QueueEntryError for a member that is not one."""
    cut = entry.find(b"\0")
    if cut < 0 or len(entry) < cut + 11:
        raise QueueEntryError("malformed queue entry")
    try:
        slot = entry[:cut].decode()
    except UnicodeDecodeError:
        raise QueueEntryError("queue entry slot is not UTF-8") from None
    why = bad_slot(slot)
    if why is not None:
        raise QueueEntryError(f"queue entry: {why}")
    prio = 2**31 - int.from_bytes(entry[cut + 1 : cut + 5], "big")
    return Leased(entry[cut + 5 : cut + 11].hex(), prio, entry[cut + 11 :], slot)


def new_tag() -> str:
    """A worker tag: 4 random bytes in hex (see ``FrontierKeys.alive``)."""
    return os.urandom(TOKEN_BYTES // 2).hex()


def worker_tags(raw: Iterable[bytes]) -> list[str]:
    """The well-formed worker tags (8 hex digits) among members read from Redis: only those
    can have a claim list (Frontier checks its tag), anything else was written by hand."""
    out = []
    for tag in raw:
        text = tag.decode("ascii", "replace")
        if len(text) == TOKEN_BYTES and all(c in "0123456789abcdefABCDEF" for c in text):
            out.append(text)
    return out


def _raw_id(raw: bytes) -> str:
    """The id lease.lua gave a member (it only returns members with the full layout)."""
    cut = raw.find(b"\0")
    return raw[cut + 5 : cut + 11].hex()


def _pairs(refs: Iterable[LeaseRef]) -> list[Any]:
    return [x for ref in refs for x in (ref.id, ref.token)]


def worker_id() -> str:
    """Who did it, for dead letters and logs: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def dead_letter(
    reason: str,
    *,
    raw: bytes | str | None = None,
    url: str | None = None,
    source: str,
    **extra: Any,
) -> bytes:
    """A dead-letter record: JSON, so that operators can read it with ``redis-cli``."""
    record: dict[str, Any] = {
        "reason": reason,
        "source": source,
        "url": url,
        "worker": worker_id(),
        "time": time.time(),
    }
    if raw is not None:
        data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        record.update(raw_length=len(data), raw_sha1=hashlib.sha1(data).hexdigest())
        record.update(_raw_text(data[:DEAD_RAW_BYTES], cut=len(data) > DEAD_RAW_BYTES))
        if len(data) > DEAD_RAW_BYTES:
            record["truncated"] = True
    payload = extra.get("payload")
    if isinstance(payload, str) and len(payload) > DEAD_RAW_BYTES * 4 // 3 + 4:
        # a request too large to keep: the record holds what fits of it (its URL, callback
        # and small meta, for a re-drive), says what it left out, not megabytes
        extra = {**extra, "payload": None, "payload_length": len(payload)}
        from distcrawl.serialize import shrink_payload  # scrapy: not for every import

        try:
            shrunk = shrink_payload(base64.b64decode(payload), DEAD_RAW_BYTES)
        except binascii.Error:
            shrunk = None
        if shrunk is not None:
            kept, dropped = shrunk
            extra.update(payload=base64.b64encode(kept).decode("ascii"), payload_dropped=dropped)
    record.update(extra)
    return json.dumps(record, separators=(",", ":"), default=repr).encode()


def _raw_text(kept: bytes, *, cut: bool) -> dict[str, str]:
    """Raw bytes as JSON text: UTF-8 when they are (a cut may split the last character),
    else latin-1, which maps every byte to one character and back."""
    for trim in range(4 if cut else 1):
        try:
            return {"raw": kept[: len(kept) - trim].decode("utf-8")}
        except UnicodeDecodeError:
            continue
    return {"raw": kept.decode("latin-1"), "raw_encoding": "latin-1"}


def _parse_commit(res: Any) -> CommitResult:
    return CommitResult.of([int(x) for x in res[:-1]], [int(x) for x in res[-1]])


def _is_not_none(reply: Any) -> bool:
    return reply is not None


#: how lease.lua marks a leased request of a slot with a delay, and a reserve
PACED, RESERVE = 1, 2


def _parse_lease(res: Any) -> LeaseResult:
    items: list[Leased] = []
    bad: list[BadLease] = []
    for i in range(8, len(res), 3):
        kind, token, raw = int(res[i]), res[i + 1], res[i + 2]
        try:
            leased = parse_entry(raw)
            items.append(leased._replace(paced=kind == PACED, token=token, reserve=kind == RESERVE))
        except QueueEntryError as exc:
            bad.append(BadLease(LeaseRef(_raw_id(raw), token), raw, str(exc)))
    wait = None if int(res[3]) < 0 else int(res[3]) / 1000
    queue, delayed, released, _, now, quarantined, missing, rearmed = (int(x) for x in res[:8])
    return LeaseResult(
        items, queue, delayed, released, wait, now, quarantined, missing, rearmed, bad
    )


def _parse_places(res: Any) -> tuple[int, int]:
    return int(res[0]), int(res[1])


def _parse_sweep(res: Any) -> SweepResult:
    return SweepResult(int(res[0]), int(res[1]), bool(res[2]))


def _parse_requeue(res: Any) -> RequeueResult:
    requeued, orphans, dead, released = (int(x) for x in res[:4])
    lapsed = tuple(worker_tags(res[4])) if len(res) > 4 else ()
    return RequeueResult(requeued, orphans, dead, released, orphan_claims=lapsed)


def _first_int(res: Any) -> int:
    return int(res[0])


def _reversed(res: Any) -> list[bytes]:
    return list(res)[::-1]


def _sent_alone(
    make: Callable[Concatenate[Frontier, P], Op[T]],
) -> Callable[Concatenate[Frontier, P], T]:
    """A method that builds an Op and runs it at once: one signature (``make``'s) for the
    batched and the direct call."""

    def method(self: Frontier, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.run(make(self, *args, **kwargs))

    method.__doc__ = make.__doc__
    return method


class Frontier:
    """``seen`` picks the seen-set, ``"set"`` or ``"bloom"`` (``DISTCRAWL_SEEN``); the Bloom
    filter's capacity and error rate only matter to the worker that creates it."""

    def __init__(
        self,
        client: redis.Redis,
        keys: FrontierKeys,
        politeness: Politeness | None = None,
        *,
        seen: str = "set",
        bloom_capacity: int = DEFAULT_CAPACITY,
        bloom_error_rate: float = DEFAULT_ERROR_RATE,
        tag: str | None = None,
    ) -> None:
        if seen not in SEEN_MODES:
            raise ValueError(f"unknown seen-set {seen!r}: expected one of {', '.join(SEEN_MODES)}")
        self.client = client
        self.keys = keys
        #: this worker's tag (8 hex digits): the first half of its lease tokens, its member
        #: in ``keys.alive``; random per Frontier unless the caller names it
        self.tag = tag if tag is not None else new_tag()
        self._tag_bytes = bytes.fromhex(self.tag)
        if len(self._tag_bytes) != TOKEN_BYTES // 2:
            raise ValueError(f"invalid worker tag {tag!r}: expected 8 hex digits")
        self.politeness = politeness or Politeness()
        self._overrides = _overrides(self.politeness.overrides)
        self.scripts = Scripts.register(client, seen)
        self.bloom: BloomFilter | None = None
        if seen == "bloom":
            self.bloom = BloomFilter(
                client,
                keys,
                self.scripts.bloom_grow,
                capacity=bloom_capacity,
                error_rate=bloom_error_rate,
            )

    def run(self, op: Op[T]) -> T:
        """Send one Op on its own (a script falls back to EVAL after a script cache flush)."""
        if op.script:
            script = getattr(self.scripts, op.script)
            return op.parse(script(keys=op.keys, args=op.args))
        return op.parse(self.client.execute_command(*op.args))

    def commit(
        self,
        acks: Sequence[LeaseRef],
        entries: Sequence[Entry],
        feedback: Sequence[Feedback] = (),
        *,
        commit_id: str = "",
        positions: bool = False,
    ) -> CommitResult:
        """Run one commit (commit.lua). With a ``commit_id``, running the same commit again
        (its reply was lost) changes nothing and returns ``replayed=1``; ``positions`` asks
        for the positions of the entries Redis did not store."""
        op = self.commit_op(acks, entries, feedback, commit_id=commit_id, positions=positions)
        if self.bloom is not None:
            # the Bloom filter may need its state read (or grown) around the script
            return op.parse(self.bloom.run(self.scripts.commit, list(op.keys), list(op.args)))
        return self.run(op)

    def commit_op(
        self,
        acks: Sequence[LeaseRef],
        entries: Sequence[Entry],
        feedback: Sequence[Feedback] = (),
        *,
        commit_id: str = "",
        positions: bool = False,
    ) -> Op[CommitResult]:
        """commit()'s script call; with the Bloom seen-set only ``commit()`` can send it."""
        k, p = self.keys, self.politeness
        caps = f"{p.max_pending}:{p.max_pending_per_slot}"
        args: list[Any] = [caps, p.keep_priority, p.throttle, self.tag, commit_id]
        args += ["1" if positions else "0", len(acks)]
        for ack in acks:
            args += [ack.id, ack.token]
        args.append(len(entries))
        for e in entries:
            args += [e.kind, e.fingerprint, e.slot, e.priority, e.payload, e.raw]
        args.append(len(feedback))
        for f in feedback:
            args += list(f)
        keys = k.script_keys("commit", self.tag)
        return Op("commit", keys, args, _parse_commit)

    def add_seen(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Mark fingerprints seen without queueing anything (URLs crawled elsewhere);
        True for each one that was new."""
        return [bool(x) for x in self._seen("add", fingerprints)]

    def has_seen(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Whether each fingerprint is (probably, for the Bloom filter) in the seen-set."""
        return [bool(x) for x in self._seen("has", fingerprints)]

    def _seen(self, op: str, fingerprints: Sequence[bytes]) -> list[int]:
        if not fingerprints:
            return []
        args: list[Any] = [op, *fingerprints]
        if self.bloom is not None:
            return list(self.bloom.run(self.scripts.seen, [], args))
        return list(self.scripts.seen(keys=[self.keys.seen], args=args))

    def lease_op(
        self,
        count: int,
        lease_ms: int,
        *,
        promote: int = 1000,
        held: Mapping[str, int] | None = None,
        worker_timeout_ms: int = 10_000,
        reserve: int = 0,
        reserved: Mapping[str, int] | None = None,
    ) -> Op[LeaseResult]:
        """Lease up to ``count`` requests from the slots whose turn has come, after moving
        up to ``promote`` due retries into the queue. ``held``: how many requests of each
        slot the caller already holds, for the fair share of a contended slot, which is
        divided among the workers whose last liveness beat is younger than
        ``worker_timeout_ms``. ``reserve``: how many reserves the caller may hold per slot
        (``reserved``: how many it holds); ``held`` counts only requests holding places."""
        k, p = self.keys, self.politeness
        mine = json.dumps(dict(held), separators=(",", ":")) if held else ""
        ahead = json.dumps(dict(reserved), separators=(",", ":")) if reserved else ""
        nonce = int.from_bytes(os.urandom(4), "big")
        keys = k.script_keys("lease")
        args = [
            *(count, lease_ms, promote, p.scan, p.delay_ms, p.concurrency),
            *(p.overrides, p.robots, mine, self._tag_bytes, nonce, worker_timeout_ms),
            *(reserve, ahead),
        ]
        return Op("lease", keys, args, _parse_lease)

    #: ``lease_op`` sent on its own (the scheduler's batches send ``lease_op`` itself)
    lease = _sent_alone(lease_op)

    def sent(self, paced: Sequence[tuple[str, int]]) -> int:
        """Report that requests of slots with a delay, leased at the given server times,
        were sent only now: their slots' next turns move back by the lag (sent.lua)."""
        if not paced:
            return 0
        return self.run(self.sent_op(paced))

    def sent_op(self, paced: Sequence[tuple[str, int]]) -> Op[int]:
        args = [x for slot, leased_at in paced for x in (slot, leased_at)]
        return Op("sent", self.keys.script_keys("sent"), args, int)

    def delay_ms(self, slot: str) -> int:
        """The slot's delay from the settings (DOWNLOAD_SLOTS, else the default)."""
        override = self._overrides.get(slot)
        if override and override[0] >= 0:
            return int(override[0])
        return self.politeness.delay_ms

    def record_crawl_delay(self, slot: str, delay_ms: int, *, fetched: bool) -> float:
        """Record a slot's robots.txt Crawl-delay; returns how long (s) the request that
        waited for robots.txt must still wait, when this worker downloaded it."""
        k = self.keys
        wait = self.scripts.robots(
            keys=k.script_keys("robots"),
            args=[slot, delay_ms, "fetched" if fetched else "known", self.delay_ms(slot)],
        )
        return int(wait) / 1000

    def redrive(self, moves: Sequence[Redrive]) -> int:
        """Move dead-letter records back to work (redrive.lua); one call per page of records,
        so that Redis is never held for the whole list."""
        if not moves:
            return 0
        k = self.keys
        args: list[Any] = []
        for move in moves:
            args += [move.at, move.record, move.kind, move.slot, move.priority, move.payload]
        keys = k.script_keys("redrive")
        return int(self.scripts.redrive(keys=keys, args=args))

    def places(self, freed: Sequence[LeaseRef], taken: Sequence[LeaseRef] = ()) -> tuple[int, int]:
        """Report places (lua/places.lua): the ``freed`` requests left the downloader, so
        their places are given back ahead of their acknowledgements; the ``taken`` reserves
        were sent in places freed so. Returns how many places were freed and taken (leases no
        longer held under these tokens count for neither)."""
        if not (freed or taken):
            return 0, 0
        return self.run(self.places_op(freed, taken))

    def places_op(
        self, freed: Sequence[LeaseRef], taken: Sequence[LeaseRef] = ()
    ) -> Op[tuple[int, int]]:
        k = self.keys
        keys = k.script_keys("places")
        args = [len(freed), *_pairs(freed), *_pairs(taken)]
        return Op("places", keys, args, _parse_places)

    def renew(self, refs: Iterable[LeaseRef], lease_ms: int) -> int:
        """Extend the leases still held under these tokens; returns how many were."""
        refs = list(refs)
        if not refs:
            return 0
        return self.run(self.renew_op(refs, lease_ms))

    def renew_op(self, refs: Iterable[LeaseRef], lease_ms: int) -> Op[int]:
        k = self.keys
        return Op("renew", k.script_keys("renew"), [lease_ms, *_pairs(refs)], int)

    def _requeue_keys(self) -> list[str]:
        return self.keys.script_keys("requeue")

    def requeue_expired(self, limit: int = 1000, worker_timeout_ms: int = 10_000) -> RequeueResult:
        """Requeue expired leases, then the leases of workers whose liveness beats are older
        than ``worker_timeout_ms``. The start_urls claims of workers no longer alive go back
        to ``start_urls`` in a second round trip, only when there are such claims."""
        result = self.run(self.requeue_op(limit, worker_timeout_ms))
        if result.orphan_claims:
            result = result._replace(unclaimed=self.unclaim_orphans(result.orphan_claims))
        return result

    def requeue_op(self, limit: int = 1000, worker_timeout_ms: int = 10_000) -> Op[RequeueResult]:
        args = ["expired", limit, worker_timeout_ms]
        return Op("requeue", self._requeue_keys(), args, _parse_requeue)

    def release(self, refs: Iterable[LeaseRef]) -> int:
        """Give leases back (pause, close): requeued at once, if still held under these
        tokens; returns how many were."""
        refs = list(refs)
        if not refs:
            return 0
        return self.run(self.release_op(refs))

    def release_op(self, refs: Iterable[LeaseRef]) -> Op[int]:
        args = ["ids", 0, 0, *_pairs(refs)]
        return Op("requeue", self._requeue_keys(), args, _first_int)

    def wait_op(self, seconds: float) -> Op[bool]:
        """Wait up to ``seconds`` for a wake-up token (``FrontierKeys.wake``); True if one
        came. Blocks the connection: only an idle worker's poll sends it."""
        k = self.keys
        return Op("", [], ["BLPOP", k.wake_of(self.tag), k.wake, f"{seconds:.3f}"], _is_not_none)

    def alive_op(self) -> Op[int]:
        """One liveness beat of this worker (alive.lua; see liveness.py), to ride with a
        batch; returns the server time written."""
        return Op("alive", self.keys.script_keys("alive"), [self.tag], int)

    def drained(self) -> Drained:
        """Whether the crawl is out of work, for idle close: start URLs waiting, requests
        queued or leased, and when the next retry is due (server clock)."""
        k = self.keys
        pipe = self.client.pipeline(transaction=True)
        pipe.llen(k.start_urls)
        pipe.zcard(k.queue)
        pipe.zcard(k.leases)
        pipe.zrange(k.delayed, 0, 0, withscores=True)
        pipe.scard(k.claimants)
        values = execute_timed(self.client, pipe, k.queue)
        start_urls, queued, leased, first, claimants, (seconds, micros) = values
        next_retry = None
        if first:
            next_retry = max(0, int(first[0][1]) - (seconds * 1000 + micros // 1000))
        return Drained(int(start_urls), int(queued), int(leased), next_retry, int(claimants))

    def robots_txt(self, netloc: str) -> tuple[float, int, bytes] | None:
        """(age in seconds, HTTP status, body) of a netloc's shared robots.txt; status 0 means
        the download failed (read as "allowed", like Scrapy). The age is taken against the
        TIME of the server that stamped the entry, never this host's clock, so that workers
        with skewed clocks agree on when it expires."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.robots_txt(netloc))
        value, (seconds, micros) = execute_timed(self.client, pipe, self.keys.robots_txt(netloc))
        if value is None:
            return None
        head, _, body = value.partition(b"\n")
        fetched, _, status = head.partition(b" ")
        return seconds + micros / 1e6 - float(fetched), int(status), body

    def lock_robots_txt(self, netloc: str, ttl_ms: int) -> bool:
        return bool(self.client.set(self.keys.robots_lock(netloc), worker_id(), nx=True, px=ttl_ms))

    def store_robots_txt(
        self, netloc: str, status: int, body: bytes, *, ttl_ms: int = 86_400_000
    ) -> None:
        """Share a downloaded robots.txt for ``ttl_ms``, stamped with the server's TIME
        (robots_store.lua), and free the download lock."""
        self.scripts.robots_store(
            keys=self.keys.script_keys("robots_store", netloc),
            args=[ttl_ms, status, body],
        )

    def pending_room(self) -> int | None:
        """How many more start URLs the pending cap allows (None: no cap published)."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(k.settings, "max_pending")
        pipe.zcard(k.queue)
        pipe.llen(k.start_urls)
        cap, queued, waiting = pipe.execute()
        if cap is None:
            return None
        return max(0, int(cap) - int(queued) - int(waiting))

    def set_limit(self, slot: str, delay: float | None, concurrency: int | None) -> None:
        """A cluster-wide override for one slot, applied from the next lease on; both None
        removes it (the settings apply again)."""
        if delay is None and concurrency is None:
            self.client.hdel(self.keys.limits, slot)
            return
        value = f"{'' if delay is None else int(delay * 1000)}:{concurrency or ''}"
        self.client.hset(self.keys.limits, slot, value)

    def slot_states(self, limit: int = 20, scan: int = 10_000) -> list[dict[str, Any]]:
        """The politeness state of the slots with the most requests queued or in flight,
        among at most ``scan`` slots with queued requests and ``scan`` with requests in
        flight: a broad crawl has millions, and reading them all in one reply would hold
        Redis (``slot_count`` says how many there are)."""
        k = self.keys
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
        pipe = self.client.pipeline(transaction=False)
        ordered = sorted(names)
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
            cap, share = _throttle_state(state)
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
        out.sort(key=lambda d: (-(d["queued"] + d["in_flight"]), d["slot"]))
        return out[:limit]

    def sweep_slots(self, grace_ms: int = 60_000, count: int = 100) -> SweepResult:
        """Forget the politeness state of up to ``count`` slots per per-slot HASH that
        have nothing queued or in flight and whose turn is ``grace_ms`` past (sweep.lua)."""
        return self.run(self.sweep_op(grace_ms, count))

    def sweep_op(self, grace_ms: int = 60_000, count: int = 100) -> Op[SweepResult]:
        return Op("sweep", self.keys.script_keys("sweep"), [count, grace_ms], _parse_sweep)

    def slot_count(self) -> int:
        """Slots with requests queued plus slots with requests in flight (a slot with both
        counts twice): how many ``slot_states`` would have to look at."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.ready)
        pipe.hlen(self.keys.inflight)
        return sum(int(x) for x in pipe.execute())

    def publish_settings(self, *, max_pending: int | None) -> None:
        """Values producers need (``distcrawl push`` refuses work past the pending cap)."""
        if max_pending:
            self.client.hset(self.keys.settings, "max_pending", max_pending)
        else:
            self.client.hdel(self.keys.settings, "max_pending")

    def record_layout(self, fields: Mapping[str, str]) -> dict[str, str]:
        """Record each field of the frontier's layout that ``<ns>:meta`` lacks, and return
        the record as it then stands (distcrawl/layout.py). One transaction, so that two
        workers starting at once cannot each record their own."""
        pipe = self.client.pipeline(transaction=True)
        for name, value in fields.items():
            pipe.hsetnx(self.keys.meta, name, value)
        pipe.hgetall(self.keys.meta)
        stored: dict[bytes, bytes] = pipe.execute()[-1]
        return {k.decode(): v.decode(errors="replace") for k, v in stored.items()}

    def claim_start_urls(self, count: int) -> list[bytes]:
        """Claim up to ``count`` of the oldest entries for this worker (lua/claim.lua), oldest
        first: each moves to this worker's claim list in O(1), so no other worker reads it,
        and commit() removes it from there atomically with the request made from it, so a
        worker killed in between loses nothing (its claims go back when it is found dead).
        Call it only once the entries of the previous claim are stored: what the claim list
        still holds then (held back at the pending cap, or claimed by a call whose reply was
        lost) is handed out again first."""
        return self.run(self.claim_op(count))

    def claim_op(self, count: int, *, then_wait: bool = False) -> Op[list[bytes]]:
        """Claim up to ``count`` start_urls entries; ``then_wait``: a ``wait_op`` follows in
        the same pipeline, which a claim then ends at once."""
        k = self.keys
        keys = k.script_keys("claim", self.tag)
        return Op("claim", keys, [count, self.tag, "1" if then_wait else ""], list)

    def unclaim(self) -> int:
        """Give this worker's claimed entries back to ``start_urls``, to be taken next
        (close, pause): they were not stored and another worker may take them; returns how
        many."""
        return self.run(self.unclaim_op("own", [self.tag]))

    def unclaim_orphans(self, tags: Sequence[str]) -> int:
        """Give the claims of these workers back to ``start_urls`` if they are still not
        alive (requeue.lua found them lapsed); returns how many entries went back."""
        return self.run(self.unclaim_op("orphans", tags))

    def unclaim_op(self, mode: str, tags: Sequence[str]) -> Op[int]:
        k = self.keys
        keys = [*k.script_keys("unclaim"), *(k.claims(tag) for tag in tags)]
        return Op("unclaim", keys, [mode, *tags], int)

    def claim_keys(self) -> list[str]:
        """The claim lists of the workers registered in ``claimants`` (for a reset)."""
        tags: set[bytes] = self.client.smembers(self.keys.claimants)  # type: ignore[assignment]
        return [self.keys.claims(tag) for tag in worker_tags(sorted(tags))]

    def sizes(self) -> dict[str, int]:
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(k.queue)
        pipe.zcard(k.leases)
        pipe.zcard(k.delayed)
        pipe.scard(k.seen)
        pipe.hgetall(k.bloom)
        pipe.llen(k.start_urls)
        pipe.llen(k.dead)
        queue, leases, delayed, seen, bloom, start_urls, dead = pipe.execute()
        return {
            "queue": queue,
            "leased": leases,
            "delayed": delayed,
            "seen": seen + BloomState.parse(bloom).count,
            "start_urls": start_urls,
            "dead": dead,
        }

    def netloc_keys(self) -> list[bytes]:
        """The per-netloc keys (robots.txt and its download lock): found by SCAN, which only
        the operator's reset pays for."""
        return list(self.client.scan_iter(match=self.keys.robots_txt_pattern, count=1000))

    def clear(self) -> int:
        """Remove the crawl's keys with UNLINK: a seen-set or queue of millions is freed in
        the background instead of holding Redis while every worker waits."""
        bloom = BloomState.parse(self.client.hgetall(self.keys.bloom))
        if self.bloom is not None:
            self.bloom.state = None  # re-read (and re-create) on the next commit
        per_netloc = self.netloc_keys()
        removed = 0
        for at in range(0, len(per_netloc), 1000):
            removed += int(self.client.unlink(*per_netloc[at : at + 1000]))
        fixed = (*self.keys.all(), *part_keys(self.keys, bloom), *self.claim_keys())
        return removed + int(self.client.unlink(*fixed))
