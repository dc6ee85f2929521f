"""How a batch's steps reach Redis: one pipeline of script calls and commands, each reply
handed to the step it answers (batch.py builds the steps, _batch_commit.py its commits).

A step is an ``Op`` (ops.py) and what to do with its parsed reply; a failure is recorded in
the ``BatchResult`` instead of raised, so that nothing crosses the Redis thread as an
exception: a commit's failure is ``commit_error``, a rider's goes to the rider, any other
step's is the batch's ``error``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import redis
from redis.cluster import RedisCluster

from distcrawl._batch_types import BatchResult
from distcrawl.frontier import Frontier, Op


class Step(NamedTuple):
    op: Op[Any]
    #: takes the parsed reply (on the Redis thread)
    done: Callable[[Any], None]
    #: the batch's commit: its failure is ``commit_error``, not ``error``
    commit: bool = False
    #: a rider's: its failure goes to ``done`` too, and is no failure of the batch
    rider: bool = False


def ignore(_: Any) -> None:
    return None


def filler(replies: list[Any], i: int) -> Callable[[Any], None]:
    def done(value: Any) -> None:
        replies[i] = value

    return done


def setter(res: BatchResult, name: str) -> Callable[[Any], None]:
    def done(value: Any) -> None:
        setattr(res, name, value)

    return done


def failed(res: BatchResult, exc: redis.RedisError) -> bool:
    """A step outside the pipeline failed: the batch's first error; whether Redis is
    unreachable."""
    if res.error is None:
        res.error = exc
    return not isinstance(exc, redis.ResponseError)


def unsent(pending: list[Step], res: BatchResult, exc: redis.RedisError) -> bool:
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


def send(
    frontier: Frontier,
    steps: list[Step],
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
    client = client if client is not None else frontier.client
    scripts = frontier.scripts
    cluster = isinstance(client, RedisCluster)
    pending = steps
    for attempt in range(2):
        if not pending:
            return False
        pipe = client.pipeline(transaction=False)
        try:
            # FCALL or EVALSHA: settled on the frontier's first batch (lua.ScriptMode)
            scripts.mode.resolve(frontier.client)
        except redis.RedisError as exc:
            return unsent(pending, res, exc)
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
            return unsent(pending, res, exc)
        if wait is not None:
            acked = replies.pop()
            if not isinstance(acked, BaseException):
                res.replicas = min(int(acked), res.replicas)
        again: list[Step] = []
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
