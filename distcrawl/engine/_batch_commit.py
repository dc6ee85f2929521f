"""A batch's commit, with one shard or many: its parts, the round trips they take, and the
split of a commit Redis refuses for its content (the rules are batch.py's).

A commit is stored as phases of per-shard parts (shards.py, ``Shards.plan``): with one shard,
or with everything in one shard, one part, sent in the batch's one pipeline. A commit whose
children go to other shards than its acknowledgements runs in two phases, the second only
once the first succeeded everywhere; a start URL leaves its worker's claim list
(crawl-wide) only once its shard stored it, and the shards' scripts wake nobody, so those
steps follow the last phase. With one shard the commit script does both itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from redis.cluster import RedisCluster

from distcrawl.engine._batch_send import Step, filler, ignore
from distcrawl.engine._batch_types import NO_WAIT, BatchResult, Commit
from distcrawl.engine.replicas import RECHECK, ReplicaWatch
from distcrawl.engine.sharded_batch import ShardLeases, stored_start_entries
from distcrawl.model.frontier import Frontier
from distcrawl.model.records import Entry
from distcrawl.model.refusals import refused, reply_code
from distcrawl.model.replies import CommitResult
from distcrawl.model.shards import CommitPart, Shards, in_shard, merge_commits

_MISSING = object()

#: sends steps in one pipeline (batch.py's ``Runner._send``), whether Redis is unreachable
Send = Callable[..., bool]


class Commits:
    """The commits of one worker's batches: ``send`` sends steps, ``refused_entry`` makes
    the dead letter of an entry Redis refuses (batch.py)."""

    def __init__(
        self,
        shards: Shards,
        leases: ShardLeases,
        send: Send,
        refused_entry: Callable[[Entry, str], Entry],
        *,
        wait_replicas: int = 0,
        wait_replicas_ms: int = 1000,
        replica_recheck: float = RECHECK,
    ) -> None:
        self.shards = shards
        self.leases = leases
        self._send = send
        self._refused_entry = refused_entry
        #: DISTCRAWL_WAIT_REPLICAS: a commit's first phase must reach this many replicas
        #: (or the timeout pass) before its acknowledgements are sent (shards only: with one
        #: shard a commit is one script, replicated whole)
        self.wait_replicas = wait_replicas
        self.wait_replicas_ms = wait_replicas_ms
        #: which nodes have the replicas to answer a WAIT (none after a failover, often)
        self.replica_watch = ReplicaWatch(wait_replicas, recheck=replica_recheck)

    def phases(self, commit: Commit) -> list[list[CommitPart]]:
        """The commit's phases, made once, less the parts already stored."""
        if commit.phases is None:
            commit.phases = self.shards.plan(
                commit.id, commit.acks, commit.entries, commit.feedback
            )
        return [[p for p in phase if p.id not in commit.parts_done] for phase in commit.phases]

    def send_around(
        self, commit: Commit, before: list[Step], after: list[Step], res: BatchResult
    ) -> bool:
        """``before``, the commit's phases, then ``after``: with one shard all in one
        pipeline; returns whether Redis is unreachable."""
        phases = self.phases(commit)
        # with one shard nothing follows the commit's parts: the rest rides with them
        riding = not self.shards.sharded
        pending = before
        for phase in phases:
            results: list[Any] = [_MISSING] * len(phase)
            steps = [
                Step(self._part_op(part), filler(results, i), commit=True)
                for i, part in enumerate(phase)
            ]
            last = phase is phases[-1]
            if self.wait_replicas and self.shards.sharded and phase is not phases[-1]:
                down = self._send(pending, res) or self._send_waited(steps, res)
            elif riding and last:
                down = self._send(pending + steps + after, res)
                after = []
            else:
                down = self._send(pending + steps, res)
            pending = []
            for part, result in zip(phase, results, strict=True):
                if result is not _MISSING:
                    commit.parts_done[part.id] = result
            if down or any(r is _MISSING for r in results):
                return down or self._send(after, res)
        res.committed, pending = self._stored(commit)
        res.commits_done = 1
        return self._send(pending + after, res)

    def _send_waited(self, steps: list[Step], res: BatchResult) -> bool:
        """Send a first phase with a WAIT behind it on each node it wrote to, on the
        connection that wrote: a failover then cannot keep the acknowledgement that follows
        and lose the children (Redis replicates asynchronously). On a single server the
        shards share one replication stream, in order, so one WAIT covers them."""
        client = self.shards.crawl.client
        try:
            if not isinstance(client, RedisCluster):
                return self._send_to_node("", client, steps, res)
            groups: dict[str, list[Step]] = {}
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

    def _send_to_node(self, name: str, client: Any, steps: list[Step], res: BatchResult) -> bool:
        """``steps`` to one node, with a WAIT behind them unless the node has fewer
        connected replicas than DISTCRAWL_WAIT_REPLICAS (replicas.py): then the commit goes
        unreplicated at once instead of after the whole timeout."""
        if not self.replica_watch.should_wait(name, lambda: client.info("replication")):
            res.wait_skipped += 1
            res.replicas = 0
            return self._send(steps, res, client=client)
        before, res.replicas = res.replicas, NO_WAIT
        try:
            wait = (self.wait_replicas, self.wait_replicas_ms)
            down = self._send(steps, res, client=client, wait=wait)
            if res.replicas != NO_WAIT:
                self.replica_watch.waited(name, res.replicas)
            return down
        finally:
            res.replicas = min(before, res.replicas)

    def _part_op(self, part: CommitPart) -> Any:
        return self.shards.parts[part.shard].commit_op(
            part.acks, part.entries, part.feedback, commit_id=part.id, positions=True
        )

    def _stored(self, commit: Commit) -> tuple[CommitResult, list[Step]]:
        """Every part of ``commit`` is stored: its result, and the steps that take the start
        URLs stored out of the claim list (sent before any next claim) and wake idle workers
        (none with one shard: the commit script did both); the shards that got work are
        asked at the next lease."""
        parts = [p for phase in commit.phases or [] for p in phase]
        results = [commit.parts_done[p.id] for p in parts]
        if not self.shards.sharded:
            # one part, or the pieces of a commit over COMMIT_CALL_MAX (shards.py)
            return (results[0] if len(parts) == 1 else merge_commits(parts, results)), []
        for part, result in zip(parts, results, strict=True):
            self.leases.queued[part.shard] = result.queue_size
        done = sorted({p.shard for p, r in zip(parts, results, strict=True) if r.enqueued})
        self.leases.arrived(done)
        committed = merge_commits(parts, results)
        crawl = self.shards.crawl
        raws = stored_start_entries(commit, committed)
        steps = [Step(crawl.claimed_op(raws), ignore)] if raws else []
        if committed.enqueued:
            # the shards' scripts wake nobody (idle workers wait on the crawl's list)
            steps += [Step(op, ignore) for op in crawl.wake_ops(committed.enqueued)]
        return committed, steps

    def alone(self, commit: Commit, res: BatchResult) -> CommitResult:
        """One commit on its own, part by part (the Bloom seen-set, several commits in a batch,
        or one Redis refused for its content, whose parts are stored piece by piece)."""
        for phase in self.phases(commit):
            for part in phase:
                frontier = self.shards.parts[part.shard]
                if commit.split:
                    result = self._split_part(frontier, commit, part, res)
                else:
                    result = frontier.commit(
                        part.acks, part.entries, part.feedback, commit_id=part.id, positions=True
                    )
                commit.parts_done[part.id] = result
        committed, follow = self._stored(commit)
        for step in follow:
            self.shards.crawl.run(step.op)
        return committed

    def _split_part(
        self, frontier: Frontier, commit: Commit, part: CommitPart, res: BatchResult
    ) -> CommitResult:
        """A part's entries stored by halves, then its acknowledgements, once every entry
        before them is stored. ``commit.stored`` counts the leading entries of the part
        being split that are stored (a retry goes on from there)."""
        if commit.splitting != part.id:
            commit.splitting, commit.stored = part.id, 0
        total = CommitResult()
        for piece in self._pieces(frontier, commit, part, len(part.entries) - commit.stored, res):
            total += piece
        return total + frontier.commit(part.acks, [], part.feedback, commit_id=part.id)

    def _pieces(
        self, frontier: Frontier, commit: Commit, part: CommitPart, count: int, res: BatchResult
    ) -> list[CommitResult]:
        """Store the next ``count`` entries of a split part by halves, until each piece is
        stored or is a single entry that Redis refuses, which is dead-lettered instead. Each
        piece's id follows from its place, so a piece sent again after a lost reply is seen
        as the replay it is, and a retry of the whole goes on after the pieces stored."""
        if count <= 0:
            return []
        at = commit.stored
        piece = part.entries[at : at + count]
        piece_id = f"{part.id}:{at}:{count}"
        try:
            done = frontier.commit([], piece, commit_id=piece_id)
        except redis.ResponseError as exc:
            if not refused(exc):
                raise
            if count > 1:
                half = count // 2
                return self._pieces(frontier, commit, part, half, res) + self._pieces(
                    frontier, commit, part, count - half, res
                )
            res.split_dead += 1
            dead = self._refused_entry(piece[0], str(exc))
            if frontier is not self.shards.crawl:
                dead = in_shard(dead)  # a shard's dead letter holds no claim of the crawl's
            done = frontier.commit([], [dead], commit_id=piece_id + ":dead")
        commit.stored += count
        return [done]
