"""A batch of frontier work over a sharded frontier (``DISTCRAWL_SHARDS`` above 1).

The same batch as batch.py's, each step sent to the shards it concerns: a lease, a renewal or
an acknowledgement to the shard its request came from, a slot's report to the slot's shard,
a new request to its site's shard, claims and the idle wait to the crawl's own keys. The steps
still share one pipeline where nothing orders them. What orders them is the crawl's rule that
nothing is lost: a request is acknowledged only once all it produced is stored, so a commit
whose children go to other shards than its acknowledgements runs in two phases (shards.py,
``Shards.plan``), the second only once the first succeeded everywhere; and a start URL leaves
its worker's claim list (crawl-wide) only once its shard stored it.

Workers lease across shards by each shard's next-due hint: a shard that had nothing is asked
again when its earliest slot turn or retry is due, at the latest after ``RECHECK_EMPTY``, or
at once when a wake-up token or this worker's own commit says work arrived there; the shards
asked share the batch's count in turns, so none starves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster

from distcrawl._batch_types import NO_WAIT, Batch, BatchResult, Commit
from distcrawl.batch import Runner, _filler, _ignore, _setter, _Step, refused_entry
from distcrawl.frontier import Frontier
from distcrawl.ops import Op
from distcrawl.queue_entry import LeaseRef
from distcrawl.records import START_KINDS, EntryKind
from distcrawl.refusals import refused, reply_code
from distcrawl.replicas import RECHECK, ReplicaWatch
from distcrawl.replies import (
    BadLease,
    CommitResult,
    LeaseResult,
    Places,
    RequeueResult,
    SweepResult,
)
from distcrawl.shards import CommitPart, Fan, Shards, merge_commits

#: a shard that had nothing to lease is asked again after at most this long (s)
RECHECK_EMPTY = 1.0

_MISSING = object()


def _sum_places(values: list[Places]) -> Places:
    return Places(sum(v.freed for v in values), sum(v.taken for v in values))


def _sum_ints(values: list[Any]) -> int:
    return sum(int(v) for v in values)


def _sum_requeue(values: list[RequeueResult]) -> RequeueResult:
    claims: list[str] = []
    for v in values:
        claims += [t for t in v.orphan_claims if t not in claims]
    return RequeueResult(
        sum(v.requeued for v in values),
        sum(v.orphans for v in values),
        max((v.dead_workers for v in values), default=0),
        sum(v.released for v in values),
        orphan_claims=tuple(claims),
    )


def _sum_sweeps(values: list[SweepResult]) -> SweepResult:
    return SweepResult(
        sum(v.forgotten for v in values),
        sum(v.looked for v in values),
        all(v.wrapped for v in values),
    )


def _of_shard(shard: int) -> Callable[[LeaseResult], LeaseResult]:
    """Marks a shard's leased requests with the shard they must be acknowledged in."""

    def mark(lease: LeaseResult) -> LeaseResult:
        items = [item._replace(shard=shard) for item in lease.items]
        bad = [BadLease(b.ref._replace(shard=shard), b.raw, b.reason) for b in lease.bad]
        return lease._replace(items=items, bad=bad)

    return mark


class ShardedRunner(Runner):
    """Runs batches for one worker over every shard of the crawl; on the Redis thread."""

    def __init__(
        self,
        shards: Shards,
        *args: Any,
        wait_replicas: int = 0,
        wait_replicas_ms: int = 1000,
        replica_recheck: float = RECHECK,
        **kwargs: Any,
    ) -> None:
        super().__init__(shards.crawl, *args, **kwargs)
        self.shards = shards
        #: DISTCRAWL_WAIT_REPLICAS: a commit's first phase must reach this many replicas
        #: (or the timeout pass) before its acknowledgements are sent
        self.wait_replicas = wait_replicas
        self.wait_replicas_ms = wait_replicas_ms
        #: which nodes have the replicas to answer a WAIT (none after a failover, often)
        self.replica_watch = ReplicaWatch(wait_replicas, recheck=replica_recheck)
        #: monotonic time from which each shard may have something to lease
        self._due = [0.0] * shards.count
        #: monotonic time of each shard's next slot turn or retry, as its last lease said
        self._hint: list[float | None] = [None] * shards.count
        #: each shard's queue length, as its last lease said
        self._queued = [0] * shards.count
        self._turn = 0

    # -- leasing across shards ---------------------------------------------------------------

    def _lease_plan(self, want: int, now: float) -> list[tuple[int, int]]:
        """(shard, count) pairs: the shards due now share ``want`` in turns; when none is
        due, the one due first is asked."""
        n = self.shards.count
        due = [i for i in range(n) if self._due[i] <= now]
        if not due:
            due = [min(range(n), key=lambda i: self._due[i])]
        self._turn = (self._turn + 1) % n
        due.sort(key=lambda i: (i - self._turn) % n)
        base, extra = divmod(want, len(due))
        plan = [(s, base + (1 if k < extra else 0)) for k, s in enumerate(due)]
        return [(s, c) for s, c in plan if c > 0]

    def _lease_fan(self, batch: Batch) -> Fan[LeaseResult]:
        now = time.monotonic()
        plan = self._lease_plan(batch.want, now)
        ops: list[Op[Any]] = []
        for shard, count in plan:
            op = self.shards.parts[shard].lease_op(
                count,
                self.lease_ms,
                held=batch.held,
                worker_timeout_ms=self.worker_timeout_ms,
                reserve=batch.reserve,
                reserved=batch.reserved,
            )
            ops.append(Op(op.script, op.keys, op.args, _compose(op.parse, _of_shard(shard))))

        def merge(values: list[LeaseResult]) -> LeaseResult:
            later = time.monotonic()
            for (shard, count), lease in zip(plan, values, strict=True):
                self._hint[shard] = None if lease.wait is None else later + lease.wait
                self._queued[shard] = lease.queue_size
                if len(lease.items) + len(lease.bad) < count:
                    wait = RECHECK_EMPTY if lease.wait is None else min(lease.wait, RECHECK_EMPTY)
                    self._due[shard] = later + wait
                else:
                    self._due[shard] = later
            # when some shard's slot turn or retry comes: only the shards' own hints, so that
            # a crawl with nothing queued anywhere waits for a wake-up token (batch.py)
            hints = [h - later for h in self._hint if h is not None]
            for lease in values:
                for item in lease.items:
                    self.shards.learn(item.slot, item.shard)
            first = values[0]
            return LeaseResult(
                [item for lease in values for item in lease.items],
                sum(self._queued),
                sum(lease.delayed for lease in values),
                sum(lease.released for lease in values),
                max(0.0, min(hints)) if hints else None,
                first.leased_at,
                sum(lease.quarantined for lease in values),
                sum(lease.missing_retries for lease in values),
                sum(lease.rearmed for lease in values),
                [bad for lease in values for bad in lease.bad],
            )

        return Fan(ops, merge)

    def arrived(self, shards: Sequence[int] | None = None) -> None:
        """Work arrived in these shards (every shard: None): ask them at the next lease."""
        for shard in range(self.shards.count) if shards is None else shards:
            self._due[shard] = 0.0

    # -- the batch ---------------------------------------------------------------------------

    def run(self, batch: Batch) -> BatchResult:
        res = BatchResult()
        sh, crawl = self.shards, self.shards.crawl
        fans: list[tuple[Fan[Any], list[Any], Callable[[Any], None]]] = []

        def fanned(fan: Fan[Any], done: Callable[[Any], None]) -> list[_Step]:
            values: list[Any] = [_MISSING] * len(fan.ops)
            fans.append((fan, values, done))
            return [_Step(op, _filler(values, i)) for i, op in enumerate(fan.ops)]

        before = self._wait_steps(batch, res)
        if batch.sent:
            before += fanned(sh.sent_fan(batch.sent), _ignore)
        if batch.freed or batch.taken:
            before += fanned(self._places_fan(batch.freed, batch.taken), self._placed(res))
        after: list[_Step] = []
        #: dead letters waiting in each shard's quarantine (read with the reclaim)
        waiting: list[int] = []
        if batch.release:
            fan = sh.refs_fan(batch.release, Frontier.release_op, _sum_ints)
            after += fanned(fan, _setter(res, "released"))
        if batch.unclaim:
            after.append(_Step(crawl.unclaim_op("own", [crawl.tag]), _setter(res, "unclaimed")))
        if batch.renew:
            fan = sh.refs_fan(
                batch.renew, lambda f, refs: f.renew_op(refs, self.lease_ms), _sum_ints
            )
            after += fanned(fan, _setter(res, "renewed"))
        if batch.reclaim:
            timeout = self.worker_timeout_ms
            requeue = sh.every_fan(lambda f: f.requeue_op(worker_timeout_ms=timeout), _sum_requeue)
            after += fanned(requeue, _setter(res, "requeue"))
            sweep = Fan([f.sweep_op() for f in sh.parts], _sum_sweeps)
            after += fanned(sweep, _setter(res, "swept"))
            # the shards' quarantines, read in the same round trip; moved after it
            lengths = Fan([Op("", [], ["LLEN", f.keys.dead], int) for f in sh.parts], list)
            after += fanned(lengths, waiting.extend)
        if batch.want:
            if batch.wait > 0:
                # an idle poll: its wait may end with a token for work in any shard
                self.arrived()
            for commit in batch.commits:
                # the lease follows the commit in Redis: it finds what the commit stores
                self.arrived(
                    [p.shard for phase in self._phases(commit) for p in phase if p.entries]
                )
            after += fanned(self._lease_fan(batch), self._leased(res))
        if batch.peek and not batch.wait > 0:
            after.append(_Step(crawl.claim_op(batch.peek), _setter(res, "peeked")))
        after += self._generation_steps(batch, res)
        if batch.beat and self.liveness is not None:
            after += fanned(sh.every_fan(Frontier.alive_op, _sum_ints), self._beaten(res))
        after += self._rider_steps(batch, res)

        down = self._commit_and_send(batch, before, after, res)
        for fan, values, done in fans:
            if all(v is not _MISSING for v in values):
                done(fan.merge(values))
        if res.woken:
            self.arrived()
        if res.requeue is not None and res.requeue.orphan_claims and not down:
            try:
                unclaimed = crawl.unclaim_orphans(res.requeue.orphan_claims)
                res.requeue = res.requeue._replace(unclaimed=unclaimed)
            except redis.RedisError as exc:
                res.error = res.error or exc
                down = not isinstance(exc, redis.ResponseError)
        if batch.reclaim and not down and any(waiting):
            down = self._move_dead(res, [i for i, n in enumerate(waiting) if n])
        if not down:
            down = self._rejoin(res)
        if batch.drain and not down:
            try:
                res.drained = sh.drained()
            except redis.RedisError as exc:
                res.error = res.error or exc
        self._read_memory(res)
        return res

    def _frontiers(self) -> list[Frontier]:
        return [self.shards.crawl, *self.shards.parts]

    def _places_fan(self, freed: list[LeaseRef], taken: list[LeaseRef]) -> Fan[Places]:
        by_freed, by_taken = self.shards.by_shard(freed), self.shards.by_shard(taken)
        ops = [
            self.shards.parts[s].places_op(by_freed.get(s, []), by_taken.get(s, []))
            for s in sorted(set(by_freed) | set(by_taken))
        ]
        return Fan(ops, _sum_places)

    @staticmethod
    def _placed(res: BatchResult) -> Callable[[Places], None]:
        def done(out: Places) -> None:
            res.freed, res.taken = out.freed, out.taken

        return done

    def _move_dead(self, res: BatchResult, shards: list[int]) -> bool:
        """Move the quarantined dead letters of these shards to the crawl's; whether Redis
        is down."""
        try:
            for shard in shards:
                res.dead_moved += self.shards.move_dead(shard)
        except redis.RedisError as exc:
            res.error = res.error or exc
            return not isinstance(exc, redis.ResponseError)
        return False

    # -- commits -----------------------------------------------------------------------------

    def _commit_and_send(
        self, batch: Batch, before: list[_Step], after: list[_Step], res: BatchResult
    ) -> bool:
        """Send the batch's steps around its commits; returns whether Redis is unreachable."""
        alone = len(batch.commits) > 1 or self.frontier.bloom is not None
        alone = alone or any(c.split for c in batch.commits)
        if not batch.commits:
            return self._send(before + after, res)
        if alone:
            return self._commit_alone(batch, before, after, res)
        (commit,) = batch.commits
        phases = self._phases(commit)
        pending = before
        for phase in phases:
            results: list[Any] = [_MISSING] * len(phase)
            steps = [
                _Step(self._part_op(part), _filler(results, i), commit=True)
                for i, part in enumerate(phase)
            ]
            if self.wait_replicas and len(phases) > 1 and phase is phases[0]:
                down = self._send(pending, res) or self._send_waited(steps, res)
            else:
                down = self._send(pending + steps, res)
            pending = []
            for part, result in zip(phase, results, strict=True):
                if result is not _MISSING:
                    commit.parts_done[part.id] = result
            if down or any(r is _MISSING for r in results):
                return down or self._send(after, res)
        self._finish(commit, res, pending)
        return self._send(pending + after, res)

    def _send_waited(self, steps: list[_Step], res: BatchResult) -> bool:
        """Send a first phase with a WAIT behind it on each node it wrote to, on the
        connection that wrote: a failover then cannot keep the acknowledgement that follows
        and lose the children (Redis replicates asynchronously). On a single server the
        shards share one replication stream, in order, so one WAIT covers them."""
        client = self.frontier.client
        try:
            if not isinstance(client, RedisCluster):
                return self._send_to_node("", client, steps, res)
            groups: dict[str, list[_Step]] = {}
            nodes: dict[str, Any] = {}
            for st in steps:
                node = client.get_node_from_key(st.op.keys[0])
                groups.setdefault(node.name, []).append(st)
                nodes[node.name] = node
            for name, group in groups.items():
                node_client = client.get_redis_connection(nodes[name])
                if self._send_to_node(name, node_client, group, res):
                    return True
        finally:
            res.replica_changes += self.replica_watch.take_changes()
        if res.commit_error is not None and reply_code(res.commit_error) == "MOVED":
            # a slot moved: the node's own client does not follow; the next try asks anew
            client.nodes_manager.initialize()
        return False

    def _send_to_node(self, name: str, client: Any, steps: list[_Step], res: BatchResult) -> bool:
        """``steps`` to one node, with a WAIT behind them unless the node has fewer
        connected replicas than DISTCRAWL_WAIT_REPLICAS (replicas.py): then the commit goes
        unreplicated at once instead of after the whole timeout."""
        if not self.replica_watch.should_wait(name, lambda: client.info("replication")):
            res.wait_skipped += 1
            res.replicas = 0
            return self._send(steps, res, client=client)
        before, res.replicas = res.replicas, NO_WAIT
        try:
            down = self._send(steps, res, client=client, wait=self._wait)
            if res.replicas != NO_WAIT:
                self.replica_watch.waited(name, res.replicas)
            return down
        finally:
            res.replicas = min(before, res.replicas)

    @property
    def _wait(self) -> tuple[int, int]:
        return (self.wait_replicas, self.wait_replicas_ms)

    def _phases(self, commit: Commit) -> list[list[CommitPart]]:
        """The commit's phases, made once, less the parts already stored."""
        if commit.phases is None:
            commit.phases = self.shards.plan(
                commit.id, commit.acks, commit.entries, commit.feedback
            )
        return [[p for p in phase if p.id not in commit.parts_done] for phase in commit.phases]

    def _part_op(self, part: CommitPart) -> Op[CommitResult]:
        return self.shards.parts[part.shard].commit_op(
            part.acks, part.entries, part.feedback, commit_id=part.id, positions=True
        )

    def _stored(self, commit: Commit) -> tuple[CommitResult, list[_Step]]:
        """Every part of ``commit`` is stored: its result, and the step that takes the start
        URLs stored out of the claim list (sent before any next claim); the shards that got
        work are asked at the next lease."""
        parts = [p for phase in commit.phases or [] for p in phase]
        results = [commit.parts_done[p.id] for p in parts]
        for part, result in zip(parts, results, strict=True):
            self._queued[part.shard] = result.queue_size
        self.arrived(sorted({p.shard for p, r in zip(parts, results, strict=True) if r.enqueued}))
        committed = merge_commits(parts, results)
        raws = stored_start_entries(commit, committed)
        steps = [_Step(self.frontier.claimed_op(raws), _ignore)] if raws else []
        if committed.enqueued:
            # the shards' scripts wake nobody (idle workers wait on the crawl's list)
            steps += [_Step(op, _ignore) for op in self.frontier.wake_ops(committed.enqueued)]
        return committed, steps

    def _finish(self, commit: Commit, res: BatchResult, steps: list[_Step]) -> None:
        res.committed, claimed = self._stored(commit)
        res.commits_done = 1
        steps += claimed

    def commit(self, commit: Commit, res: BatchResult) -> CommitResult:
        """One commit on its own, part by part (the Bloom seen-set, several commits in a batch,
        or one Redis refused for its content, whose parts are stored piece by piece)."""
        for phase in self._phases(commit):
            for part in phase:
                frontier = self.shards.parts[part.shard]
                if commit.split:
                    result = self._split_part(frontier, part, res)
                else:
                    result = frontier.commit(
                        part.acks, part.entries, part.feedback, commit_id=part.id, positions=True
                    )
                commit.parts_done[part.id] = result
        committed, claimed = self._stored(commit)
        for step in claimed:
            self.frontier.run(step.op)
        return committed

    def _split_part(self, frontier: Frontier, part: CommitPart, res: BatchResult) -> CommitResult:
        """A part stored one entry at a time; an entry Redis refuses is dead-lettered. Each
        entry's id follows from its place, so a retry after a lost reply is seen as a replay
        (the shard remembers only its last commit: a retry may store earlier entries twice,
        deduplicated by the seen-set)."""
        total = CommitResult()
        for at, entry in enumerate(part.entries):
            piece_id = f"{part.id}:{at}"
            try:
                total += frontier.commit([], [entry], commit_id=piece_id)
            except redis.ResponseError as exc:
                if not refused(exc):
                    raise
                res.split_dead += 1
                dead = refused_entry(entry, str(exc))
                if entry.kind is EntryKind.SHARD_START:
                    dead = dead._replace(kind=EntryKind.DEAD_LETTER)
                total += frontier.commit([], [dead], commit_id=piece_id + ":dead")
        return total + frontier.commit(part.acks, [], part.feedback, commit_id=part.id)


def stored_start_entries(commit: Commit, result: CommitResult) -> list[bytes]:
    """The raw start_urls entries of ``commit`` that are stored (or dead-lettered, or found
    duplicates): all but those held back at the pending cap, which stay claimed."""
    held = {-p - 1 for p in result.not_stored if p < 0}
    return [
        e.raw
        for at, e in enumerate(commit.entries)
        if e.kind in START_KINDS and e.raw and at not in held
    ]


def _compose(first: Callable[[Any], Any], then: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def both(reply: Any) -> Any:
        return then(first(reply))

    return both
