"""One batch of frontier work, run on the crawler's Redis thread.

The scheduler (scheduler.py) decides on the reactor what a batch holds; this module runs it
against Redis, step by step, and hands back what happened. Keeping it apart means nothing
here touches Scrapy's engine or the scheduler's buffers, and every Redis failure is turned
into a result instead of an exception crossing threads.

The rules that make a crash lose nothing live in the shape of a batch:

- a commit acknowledges a request only once everything the request produced is stored: its
  acknowledgement waits (``Ack.after``) until the entries pushed before it are in this
  commit or an earlier one, however many batches that takes;
- a commit carries an id and is sent again unchanged until it succeeds, so a commit whose
  reply was lost is recognised by Redis as a replay and changes nothing;
- a commit Redis refuses twice for its content is split to find the entry that breaks it,
  which goes to the dead letters with the reason; the rest is stored;
- renewals and the other steps run even when the commit fails for its content.
"""

from __future__ import annotations

import base64
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import redis
from scrapy import Request

from distcrawl.frontier import (
    CommitResult,
    Drained,
    Entry,
    Feedback,
    Frontier,
    Leased,
    LeaseRef,
    LeaseResult,
    RequeueResult,
    dead_letter,
)
from distcrawl.serialize import DecodeError, RequestCodec

#: replies that say Redis cannot take any commit right now, not that this one is bad
TRANSIENT_REPLIES = (
    "OOM",
    "BUSY",
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
    "NOSCRIPT",
    "EXECABORT",
    "NOAUTH",
    "WRONGPASS",
    "NOPERM",
)
_TRANSIENT = re.compile(r"(?<![A-Za-z])(" + "|".join(TRANSIENT_REPLIES) + r")(?![A-Za-z])")
#: times a commit is refused for its content before it is split
SPLIT_AFTER = 2

T = TypeVar("T")


def refused(exc: BaseException) -> bool:
    """Whether Redis refused a commit for what it holds (a script error), as opposed to
    being unreachable, busy, out of memory or read-only, when any commit would fail."""
    if not isinstance(exc, redis.ResponseError):
        return False
    # a script's error wraps the reply of the command that failed inside it
    return _TRANSIENT.search(str(exc)) is None


class Ack(NamedTuple):
    """A lease to acknowledge once ``after`` entries have left the scheduler's buffer (all
    that were pushed before its request was done)."""

    ref: LeaseRef
    after: int


@dataclass
class Commit:
    acks: list[LeaseRef]
    entries: list[Entry]
    feedback: list[Feedback]
    id: str = field(default_factory=lambda: os.urandom(8).hex())
    failures: int = 0
    #: refused for its content SPLIT_AFTER times: run piece by piece
    split: bool = False
    #: leading entries a split commit has stored so far (a retry goes on from there)
    stored: int = 0

    @property
    def start_entries(self) -> int:
        return sum(1 for e in self.entries if e.kind in "sx")


class LeasedRequest(NamedTuple):
    ref: LeaseRef
    #: None when the entry could not be decoded (``error`` says why)
    request: Request | None
    payload: bytes
    slot: str
    paced: bool
    error: str = ""
    #: holds no place: sent only in the place of a request of its slot (Leased.reserve)
    reserve: bool = False


@dataclass
class Batch:
    #: run in order, each only if the previous succeeded (several only when closing)
    commits: list[Commit] = field(default_factory=list)
    sent: list[tuple[str, int]] = field(default_factory=list)
    #: leases that left the downloader: their places are given back before the ack
    freed: list[LeaseRef] = field(default_factory=list)
    #: reserves sent in places freed so (Frontier.places)
    taken: list[LeaseRef] = field(default_factory=list)
    renew: list[LeaseRef] = field(default_factory=list)
    reclaim: bool = False
    want: int = 0
    held: Counter[str] = field(default_factory=Counter)
    #: reserves the worker may hold per slot, and those it holds
    reserve: int = 0
    reserved: Counter[str] = field(default_factory=Counter)
    #: start_urls entries to claim (Frontier.claim_start_urls)
    peek: int = 0
    release: list[LeaseRef] = field(default_factory=list)
    #: give this worker's claimed start_urls entries back (close, pause), after the commits
    unclaim: bool = False
    drain: bool = False

    def empty(self) -> bool:
        return not (
            self.commits
            or self.sent
            or self.freed
            or self.taken
            or self.renew
            or self.reclaim
            or self.want
            or self.peek
            or self.release
            or self.unclaim
            or self.drain
        )


@dataclass
class BatchResult:
    #: totals of the commits that succeeded (None: none did)
    committed: CommitResult | None = None
    #: how many of the batch's commits succeeded, in order
    commits_done: int = 0
    commit_error: redis.RedisError | None = None
    #: entries a split commit sent to the dead letters
    split_dead: int = 0
    renewed: int = 0
    #: places given back for requests that left the downloader, and taken by reserves
    freed: int = 0
    taken: int = 0
    requeue: RequeueResult | None = None
    released: int = 0
    lease: LeaseResult | None = None
    leased: list[LeasedRequest] = field(default_factory=list)
    #: start_urls entries claimed, oldest first
    peeked: list[bytes] = field(default_factory=list)
    #: claimed start_urls entries given back (Batch.unclaim)
    unclaimed: int = 0
    drained: Drained | None = None
    #: the first failure of a step other than the commits
    error: redis.RedisError | None = None


class Runner:
    """Runs batches for one worker: ``Runner.run`` is called on the Redis thread only."""

    def __init__(
        self,
        frontier: Frontier,
        codec: RequestCodec,
        *,
        lease_ms: int,
        worker_timeout_ms: int,
        schemes: tuple[str, ...] = ("http", "https"),
    ) -> None:
        self.frontier = frontier
        self.codec = codec
        #: DISTCRAWL_ALLOWED_SCHEMES: anyone who can write to Redis can queue any URL
        self.schemes = schemes
        self.lease_ms = lease_ms
        self.worker_timeout_ms = worker_timeout_ms

    def run(self, batch: Batch) -> BatchResult:
        res = BatchResult()
        frontier = self.frontier
        down = False  # unreachable: the steps left would only wait for their own time-out

        def step(call: Callable[[], T]) -> T | None:
            nonlocal down
            if down:
                return None
            try:
                return call()
            except redis.RedisError as exc:
                if res.error is None:
                    res.error = exc
                down = not isinstance(exc, redis.ResponseError)
                return None

        if batch.sent:
            step(lambda: frontier.sent(batch.sent))
        if batch.freed or batch.taken:
            res.freed, res.taken = step(lambda: frontier.places(batch.freed, batch.taken)) or (0, 0)
        for commit in batch.commits:
            if down:
                break
            try:
                done = self.commit(commit, res)
            except redis.RedisError as exc:
                res.commit_error = exc
                down = not isinstance(exc, redis.ResponseError)
                break
            res.committed = done if res.committed is None else res.committed + done
            res.commits_done += 1
        if batch.release:
            res.released = step(lambda: frontier.release(batch.release)) or 0
        if batch.unclaim:
            res.unclaimed = step(frontier.unclaim) or 0
        if batch.renew:
            res.renewed = step(lambda: frontier.renew(batch.renew, self.lease_ms)) or 0
        if batch.reclaim:
            res.requeue = step(
                lambda: frontier.requeue_expired(worker_timeout_ms=self.worker_timeout_ms)
            )
        if batch.want:
            res.lease = step(
                lambda: frontier.lease(
                    batch.want,
                    self.lease_ms,
                    held=batch.held,
                    worker_timeout_ms=self.worker_timeout_ms,
                    reserve=batch.reserve,
                    reserved=batch.reserved,
                )
            )
            if res.lease is not None:
                res.leased = [self._decode(item) for item in res.lease.items]
                res.leased += [
                    LeasedRequest(bad.ref, None, bad.raw, "", False, bad.reason)
                    for bad in res.lease.bad
                ]
        if batch.peek:
            res.peeked = step(lambda: frontier.claim_start_urls(batch.peek)) or []
        if batch.drain:
            res.drained = step(frontier.drained)
        return res

    def _decode(self, item: Leased) -> LeasedRequest:
        try:
            request = self.codec.decode(item.payload)
        except DecodeError as exc:
            return LeasedRequest(item.ref, None, item.payload, item.slot, False, str(exc))
        why = refused_scheme(request.url, self.schemes)
        if why is not None:
            return LeasedRequest(item.ref, None, item.payload, item.slot, False, why)
        return LeasedRequest(
            item.ref, request, item.payload, item.slot, item.paced, reserve=item.reserve
        )

    def commit(self, commit: Commit, res: BatchResult) -> CommitResult:
        if not commit.split:
            return self.frontier.commit(
                commit.acks, commit.entries, commit.feedback, commit_id=commit.id, positions=True
            )
        total = CommitResult()
        for part in self._pieces(commit, len(commit.entries) - commit.stored, res):
            total += part
        # the acknowledgements last, once every entry before them is stored
        return total + self.frontier.commit(commit.acks, [], commit.feedback, commit_id=commit.id)

    def _pieces(self, commit: Commit, count: int, res: BatchResult) -> list[CommitResult]:
        """Store the next ``count`` entries of a split commit by halves, until each piece is
        stored or is a single entry that Redis refuses, which is dead-lettered instead. Each
        piece's id follows from its place, so a piece sent again after a lost reply is seen
        as the replay it is, and a retry of the whole goes on after the pieces stored."""
        if count <= 0:
            return []
        at = commit.stored
        piece = commit.entries[at : at + count]
        piece_id = f"{commit.id}:{at}:{count}"
        try:
            done = self.frontier.commit([], piece, commit_id=piece_id)
        except redis.ResponseError as exc:
            if not refused(exc):
                raise
            if count > 1:
                half = count // 2
                return self._pieces(commit, half, res) + self._pieces(commit, count - half, res)
            res.split_dead += 1
            done = self.frontier.commit(
                [], [refused_entry(piece[0], str(exc))], commit_id=piece_id + ":dead"
            )
        commit.stored += count
        return [done]


def refused_scheme(url: str, schemes: tuple[str, ...]) -> str | None:
    """Why ``url`` may not be downloaded (None: it may): its scheme is not in
    DISTCRAWL_ALLOWED_SCHEMES, and Scrapy would hand it to whatever download handler the
    scheme names (``file`` reads local files). The reason leaves the URL out, so that it
    can be logged as it is: the URL may hold a password."""
    # exactly what precedes the first colon: a URL that only becomes an allowed scheme once
    # cleaned up (blanks stripped, say) is refused, never the other way round
    scheme, colon, _ = url.partition(":")
    scheme = scheme.lower() if colon else ""
    if scheme in schemes:
        return None
    return f"scheme {scheme[:20]!r} not in DISTCRAWL_ALLOWED_SCHEMES ({', '.join(schemes)})"


def refused_entry(entry: Entry, reason: str) -> Entry:
    """The dead letter that replaces an entry Redis refuses: a start URL's keeps its raw
    entry (and is still taken from the worker's claim list), a request's keeps its payload."""
    text = f"Redis refused the entry: {reason}"
    if entry.kind in "sx":
        return Entry("x", b"", 0, dead_letter(text, raw=entry.raw, source="start_urls"), entry.raw)
    payload = base64.b64encode(entry.payload).decode("ascii") if entry.kind in "rl" else None
    url = getattr(entry.request, "url", None)
    record = dead_letter(text, url=url, source="commit", payload=payload, priority=entry.priority)
    return Entry("d", b"", 0, record)
