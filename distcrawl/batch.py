"""One batch of frontier work, run on the crawler's Redis thread.

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
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import redis
from redis.cluster import RedisCluster

# what a batch holds and what it gives back: importable from here, where they always were
from distcrawl._batch_types import (
    Batch,
    BatchResult,
    Commit,
    LeasedRequest,
    RedisMemory,
)
from distcrawl.connection import node_info
from distcrawl.deadrecord import dead_letter
from distcrawl.frontier import Frontier
from distcrawl.layout import Joined, generation_op
from distcrawl.ops import Op
from distcrawl.queue_entry import Leased
from distcrawl.records import START_KINDS, Entry, EntryKind
from distcrawl.refusals import outage_code, refused
from distcrawl.replies import CommitResult, LeaseResult, Places
from distcrawl.serialize import DecodeError, RequestCodec

if TYPE_CHECKING:
    from distcrawl.liveness import Liveness

#: times a commit is refused for its content before it is split
SPLIT_AFTER = 2

T = TypeVar("T")


class _Step(NamedTuple):
    op: Op[Any]
    #: takes the parsed reply (on the Redis thread)
    done: Callable[[Any], None]
    #: the batch's commit: its failure is ``commit_error``, not ``error``
    commit: bool = False
    #: a rider's: its failure goes to ``done`` too, and is no failure of the batch
    rider: bool = False


def _ignore(_: Any) -> None:
    return None


def _filler(replies: list[Any], i: int) -> Callable[[Any], None]:
    def done(value: Any) -> None:
        replies[i] = value

    return done


def _setter(res: BatchResult, name: str) -> Callable[[Any], None]:
    def done(value: Any) -> None:
        setattr(res, name, value)

    return done


@dataclass(eq=False)
class Runner:
    """Runs batches for one worker: ``Runner.run`` is called on the Redis thread only."""

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

    def run(self, batch: Batch) -> BatchResult:
        """Run ``batch``: its steps go in one pipeline of EVALSHA calls, one round trip,
        unless the commits must run one at a time (several, a split one, or the Bloom
        seen-set, whose state may need reading around the script): then the steps before
        them share one pipeline and those after another."""
        res = BatchResult()
        frontier = self.frontier
        before = self._wait_steps(batch, res)
        if batch.sent:
            before.append(_Step(frontier.sent_op(batch.sent), _ignore))
        if batch.freed or batch.taken:

            def places(out: Places) -> None:
                res.freed, res.taken = out.freed, out.taken

            before.append(_Step(frontier.places_op(batch.freed, batch.taken), places))
        alone = len(batch.commits) > 1 or frontier.bloom is not None
        alone = alone or any(c.split for c in batch.commits)
        after: list[_Step] = []
        if batch.commits and not alone:
            (commit,) = batch.commits
            after.append(_Step(self._commit_op(commit), self._committed(res), commit=True))
        if batch.release:
            after.append(_Step(frontier.release_op(batch.release), _setter(res, "released")))
        if batch.unclaim:
            # after the commits, which take from the claim list what they store
            unclaim = frontier.unclaim_op("own", [frontier.tag])
            after.append(_Step(unclaim, _setter(res, "unclaimed")))
        if batch.renew:
            after.append(
                _Step(frontier.renew_op(batch.renew, self.lease_ms), _setter(res, "renewed"))
            )
        if batch.reclaim:
            reclaim = frontier.requeue_op(worker_timeout_ms=self.worker_timeout_ms)
            after.append(_Step(reclaim, _setter(res, "requeue")))
            # finished slots' state is forgotten at the same pace, a page at a time
            after.append(_Step(frontier.sweep_op(), _setter(res, "swept")))
        if batch.want:
            lease = frontier.lease_op(
                batch.want,
                self.lease_ms,
                held=batch.held,
                worker_timeout_ms=self.worker_timeout_ms,
                reserve=batch.reserve,
                reserved=batch.reserved,
            )
            after.append(_Step(lease, self._leased(res)))
        if batch.peek and not batch.wait > 0:
            after.append(_Step(frontier.claim_op(batch.peek), _setter(res, "peeked")))
        after += self._generation_steps(batch, res)
        if batch.beat and self.liveness is not None:
            after.append(_Step(frontier.alive_op(), self._beaten(res)))
        after += self._rider_steps(batch, res)
        if alone and batch.commits:
            down = self._commit_alone(batch, before, after, res)
        else:
            down = self._send(before + after, res)
        if res.requeue is not None and res.requeue.orphan_claims and not down:
            # rare: workers found dead held start_urls claims; unclaim.lua checks again
            try:
                unclaimed = frontier.unclaim_orphans(res.requeue.orphan_claims)
                res.requeue = res.requeue._replace(unclaimed=unclaimed)
            except redis.RedisError as exc:
                if res.error is None:
                    res.error = exc
                down = not isinstance(exc, redis.ResponseError)
        if not down:
            down = self._rejoin(res)
        if batch.drain and not down:
            # a transaction of its own (its reads must agree), and only when closing idle
            try:
                res.drained = frontier.drained()
            except redis.RedisError as exc:
                if res.error is None:
                    res.error = exc
        self._read_memory(res)
        return res

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

    def _generation_steps(self, batch: Batch, res: BatchResult) -> list[_Step]:
        """The read of the crawl's generation (layout.py), with the batches that take work
        in (leases, claims) and the periodic reclaim, after their claim and lease: what they
        took was in Redis before the read, so a claim of the next crawl's first start URL
        comes with the read that shows the reset before it."""
        if self.joined is None or not (batch.want or batch.peek or batch.reclaim):
            return []

        def done(generation: str | None) -> None:
            res.generation = generation
            res.generation_read = True

        return [_Step(generation_op(self.frontier.keys), done)]

    def _rejoin(self, res: BatchResult) -> bool:
        """Join the crawl that is there now when the batch found another generation (the
        frontier was reset); returns whether Redis is unreachable."""
        if self.joined is None or not res.generation_read:
            return False
        try:
            res.rejoined = self.joined.rejoin(res.generation, self.frontier.record_layout)
        except redis.RedisError as exc:
            if res.error is None:
                res.error = exc
            return not isinstance(exc, redis.ResponseError)
        if res.rejoined is not None:
            for part in self._frontiers():
                if part.bloom is not None:
                    part.bloom.state = None  # its layers went with the old crawl: read again
        return False

    def _frontiers(self) -> list[Frontier]:
        """The frontiers whose scripts this runner calls (the shards' too, ShardedRunner)."""
        return [self.frontier]

    def _wait_steps(self, batch: Batch, res: BatchResult) -> list[_Step]:
        """An idle poll's first steps, on the crawl's own keys: the claim first, so that start
        URLs pushed during the last wait are taken now (a claim ends the wait); then the wait,
        after which Redis runs the rest."""
        if not batch.wait > 0:
            return []
        steps: list[_Step] = []
        if batch.peek:
            claim = self.frontier.claim_op(batch.peek, then_wait=True)
            steps.append(_Step(claim, _setter(res, "peeked")))
        steps.append(_Step(self.frontier.wait_op(batch.wait), _setter(res, "woken")))
        return steps

    @staticmethod
    def _rider_steps(batch: Batch, res: BatchResult) -> list[_Step]:
        """The riders' ops, each reply filled in ``res.riders`` (a connection error until
        it comes)."""
        steps: list[_Step] = []
        for rider in batch.riders:
            replies: list[Any] = [redis.ConnectionError("not sent: Redis unreachable")] * len(
                rider.ops
            )
            res.riders.append(replies)
            for i, op in enumerate(rider.ops):
                steps.append(_Step(op, _filler(replies, i), rider=True))
        return steps

    def _commit_alone(
        self, batch: Batch, before: list[_Step], after: list[_Step], res: BatchResult
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

    @staticmethod
    def _unsent(pending: list[_Step], res: BatchResult, exc: redis.RedisError) -> bool:
        """No reply is known: a commit among ``pending`` may have run (sent again, it is
        recognised by its id); everything else is as if it had failed. Returns whether
        Redis is unreachable."""
        for st in pending:
            if st.rider:
                st.done(exc)
        if any(st.commit for st in pending):
            res.commit_error = exc
        if res.error is None and any(not (st.commit or st.rider) for st in pending):
            res.error = exc
        return not isinstance(exc, redis.ResponseError)

    def _send(
        self,
        steps: list[_Step],
        res: BatchResult,
        *,
        client: Any = None,
        wait: tuple[int, int] | None = None,
    ) -> bool:
        """Send ``steps`` in one non-transactional pipeline and hand each its reply; returns
        whether Redis is unreachable (then no step's outcome is known).

        EVALSHA, not redis-py's Script objects: those ask SCRIPT EXISTS on every execute, a
        round trip of its own. A step refused with NOSCRIPT (the server restarted or its
        script cache was flushed) did not run: once the scripts are loaded, exactly those
        steps are sent again, in their order.

        ``client``: one node's client instead of the frontier's; ``wait``: (replicas,
        timeout ms) for a WAIT behind the steps, on the same connection as their writes,
        whose reply (the replicas that acknowledged them) goes to ``res.replicas``."""
        client = client if client is not None else self.frontier.client
        scripts = self.frontier.scripts
        cluster = isinstance(client, RedisCluster)
        pending = steps
        for attempt in range(2):
            if not pending:
                return False
            pipe = client.pipeline(transaction=False)
            try:
                # FCALL or EVALSHA: settled on the frontier's first batch (lua.ScriptMode)
                scripts.mode.resolve(self.frontier.client)
            except redis.RedisError as exc:
                return self._unsent(pending, res, exc)
            for st in pending:
                op = st.op
                if op.script:
                    # as a plain command: redis-py's cluster pipeline refuses its evalsha()
                    # method, but routes an EVALSHA (or FCALL) by its keys (all in one slot)
                    args = getattr(scripts, op.script).command(op.keys, op.args)
                    if cluster and op.keys:
                        # routed here, from the slot map it holds: left to itself, redis-py
                        # 8 asks a node COMMAND GETKEYS for each EVALSHA, a round trip each
                        # (after a MOVED it routes the command again, by its keys)
                        node = client.get_node_from_key(op.keys[0])
                        pipe.execute_command(*args, target_nodes=node)
                    else:
                        pipe.execute_command(*args)
                else:
                    pipe.execute_command(*op.args)
            if wait is not None:
                pipe.execute_command("WAIT", *wait)
            try:
                replies = pipe.execute(raise_on_error=False)
            except redis.RedisError as exc:
                return self._unsent(pending, res, exc)
            if wait is not None:
                acked = replies.pop()
                if not isinstance(acked, BaseException):
                    res.replicas = min(int(acked), res.replicas)
            again: list[_Step] = []
            for st, reply in zip(pending, replies, strict=True):
                if isinstance(reply, redis.exceptions.NoScriptError) and attempt == 0:
                    again.append(st)
                elif isinstance(reply, redis.RedisError):
                    if st.rider:
                        st.done(reply)
                    elif st.commit:
                        res.commit_error = reply
                    elif res.error is None:
                        res.error = reply
                else:
                    st.done(st.op.parse(reply))
            if again:
                try:
                    scripts.load(client)
                except redis.RedisError as exc:
                    if any(st.commit for st in again):
                        res.commit_error = exc
                    if res.error is None and any(not st.commit for st in again):
                        res.error = exc
                    return not isinstance(exc, redis.ResponseError)
            pending = again
        return False

    def _commit_op(self, commit: Commit) -> Op[CommitResult]:
        return self.frontier.commit_op(
            commit.acks, commit.entries, commit.feedback, commit_id=commit.id, positions=True
        )

    @staticmethod
    def _committed(res: BatchResult) -> Callable[[CommitResult], None]:
        def done(result: CommitResult) -> None:
            res.committed = result
            res.commits_done = 1

        return done

    def _leased(self, res: BatchResult) -> Callable[[LeaseResult], None]:
        def done(lease: LeaseResult) -> None:
            res.lease = lease
            res.leased = [self._decode(item) for item in lease.items]
            res.leased += [
                LeasedRequest(bad.ref, None, bad.raw, "", False, bad.reason) for bad in lease.bad
            ]

        return done

    def _beaten(self, res: BatchResult) -> Callable[[int], None]:
        def done(_: int) -> None:
            res.beat = True
            if self.liveness is not None:
                self.liveness.noted()

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
        the one before succeeded)."""
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
    if entry.kind in START_KINDS:
        record = dead_letter(text, raw=entry.raw, source="start_urls")
        return Entry(EntryKind.BAD_START, b"", 0, record, entry.raw)
    carries_request = entry.kind in (EntryKind.REQUEST, EntryKind.RETRY, EntryKind.REVISIT)
    payload = base64.b64encode(entry.payload).decode("ascii") if carries_request else None
    url = getattr(entry.request, "url", None)
    record = dead_letter(text, url=url, source="commit", payload=payload, priority=entry.priority)
    return Entry(EntryKind.DEAD_LETTER, b"", 0, record)
