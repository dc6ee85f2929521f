"""How a batch's steps reach Redis: one pipeline of script calls and commands, each reply
handed to the step it answers (batch.py builds the steps, _batch_commit.py its commits).
``pipelined`` is the one sender of pipelined script calls, a producer's commits' too.

A step is an ``Op`` (ops.py) and what to do with its parsed reply; a failure is recorded in
the ``BatchResult`` instead of raised, so that nothing crosses the Redis thread as an
exception: a commit's failure is ``commit_error``, a rider's goes to the rider, any other
step's is the batch's ``error``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import redis
from redis.cluster import RedisCluster

from distcrawl.engine._batch_types import BatchResult
from distcrawl.model.frontier import Frontier
from distcrawl.model.ops import Op


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


def pipelined(
    frontier: Frontier,
    ops: Sequence[Op[Any]],
    *,
    client: Any = None,
    wait: tuple[int, int] | None = None,
    packed: bool = False,
) -> tuple[list[Any], list[Any]]:
    """The one sender of pipelined script calls (the batch runner's steps, a producer's
    commits): the raw reply to each of ``ops``, an error in its place for one Redis refused,
    and the replies of the WAITs sent behind them (``wait``: replicas, timeout ms; one per
    attempt, on the connection that wrote). Raises a RedisError when no reply is known.

    EVALSHA (or FCALL, lua.ScriptMode), not redis-py's Script objects: those ask SCRIPT
    EXISTS on every execute, a round trip of its own. An op refused with NOSCRIPT (the server
    restarted or its script cache was flushed) did not run: once the scripts are loaded,
    exactly those ops are sent again, in their order; a failure to load them is their reply.

    ``client``: one node's client instead of the frontier's. ``packed``: on a single server,
    the commands are packed here in RESP (``_execute``), for commands of thousands of
    arguments (a producer's commits)."""
    client = client if client is not None else frontier.client
    scripts = frontier.scripts
    # FCALL or EVALSHA: settled on the frontier's first call (lua.ScriptMode)
    scripts.mode.resolve(frontier.client)
    cluster = isinstance(client, RedisCluster)
    replies: list[Any] = [None] * len(ops)
    waited: list[Any] = []
    todo = list(range(len(ops)))
    for attempt in range(2):
        commands: list[tuple[Any, ...]] = []
        routes: list[Any] = []
        for i in todo:
            op = ops[i]
            if op.script:
                commands.append(getattr(scripts, op.script).command(op.keys, op.args))
                # routed here, from the slot map it holds: left to itself, redis-py 8 asks
                # a node COMMAND GETKEYS for each EVALSHA, a round trip each (after a MOVED
                # it routes the command again, by its keys)
                routes.append(client.get_node_from_key(op.keys[0]) if cluster and op.keys else None)
            else:
                commands.append(tuple(op.args))
                routes.append(None)
        if wait is not None:
            commands.append(("WAIT", *wait))
            routes.append(None)
        if packed and not cluster:
            got = _execute(client, commands)
        else:
            pipe = client.pipeline(transaction=False)
            for command, node in zip(commands, routes, strict=True):
                # as a plain command: redis-py's cluster pipeline refuses its evalsha()
                # method, but routes an EVALSHA (or FCALL) by its keys (all in one slot)
                if node is not None:
                    pipe.execute_command(*command, target_nodes=node)
                else:
                    pipe.execute_command(*command)
            got = list(pipe.execute(raise_on_error=False))
        if wait is not None:
            waited.append(got.pop())
        again = []
        for i, reply in zip(todo, got, strict=True):
            if isinstance(reply, redis.exceptions.NoScriptError) and attempt == 0:
                again.append(i)
            replies[i] = reply
        if not again:
            break
        try:
            scripts.load(client)
        except redis.RedisError as exc:
            for i in again:
                replies[i] = exc
            break
        todo = again
    return replies, waited


def send(
    frontier: Frontier,
    steps: list[Step],
    res: BatchResult,
    *,
    client: Any = None,
    wait: tuple[int, int] | None = None,
) -> bool:
    """Send ``steps`` in one pipeline (``pipelined``) and hand each its reply; returns
    whether Redis is unreachable (then no step's outcome is known). ``wait``: the replicas
    that acknowledged the steps' writes go to ``res.replicas``."""
    if not steps:
        return False
    try:
        replies, waited = pipelined(frontier, [st.op for st in steps], client=client, wait=wait)
    except redis.RedisError as exc:
        return unsent(steps, res, exc)
    for acked in waited:
        if not isinstance(acked, BaseException):
            res.replicas = min(int(acked), res.replicas)
    down = False
    for st, reply in zip(steps, replies, strict=True):
        if isinstance(reply, redis.RedisError):
            # only the scripts' load, outside the pipeline, fails for the connection here
            down = down or not isinstance(reply, redis.ResponseError)
            if st.rider:
                st.done(reply)
            elif st.commit:
                res.commit_error = reply
            elif res.error is None:
                res.error = reply
        else:
            st.done(st.op.parse(reply))
    return down


def _execute(client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """The replies to ``commands`` sent in one pipeline, errors as exceptions in the list.

    The commands are packed here: redis-py packs a command by appending each argument to a
    growing buffer, and a commit of 500 entries has 3,000 arguments; that packing was a
    tenth of push_many's time in profiles, on the GIL beside the thread making the next
    entries. The connection, its retry policy and the reading of the replies are
    redis-py's, as in ``Pipeline.execute``."""
    pool = client.connection_pool
    conn = pool.get_connection()
    encoder = conn.encoder
    packed = [_pack(command, encoder) for command in commands]

    def send() -> list[Any]:
        conn.send_packed_command(packed)
        out: list[Any] = []
        for _ in packed:
            try:
                out.append(conn.read_response())
            except redis.ResponseError as exc:  # this command's error: the others stand
                out.append(exc)
        return out

    try:
        return list(conn.retry.call_with_retry(send, lambda error: conn.disconnect()))
    finally:
        pool.release(conn)


def _pack(args: Sequence[Any], encoder: Any) -> bytes:
    """One command in RESP, joined once; arguments encoded as redis-py's Encoder does."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode(encoder.encoding, encoder.encoding_errors)
        elif isinstance(arg, int) and not isinstance(arg, bool):
            data = b"%d" % arg
        else:
            data = encoder.encode(arg)  # floats, memoryviews; refuses what Redis cannot take
        parts += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(parts)
