"""What a batch of frontier work holds, and what comes back from running it.

Plain data that crosses threads: the scheduler builds a ``Batch`` on the reactor, a runner
(batch.py) runs it on the Redis thread and hands back a ``BatchResult``.
Kept apart from the runners so that the rules written into these shapes (a commit's id, its
acknowledgements that wait for the entries pushed before them) read on their own, next to no
Redis code. ``distcrawl.engine.batch`` re-exports every name here: import them from there.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis
from scrapy import Request

from distcrawl.engine.replicas import ReplicaChange
from distcrawl.model.layout import Rejoined
from distcrawl.model.ops import Op
from distcrawl.model.queue_entry import LeaseRef
from distcrawl.model.records import START_KINDS, Entry, Feedback
from distcrawl.model.replies import (
    CommitResult,
    Drained,
    Finished,
    LeaseResult,
    RequeueResult,
    Runnable,
    SweepResult,
)


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
    #: leading entries of the part being split (``splitting``, its id) stored so far: a
    #: retry goes on from there (with one shard the part is the whole commit)
    stored: int = 0
    splitting: str = ""
    #: the parts stored so far, by part id, with their results (a retry sends only the
    #: others: a shard's replay check knows only its last commit)
    parts_done: dict[str, CommitResult] = field(default_factory=dict)
    #: its phases of per-shard parts, made once (shards.py, ``Shards.plan``; one part with
    #: one shard)
    phases: list[list[Any]] | None = None

    @property
    def start_entries(self) -> int:
        return sum(1 for e in self.entries if e.kind in START_KINDS)


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
class Rider:
    """Commands of another component (the monitor's heartbeat, extensions.py) that go in a
    batch's pipeline instead of costing a round trip of their own: an idle worker's batch
    runs about once a second, and so do those components."""

    ops: list[Op[Any]]
    #: called on the reactor with one entry per op: its parsed reply, or the RedisError
    done: Callable[[list[Any]], None]
    #: monotonic time it was handed over, and how long it may wait for a batch to ride with
    since: float = 0.0
    wait: float = 1.0


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
    #: the leases of ``release`` are for other workers now (this one drains or closes):
    #: parked workers are woken for them; a reserve returned in passing wakes nobody
    hand_over: bool = False
    #: give this worker's claimed start_urls entries back (close, pause), after the commits
    unclaim: bool = False
    drain: bool = False
    #: a liveness beat rides along (ZADD alive, see liveness.py); never a reason to run
    beat: bool = False
    riders: list[Rider] = field(default_factory=list)
    #: the first lease after an idle worker was woken (idle.py): work may be in any shard
    woken: bool = False
    #: a parked worker's rare look for dead workers' work (``Runner.idle_reap``)
    idle_reap: bool = False

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
            or self.riders
            or self.idle_reap
        )


#: BatchResult.replicas when no WAIT was sent
NO_WAIT = 1 << 30


@dataclass(frozen=True)
class RedisMemory:
    """Redis' INFO memory, read when a batch found it full: what the operator needs to know
    to give it room."""

    used: int
    maxmemory: int
    policy: str


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
    #: finished slots whose state the reclaim's sweep forgot (sweep.lua)
    swept: SweepResult | None = None
    #: the autoscaling signal the reaper counted (runnable.lua)
    runnable: Runnable | None = None
    #: this batch's look found the crawl out of work and finished it: its completion event
    finished: Finished | None = None
    #: the reaper found a completion event whose webhook is not delivered yet (its id)
    webhook_pending: str | None = None
    #: dead letters moved from the shards' quarantines to the crawl's (Shards.move_dead)
    dead_moved: int = 0
    #: the fewest replicas a WAIT behind a commit's first phase counted (DISTCRAWL_WAIT_REPLICAS;
    #: NO_WAIT when none was sent; 0 for a node with too few replicas to wait for)
    replicas: int = NO_WAIT
    #: nodes a commit's first phase went to without a WAIT: too few replicas connected
    wait_skipped: int = 0
    #: nodes that lost, or got back, the replicas DISTCRAWL_WAIT_REPLICAS asks for
    replica_changes: list[ReplicaChange] = field(default_factory=list)
    drained: Drained | None = None
    #: the liveness beat that rode along reached Redis
    beat: bool = False
    #: per rider, per op: the parsed reply or the RedisError
    riders: list[list[Any]] = field(default_factory=list)
    #: the crawl's generation as the batch read it (None: no layout record), if it did
    generation: str | None = None
    generation_read: bool = False
    #: the generation read was not the one this worker joined: it joined the crawl there now
    rejoined: Rejoined | None = None
    #: the first failure of a step other than the commits
    error: redis.RedisError | None = None
    #: read when Redis refused the batch for being full (None otherwise, or unread)
    memory: RedisMemory | None = None
