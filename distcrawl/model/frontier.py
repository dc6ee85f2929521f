"""The shared frontier: synchronous Redis operations, one round trip each.

Nothing here touches the reactor: the scheduler runs these methods on its I/O thread and
hands the results back. Each step a batch runs also exists as an ``Op`` (``commit_op``,
``lease_op``...): its script call and how its reply is read, so that the batch runner can
send a whole batch in one pipeline and read each reply exactly as the method does. Keeping
them synchronous and free of Scrapy state makes them easy to test against a real server and
to reuse from the ``distcrawl`` command.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import redis

from distcrawl.model.connection import execute_timed
from distcrawl.model.deadrecord import worker_id
from distcrawl.model.frontier_admin import FrontierAdmin, recorded_shards
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.layout import GENERATION, new_generation
from distcrawl.model.lua import SEEN_MODES, Scripts
from distcrawl.model.ops import Op, sent_alone
from distcrawl.model.queue_entry import (
    TOKEN_BYTES,
    LeaseRef,
    new_tag,
)
from distcrawl.model.records import (
    Entry,
    Feedback,
    Politeness,
    Redrive,
    slot_overrides,
)
from distcrawl.model.replies import (
    CommitResult,
    Drained,
    Finished,
    LeaseResult,
    Places,
    RequeueResult,
    RobotsTxt,
    Runnable,
    SweepResult,
    first_int,
    parse_commit,
    parse_finish,
    parse_lease,
    parse_places,
    parse_requeue,
    parse_runnable,
    parse_sweep,
)
from distcrawl.model.seen import DEFAULT_CAPACITY, DEFAULT_ERROR_RATE, BloomFilter

T = TypeVar("T")

#: due slots runnable.lua looks at in one call (bounded work; past it the count is a lower
#: bound), and the cap of the count and of the ``<ns>:runnable`` LIST mirroring it
RUNNABLE_SLOTS = 1000
RUNNABLE_MAX = 10_000
#: the events stream's approximate length cap (XADD MAXLEN ~)
EVENTS_MAX = 1000

#: as commit.lua: wake-up tokens waiting at most, and how long each waits (ms)
WAKE_MAX, WAKE_TTL_MS = 16, 1000


def _pairs(refs: Iterable[LeaseRef]) -> list[Any]:
    return [x for ref in refs for x in (ref.id, ref.token)]


def wake_idle(client: redis.Redis, keys: FrontierKeys, queued: int) -> None:
    """Wake-up tokens for ``queued`` requests that became due where no script pushed any (a
    sharded re-drive, revisits made due now), in one round trip, as lib.lua's ``wake_idle``:
    parked workers wait on the crawl's list (idle.py), not on a shard's."""
    if queued <= 0:
        return
    pipe = client.pipeline(transaction=False)
    pipe.lpush(keys.wake, *["1"] * min(queued, WAKE_MAX))
    pipe.ltrim(keys.wake, 0, WAKE_MAX - 1)
    pipe.pexpire(keys.wake, WAKE_TTL_MS)
    pipe.execute()


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
        self._overrides = slot_overrides(self.politeness.overrides)
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
        #: the operator's commands over these keys (sizes, slot states, limits, reset)
        self.admin = FrontierAdmin(client, keys, self.bloom)

    def run(self, op: Op[T]) -> T:
        """Send one Op on its own (a script falls back to EVAL after a script cache flush)."""
        if op.script == "commit" and self.bloom is not None:
            # the Bloom filter may need its state read (or grown) around the script
            return op.parse(self.bloom.run(self.scripts.commit, list(op.keys), list(op.args)))
        if op.script:
            script = getattr(self.scripts, op.script)
            return op.parse(script(keys=op.keys, args=op.args))
        return op.parse(self.client.execute_command(*op.args))

    def commit_op(
        self,
        acks: Sequence[LeaseRef],
        entries: Sequence[Entry],
        feedback: Sequence[Feedback] = (),
        *,
        commit_id: str = "",
        positions: bool = False,
    ) -> Op[CommitResult]:
        """Run one commit (commit.lua). With a ``commit_id``, running the same commit again
        (its reply was lost) changes nothing and returns ``replayed=1``; ``positions`` asks
        for the positions of the entries Redis did not store. With the Bloom seen-set only
        ``run()`` can send the Op, not a batch's pipeline: the filter's state is read (or
        grown) around the script."""
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
        return Op("commit", keys, args, parse_commit)

    #: ``commit_op`` sent on its own (the scheduler's batches send ``commit_op`` itself)
    commit = sent_alone(commit_op)

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
            *(reserve, ahead, f"{p.revisit_share:.4f}", p.reserves_per_place),
        ]
        return Op("lease", keys, args, parse_lease)

    #: ``lease_op`` sent on its own (the scheduler's batches send ``lease_op`` itself)
    lease = sent_alone(lease_op)

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

    def places(self, freed: Sequence[LeaseRef], taken: Sequence[LeaseRef] = ()) -> Places:
        """Report places (lua/places.lua): the ``freed`` requests left the downloader, so
        their places are given back ahead of their acknowledgements; the ``taken`` reserves
        were sent in places freed so. Returns how many places were freed and taken (leases no
        longer held under these tokens count for neither)."""
        if not (freed or taken):
            return Places(0, 0)
        return self.run(self.places_op(freed, taken))

    def places_op(self, freed: Sequence[LeaseRef], taken: Sequence[LeaseRef] = ()) -> Op[Places]:
        k = self.keys
        keys = k.script_keys("places")
        args = [len(freed), *_pairs(freed), *_pairs(taken)]
        return Op("places", keys, args, parse_places)

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
        return Op("requeue", self._requeue_keys(), args, parse_requeue)

    def release(self, refs: Iterable[LeaseRef], *, wake: bool = False) -> int:
        """Give leases back (pause, close): requeued at once, if still held under these
        tokens; returns how many were. ``wake``: they are for the other workers now, and
        parked ones are woken to take them."""
        refs = list(refs)
        if not refs:
            return 0
        return self.run(self.release_op(refs, wake=wake))

    def release_op(self, refs: Iterable[LeaseRef], *, wake: bool = False) -> Op[int]:
        args = ["ids", int(wake), 0, *_pairs(refs)]
        return Op("requeue", self._requeue_keys(), args, first_int)

    def wake_ops(self, queued: int) -> list[Op[Any]]:
        """Wake-up tokens for ``queued`` requests stored, as commit.lua pushes them (at most
        WAKE_MAX waiting, each for WAKE_TTL_MS): for commits made in shards, whose own wake
        lists nobody waits on."""
        wake = self.keys.wake
        return [
            Op("", [], ["LPUSH", wake, *["1"] * min(queued, WAKE_MAX)], int),
            Op("", [], ["LTRIM", wake, 0, WAKE_MAX - 1], bool),
            Op("", [], ["PEXPIRE", wake, WAKE_TTL_MS], bool),
        ]

    def wake(self, queued: int) -> None:
        """Wake idle workers for ``queued`` requests stored where no script woke them."""
        wake_idle(self.client, self.keys, queued)

    def alive_op(self) -> Op[int]:
        """One liveness beat of this worker (alive.lua; see liveness.py), to ride with a
        batch; returns the server time written."""
        return Op("alive", self.keys.script_keys("alive"), [self.tag], int)

    def drained(self) -> Drained:
        """Whether the crawl is out of work, for idle close: start URLs waiting, requests
        queued or leased, when the next retry is due (server clock), and whether it ever had
        work."""
        k = self.keys
        pipe = self.client.pipeline(transaction=True)
        pipe.zcard(k.queue)
        pipe.zcard(k.revisit_queue)
        pipe.zcard(k.leases)
        pipe.zrange(k.delayed, 0, 0, withscores=True)
        pipe.zrange(k.revisits, 0, 0, withscores=True)
        pipe.scard(k.claimants)
        pipe.exists(k.seq, k.dead)  # numbered a request, or dead-lettered one: had work
        if k.shard is None:  # a shard's transaction may touch its own slot only
            pipe.llen(k.start_urls)
        values = execute_timed(self.client, pipe, k.queue)
        queued, due, leased, retry, revisit, claimants, worked, *rest, (seconds, micros) = values
        start_urls = rest[0] if rest else 0
        # the next retry or revisit: either brings work back
        firsts = [int(first[0][1]) for first in (retry, revisit) if first]
        next_retry = None
        if firsts:
            next_retry = max(0, min(firsts) - (seconds * 1000 + micros // 1000))
        queued = int(queued) + int(due)
        if claimants and k.shard is None:
            claimants = self._holding_claims()
        return Drained(
            int(start_urls), queued, int(leased), next_retry, int(claimants), bool(worked)
        )

    def _holding_claims(self) -> int:
        """How many claimants hold claims: parked workers register before they wait for
        start URLs (distcrawl/engine/idle.py) with nothing claimed yet. An entry claimed
        after this read is its claimant's work; only whether this crawl has work now counts."""
        k = self.keys
        tags = sorted(self.client.smembers(k.claimants))
        pipe = self.client.pipeline(transaction=False)
        for tag in tags:
            name = tag.decode() if isinstance(tag, bytes) else str(tag)
            pipe.llen(k.claims(name))
        return sum(1 for n in pipe.execute() if n)

    def robots_txt(self, netloc: str) -> RobotsTxt | None:
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
        return RobotsTxt(seconds + micros / 1e6 - float(fetched), int(status), body)

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
        for part in recorded_shards(self.client, k):
            pipe.zcard(part.queue)
        cap, *sizes = pipe.execute()
        if cap is None:
            return None
        return max(0, int(cap) - sum(int(n) for n in sizes))

    def sweep_slots(self, grace_ms: int = 60_000, count: int = 100) -> SweepResult:
        """Forget the politeness state of up to ``count`` slots per per-slot HASH that
        have nothing queued or in flight and whose turn is ``grace_ms`` past (sweep.lua)."""
        return self.run(self.sweep_op(grace_ms, count))

    def sweep_op(self, grace_ms: int = 60_000, count: int = 100) -> Op[SweepResult]:
        return Op("sweep", self.keys.script_keys("sweep"), [count, grace_ms], parse_sweep)

    def finish_op(
        self,
        *,
        elsewhere: int = 0,
        signature: int | None = None,
        worked: bool = False,
        webhook: bool = False,
    ) -> Op[Finished | None]:
        """Finish the crawl if it is out of work (finish.lua): its completion event, once
        per run, or None. ``elsewhere``: work the caller saw in other shards or claims;
        ``signature`` and ``worked``: a sharded crawl's (its shards' seq summed, and whether
        any had work); ``webhook``: the event's delivery is tracked in ``lifecycle``."""
        sig = "" if signature is None else str(signature)
        args = [elsewhere, sig, "1" if worked else "", self.tag, int(webhook), EVENTS_MAX]
        return Op("finish", self.keys.script_keys("finish"), args, parse_finish)

    def runnable_op(self, *, mirror: bool = True, others: int = 0) -> Op[Runnable]:
        """How many requests the crawl could run now within its politeness (runnable.lua):
        with ``mirror``, written as the length of ``<ns>:runnable`` (with ``others``, the
        other shards' counts, added); a shard of a sharded crawl counts only."""
        p = self.politeness
        args = [p.concurrency, p.overrides, RUNNABLE_SLOTS, RUNNABLE_MAX]
        args += ["set" if mirror else "", others]
        keys = self.keys.script_keys("runnable")
        # a shard's call counts in its own slot state only (runnable.lua's header)
        return Op("runnable", keys if mirror else keys[:6], args, parse_runnable)

    def publish_settings(self, *, max_pending: int | None) -> None:
        """Values producers need (``distcrawl push`` refuses work past the pending cap)."""
        if max_pending:
            self.client.hset(self.keys.settings, "max_pending", max_pending)
        else:
            self.client.hdel(self.keys.settings, "max_pending")

    def record_layout(self, fields: Mapping[str, str]) -> dict[str, str]:
        """Record each field of the frontier's layout that ``<ns>:meta`` lacks, and return
        the record as it then stands (distcrawl/model/layout.py), with the crawl's generation
        (made here when the record has none). One transaction, so that two workers starting
        at once cannot each record their own."""
        pipe = self.client.pipeline(transaction=True)
        for name, value in {**fields, GENERATION: new_generation()}.items():
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

    def claimed_op(self, raws: Sequence[bytes]) -> Op[int]:
        """Take stored start_urls entries out of this worker's claim list (claimed.lua): the
        step after a commit in a shard, which cannot reach the crawl's claim lists."""
        keys = self.keys.script_keys("claimed", self.tag)
        return Op("claimed", keys, [self.tag, *raws], int)

    def unclaim_op(self, mode: str, tags: Sequence[str]) -> Op[int]:
        k = self.keys
        keys = [*k.script_keys("unclaim"), *(k.claims(tag) for tag in tags)]
        return Op("unclaim", keys, [mode, *tags], int)


def shard_frontiers(frontier: Frontier, count: int | None = None) -> list[Frontier]:
    """The Frontier of each shard of ``frontier``'s crawl, made as ``frontier`` is (its
    client, seen-set, politeness and tag): ``count`` shards (DISTCRAWL_SHARDS, a producer's),
    else those the layout record names (the operator's tools). With one shard, the list is
    ``[frontier]`` itself: its keys are the shard's."""
    keys = frontier.keys
    if count is None:
        parts = recorded_shards(frontier.client, keys)
    else:
        parts = [] if count == 1 else keys.parts(count)
    if not parts:
        return [frontier]
    bloom = frontier.bloom
    options: dict[str, Any] = {"tag": frontier.tag, "seen": "set" if bloom is None else "bloom"}
    if bloom is not None:
        options.update(bloom_capacity=bloom.capacity, bloom_error_rate=bloom.error_rate)
    return [Frontier(frontier.client, k, frontier.politeness, **options) for k in parts]
