"""One batch of frontier work, run on the crawler's Redis thread, with one shard or many.

The scheduler (scheduler.py) decides on the reactor what a batch holds; this module runs it
against Redis and hands back what happened. The steps go in one pipeline of EVALSHA calls,
one round trip per batch (under a busy reactor every round trip also waits for the GIL), each
reply read by the same code as the Frontier method it stands for. Keeping it apart means nothing
here touches Scrapy's engine or the scheduler's buffers, and every Redis failure is turned
into a result instead of an exception crossing threads.

The rules that make a crash lose nothing live in the shape of a batch (its types, re-exported
here, are in _batch_types.py):

- a commit acknowledges a request only once everything the request produced is stored: its
  acknowledgement waits (``Ack.after``) until the entries pushed before it are in this
  commit or an earlier one, however many batches that takes;
- a commit carries an id and is sent again unchanged until it succeeds, so a commit whose
  reply was lost is recognised by Redis as a replay and changes nothing;
- a commit Redis refuses twice for its content is split to find the entry that breaks it,
  which goes to the dead letters with the reason; the rest is stored;
- renewals and the other steps run even when the commit fails for its content.

With shards (``DISTCRAWL_SHARDS``) each step goes to the shards it concerns (sharded_batch.py)
and a commit may take two phases (_batch_commit.py); one shard is ``Shards.single``, whose
every step has one part, sent as it is: the same one round trip.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from distcrawl.codec.serialize import DecodeError, RequestCodec
from distcrawl.engine._batch_commit import Commits
from distcrawl.engine._batch_send import Step, failed, filler, ignore, send, setter
from distcrawl.engine._batch_types import Batch, BatchResult, Commit, LeasedRequest, RedisMemory
from distcrawl.engine.replicas import RECHECK
from distcrawl.engine.sharded_batch import (
    ShardLeases,
    sum_ints,
    sum_places,
    sum_requeue,
    sum_sweeps,
)
from distcrawl.model.connection import execute_timed, node_info
from distcrawl.model.deadrecord import dead_letter
from distcrawl.model.frontier import Frontier
from distcrawl.model.layout import Joined, generation_op
from distcrawl.model.ops import Op
from distcrawl.model.queue_entry import Leased, LeaseRef
from distcrawl.model.records import START_KINDS, Entry, EntryKind
from distcrawl.model.refusals import outage_code
from distcrawl.model.replies import (
    CommitResult,
    Drained,
    Finished,
    LeaseResult,
    Places,
    sum_runnable,
)
from distcrawl.model.shards import Fan, Shards

if TYPE_CHECKING:
    from distcrawl.engine.liveness import Liveness

#: times a commit is refused for its content before it is split
SPLIT_AFTER = 2

_MISSING = object()


def _text(reply: Any) -> str | None:
    return reply.decode() if isinstance(reply, bytes) else reply


def _out_of_work(drained: Drained) -> bool:
    """Nothing waits anywhere in the crawl, not even a retry or a revisit for later, and it
    had work: finish.lua may decide it is finished."""
    return drained.worked and drained.next_retry_ms is None and drained.idle(0)


@dataclass(eq=False)
class Runner:
    """Runs batches for one worker: ``Runner.run`` is called on the Redis thread only.

    ``frontier`` is the crawl's own keys; ``shards`` its shards (``Shards.single(frontier)``
    unless given)."""

    frontier: Frontier
    codec: RequestCodec
    _: KW_ONLY
    lease_ms: int
    worker_timeout_ms: int
    #: DISTCRAWL_ALLOWED_SCHEMES: anyone who can write to Redis can queue any URL
    schemes: tuple[str, ...] = ("http", "https")
    #: told of the beats that ride with batches (Batch.beat), so that its own thread
    #: beats only when no batch did lately
    liveness: Liveness | None = None
    #: the crawl this worker joined (set once it has): its generation is checked with the
    #: batches that take work in, and a reset is noticed (layout.py)
    joined: Joined | None = None
    shards: Shards | None = None
    #: DISTCRAWL_WAIT_REPLICAS and its timeout (shards only, _batch_commit.py)
    wait_replicas: int = 0
    wait_replicas_ms: int = 1000
    replica_recheck: float = RECHECK
    #: how long an election to reap holds (ms): DISTCRAWL_RECLAIM_INTERVAL for busy workers,
    #: IDLE_REAP_INTERVAL for parked ones
    reclaim_ms: int = 2000
    idle_reap_ms: int = 30_000
    #: DISTCRAWL_FINISH_WEBHOOK is set: a completion event's delivery is tracked in Redis
    webhook: bool = False
    leases: ShardLeases = field(init=False)
    commits: Commits = field(init=False)

    def __post_init__(self) -> None:
        if self.shards is None:
            self.shards = Shards.single(self.frontier)
        elif self.shards.crawl is not self.frontier:
            raise ValueError("the runner's frontier is its shards' crawl")
        self.leases = ShardLeases(self.shards, self.lease_ms, self.worker_timeout_ms)
        self.commits = Commits(
            self.shards,
            self.leases,
            self._send,
            refused_entry,
            wait_replicas=self.wait_replicas,
            wait_replicas_ms=self.wait_replicas_ms,
            replica_recheck=self.replica_recheck,
        )

    @property
    def sh(self) -> Shards:
        assert self.shards is not None
        return self.shards

    def arrived(self, shards: list[int] | None = None) -> None:
        """Work arrived in these shards (every shard: None): ask them at the next lease."""
        self.leases.arrived(shards)

    def run(self, batch: Batch) -> BatchResult:
        """Run ``batch``: its steps go in one pipeline of EVALSHA calls, one round trip with
        one shard, unless the commits must run one at a time (several, a split one, or the
        Bloom seen-set, whose state may need reading around the script): then the steps
        before them share one pipeline and those after another. With shards, a commit in two
        phases and the steps that follow it take a round trip each."""
        res = BatchResult()
        sh, crawl = self.sh, self.frontier
        fans: list[tuple[Fan[Any], list[Any], Callable[[Any], None]]] = []

        def fanned(fan: Fan[Any], done: Callable[[Any], None]) -> list[Step]:
            if len(fan.ops) == 1:
                # one part: its reply read as it comes (always so with one shard)
                (op,) = fan.ops
                merge = fan.merge
                return [Step(op, lambda value: done(merge([value])))]
            values: list[Any] = [_MISSING] * len(fan.ops)
            fans.append((fan, values, done))
            return [Step(op, filler(values, i)) for i, op in enumerate(fan.ops)]

        before: list[Step] = []
        if batch.sent:
            before += fanned(sh.sent_fan(batch.sent), ignore)
        if batch.freed or batch.taken:
            before += fanned(self._places_fan(batch.freed, batch.taken), self._placed(res))
        after: list[Step] = []
        #: dead letters waiting in each shard's quarantine (read with the reclaim)
        waiting: list[int] = []
        if batch.release:
            wake = batch.hand_over

            def release(f: Frontier, refs: list[LeaseRef]) -> Op[int]:
                return f.release_op(refs, wake=wake)

            fan = sh.refs_fan(batch.release, release, sum_ints)
            after += fanned(fan, setter(res, "released"))
        if batch.unclaim:
            # after the commits, which take from the claim list what they store
            unclaim = crawl.unclaim_op("own", [crawl.tag])
            after.append(Step(unclaim, setter(res, "unclaimed")))
        if batch.renew:
            fan = sh.refs_fan(
                batch.renew, lambda f, refs: f.renew_op(refs, self.lease_ms), sum_ints
            )
            after += fanned(fan, setter(res, "renewed"))
        #: the reaper's steps, sent in a round trip of their own once this worker was
        #: elected for this interval (an election step in ``after``)
        reap: list[Step] = []
        elected: list[bool] = []
        if batch.reclaim:
            after.append(Step(self._election_op(idle=False), elected.append))
            reap = self._reap_steps(res, fanned, waiting)
        elif batch.idle_reap:
            after.append(Step(self._election_op(idle=True), elected.append))
        if batch.drain and sh.sharded and not batch.reclaim:
            # before an idle close: the shards' quarantined dead letters go to the crawl's
            after += fanned(self._dead_lengths(), waiting.extend)
        if batch.want:
            if sh.sharded:
                if batch.woken:
                    # woken from a park: the token may be for work in any shard
                    self.arrived()
                for commit in batch.commits:
                    # the lease follows the commit in Redis: it finds what the commit stores
                    phases = self.commits.phases(commit)
                    self.arrived([p.shard for phase in phases for p in phase if p.entries])
            after += fanned(self.leases.fan(batch), self._leased(res))
        if batch.peek:
            after.append(Step(crawl.claim_op(batch.peek), setter(res, "peeked")))
        after += self._generation_steps(batch, res)
        if batch.beat and self.liveness is not None:
            after += fanned(sh.every_fan(Frontier.alive_op, sum_ints), self._beaten(res))
        after += self._rider_steps(batch, res)

        alone = len(batch.commits) > 1 or crawl.bloom is not None
        alone = alone or any(c.split for c in batch.commits)
        if not batch.commits:
            down = self._send(before + after, res)
        elif alone:
            down = self._commit_alone(batch, before, after, res)
        else:
            down = self.commits.send_around(batch.commits[0], before, after, res)
        if elected and elected[0] and not down:
            if batch.idle_reap:
                reap = self._idle_reap(res, fanned, waiting)
            if reap:
                down = self._send(reap, res)
        for fan, values, done in fans:
            if all(v is not _MISSING for v in values):
                done(fan.merge(values))
        if sh.sharded and res.runnable is not None and not down:
            # the shards counted (reaped above): the crawl's keys add its start URLs and
            # mirror the sum where KEDA reads it
            crawl_op = crawl.runnable_op(others=res.runnable.requests)
            down = self._send([Step(crawl_op, setter(res, "runnable"))], res)
        requeued = res.requeue.requeued if res.requeue is not None else 0
        if batch.hand_over and sh.sharded:
            requeued += res.released  # the shards' scripts woke their own lists: nobody's
        if requeued and not down:
            # parked workers wait for wake-up tokens, not for a poll: leases given back are
            # work for them as much as a commit's requests
            down = self._send([Step(op, ignore) for op in crawl.wake_ops(requeued)], res)
        if res.requeue is not None and res.requeue.orphan_claims and not down:
            # rare: workers found dead held start_urls claims; unclaim.lua checks again
            try:
                unclaimed = crawl.unclaim_orphans(res.requeue.orphan_claims)
                res.requeue = res.requeue._replace(unclaimed=unclaimed)
            except redis.RedisError as exc:
                down = failed(res, exc)
        if (batch.reclaim or batch.idle_reap or batch.drain) and not down and any(waiting):
            down = self._move_dead(res, [i for i, n in enumerate(waiting) if n])
        if not down:
            down = self._rejoin(res)
        if batch.drain and not down:
            # a transaction of its own (its reads must agree), and only when closing idle
            # or out of work
            try:
                res.drained = sh.drained()
                if _out_of_work(res.drained):
                    res.finished = self._finish(res.drained)
            except redis.RedisError as exc:
                failed(res, exc)
        self._read_memory(res)
        return res

    def _finish(self, drained: Drained) -> Finished | None:
        """The whole crawl looked out of work: finish.lua decides, atomically with its own
        reads, and records the run's one completion event (None: not finished, or another
        worker's call did it first)."""
        sh, crawl = self.sh, self.frontier
        elsewhere = drained.claimants
        if not sh.sharded:
            return crawl.run(crawl.finish_op(elsewhere=elsewhere, webhook=self.webhook))
        # the shards number their requests: the run's signature is their counters summed
        pipe = crawl.client.pipeline(transaction=False)
        for f in sh.parts:
            pipe.get(f.keys.seq)
        signature = sum(int(n or 0) for n in pipe.execute())
        op = crawl.finish_op(
            elsewhere=elsewhere + drained.queued + drained.leased,
            signature=signature,
            worked=drained.worked,
            webhook=self.webhook,
        )
        return crawl.run(op)

    def _read_memory(self, res: BatchResult) -> None:
        """When Redis refused the batch for being full, how full: the scheduler's one line
        about it says so (INFO memory, a round trip only while the outage lasts)."""
        if not any(outage_code(e) == "OOM" for e in (res.commit_error, res.error) if e):
            return
        try:
            info = node_info(self.frontier.client, "memory", self.frontier.keys.queue)
        except redis.RedisError:
            return  # INFO not granted, or Redis gone meanwhile: the line says less
        res.memory = RedisMemory(
            int(info.get("used_memory", 0)),
            int(info.get("maxmemory", 0)),
            str(info.get("maxmemory_policy", "")),
        )

    def _generation_steps(self, batch: Batch, res: BatchResult) -> list[Step]:
        """The read of the crawl's generation (layout.py), with the batches that take work
        in (leases, claims) and the periodic reclaim, after their claim and lease: what they
        took was in Redis before the read, so a claim of the next crawl's first start URL
        comes with the read that shows the reset before it. A parked worker's look for dead
        workers' work reads it too: it notices a reset within ``IDLE_REAP_INTERVAL``."""
        reads = batch.want or batch.peek or batch.reclaim or batch.idle_reap
        if self.joined is None or not reads:
            return []

        def done(generation: str | None) -> None:
            res.generation = generation
            res.generation_read = True

        return [Step(generation_op(self.frontier.keys), done)]

    def _rejoin(self, res: BatchResult) -> bool:
        """Join the crawl that is there now when the batch found another generation (the
        frontier was reset); returns whether Redis is unreachable."""
        if self.joined is None or not res.generation_read:
            return False
        try:
            res.rejoined = self.joined.rejoin(res.generation, self.frontier.record_layout)
        except redis.RedisError as exc:
            return failed(res, exc)
        if res.rejoined is not None:
            for part in self.sh.frontiers:
                if part.bloom is not None:
                    part.bloom.state = None  # its layers went with the old crawl: read again
        return False

    def _election_op(self, *, idle: bool) -> Op[bool]:
        """``SET <reaper key> <tag> NX PX <interval>``: true for the one worker that reaps
        this interval. Busy workers share ``reaper`` (``DISTCRAWL_RECLAIM_INTERVAL``), parked
        ones ``reaper:idle`` (``IDLE_REAP_INTERVAL``), so a parked worker's turn never delays
        a busy one's."""
        k = self.frontier.keys
        key, ms = (k.reaper_idle, self.idle_reap_ms) if idle else (k.reaper, self.reclaim_ms)
        return Op("", [], ["SET", key, self.frontier.tag, "NX", "PX", ms], bool)

    def _reap_steps(
        self,
        res: BatchResult,
        fanned: Callable[[Fan[Any], Callable[[Any], None]], list[Step]],
        waiting: list[int],
    ) -> list[Step]:
        """The reaper's steps: expired leases and dead workers' leases back to the queue
        (requeue.lua, every shard), finished slots' state forgotten at the same pace (sweep.lua,
        a page at a time), and the shards' quarantines read (moved after the round trip)."""
        sh, timeout = self.sh, self.worker_timeout_ms
        requeue = sh.every_fan(lambda f: f.requeue_op(worker_timeout_ms=timeout), sum_requeue)
        steps = fanned(requeue, setter(res, "requeue"))
        steps += fanned(Fan([f.sweep_op() for f in sh.parts], sum_sweeps), setter(res, "swept"))
        # the autoscaling signal: one shard counts and mirrors; shards count and the crawl's
        # own keys (its start URLs) add them up and mirror, once they are read (run())
        runnable = Fan([f.runnable_op(mirror=not sh.sharded) for f in sh.parts], sum_runnable)
        steps += fanned(runnable, setter(res, "runnable"))
        if self.webhook:
            # a completion event whose webhook its worker did not deliver (killed, or the
            # endpoint down through every retry): this worker tries (engine/webhook.py)
            pending = Op("", [], ["HGET", self.frontier.keys.lifecycle, "webhook"], _text)
            steps.append(Step(pending, setter(res, "webhook_pending")))
        if sh.sharded:
            steps += fanned(self._dead_lengths(), waiting.extend)
        return steps

    def _dead_lengths(self) -> Fan[list[int]]:
        """The lengths of the shards' dead-letter quarantines (moved after the round trip)."""
        return Fan([Op("", [], ["LLEN", f.keys.dead], int) for f in self.sh.parts], list)

    def _idle_reap(
        self,
        res: BatchResult,
        fanned: Callable[[Fan[Any], Callable[[Any], None]], list[Step]],
        waiting: list[int],
    ) -> list[Step]:
        """A parked worker elected for this interval: whether the reaper's steps are needed,
        read first with plain commands on an idle frontier of one shard (a script's every
        call counts, and an idle worker's budget is one command a second): the server's TIME,
        the earliest lease deadline, the oldest liveness beat, the claimants not alive and
        the slots whose state a sweep would look at. With shards, the reaper's steps."""
        if self.sh.sharded:
            return self._reap_steps(res, fanned, waiting)
        k = self.frontier.keys
        client = self.frontier.client
        pipe = client.pipeline(transaction=False)
        pipe.zrange(k.leases, 0, 0, withscores=True)
        pipe.zrange(k.alive, 0, 0, withscores=True)
        pipe.zdiff([k.claimants, k.alive])
        pipe.hlen(k.slots)
        try:
            # TIME last: on a cluster it is sent to the keys' node after the pipeline
            leases, alive, orphans, slots, (seconds, micros) = execute_timed(client, pipe, k.leases)
        except redis.RedisError as exc:
            failed(res, exc)
            return []
        now = int(seconds) * 1000 + int(micros) // 1000
        expired = bool(leases) and float(leases[0][1]) <= now
        dead = bool(alive) and float(alive[0][1]) < now - self.worker_timeout_ms
        if expired or dead or orphans or slots:
            return self._reap_steps(res, fanned, waiting)
        return []

    @staticmethod
    def _rider_steps(batch: Batch, res: BatchResult) -> list[Step]:
        """The riders' ops, each reply filled in ``res.riders`` (a connection error until
        it comes)."""
        steps: list[Step] = []
        for rider in batch.riders:
            replies: list[Any] = [redis.ConnectionError("not sent: Redis unreachable")] * len(
                rider.ops
            )
            res.riders.append(replies)
            for i, op in enumerate(rider.ops):
                steps.append(Step(op, filler(replies, i), rider=True))
        return steps

    def _places_fan(self, freed: list[LeaseRef], taken: list[LeaseRef]) -> Fan[Places]:
        sh = self.sh
        if not sh.sharded:
            return Fan([sh.crawl.places_op(freed, taken)], sum_places)
        by_freed, by_taken = sh.by_shard(freed), sh.by_shard(taken)
        ops = [
            sh.parts[s].places_op(by_freed.get(s, []), by_taken.get(s, []))
            for s in sorted(set(by_freed) | set(by_taken))
        ]
        return Fan(ops, sum_places)

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
                res.dead_moved += self.sh.move_dead(shard)
        except redis.RedisError as exc:
            return failed(res, exc)
        return False

    def _commit_alone(
        self, batch: Batch, before: list[Step], after: list[Step], res: BatchResult
    ) -> bool:
        """The steps before the commits, the commits one at a time (each only if the one
        before succeeded), then the steps after; returns whether Redis is unreachable."""
        down = self._send(before, res)
        if not down:
            for commit in batch.commits:
                try:
                    done = self.commit(commit, res)
                except redis.RedisError as exc:
                    res.commit_error = exc
                    down = not isinstance(exc, redis.ResponseError)
                    break
                res.committed = done if res.committed is None else res.committed + done
                res.commits_done += 1
        return down or self._send(after, res)

    def _send(
        self,
        steps: list[Step],
        res: BatchResult,
        *,
        client: Any = None,
        wait: tuple[int, int] | None = None,
    ) -> bool:
        """``steps`` in one pipeline (_batch_send.py); whether Redis is unreachable."""
        return send(self.frontier, steps, res, client=client, wait=wait)

    def _leased(self, res: BatchResult) -> Callable[[LeaseResult], None]:
        def done(lease: LeaseResult) -> None:
            res.lease = lease
            res.leased = [self._decode(item) for item in lease.items]
            res.leased += [
                LeasedRequest(bad.ref, None, bad.raw, "", False, bad.reason) for bad in lease.bad
            ]

        return done

    def _beaten(self, res: BatchResult) -> Callable[[int], None]:
        def done(stamp: int) -> None:
            res.beat = True
            if self.liveness is not None:
                # one shard: the server's time alive.lua wrote (summed over several)
                self.liveness.noted(() if self.sh.sharded else (stamp,))

        return done

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
        """One commit on its own (several in a batch run one after another, each only if
        the one before succeeded); a split one piece by piece (_batch_commit.py)."""
        return self.commits.alone(commit, res)


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
    if entry.kind in START_KINDS:
        record = dead_letter(text, raw=entry.raw, source="start_urls")
        return Entry(EntryKind.BAD_START, b"", 0, record, entry.raw)
    carries_request = entry.kind in (EntryKind.REQUEST, EntryKind.RETRY, EntryKind.REVISIT)
    payload = base64.b64encode(entry.payload).decode("ascii") if carries_request else None
    url = getattr(entry.request, "url", None)
    record = dead_letter(text, url=url, source="commit", payload=payload, priority=entry.priority)
    return Entry(EntryKind.DEAD_LETTER, b"", 0, record)
