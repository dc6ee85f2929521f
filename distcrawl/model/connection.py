"""The one place a Redis client is made (URLs are shown through :mod:`distcrawl.model.redact`)."""

from __future__ import annotations

import inspect
import socket
import threading
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit
from weakref import WeakKeyDictionary

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterPipeline, RedisCluster
from redis.retry import Retry

from distcrawl.engine._serial import SerialThread
from distcrawl.model.redact import redact_url
from distcrawl.model.refusals import reply_code

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


__all__ = [
    "RedisIO",
    "auth_refusal",
    "execute_timed",
    "is_cluster",
    "is_cluster_node",
    "make_redis",
    "node_info",
    "redact_url",
    "redis_io",
    "unmendable",
    "url_problem",
]

#: no CLIENT subcommand on connect: redis-py 5+ sends CLIENT SETINFO, newer ones also CLIENT
#: MAINT_NOTIFICATIONS over RESP3 (both only informational or for managed-cloud failovers,
#: and their errors are ignored). Without them a least-privilege ACL user (``distcrawl acl``)
#: needs no CLIENT subcommand, which Redis < 7.2 could not even grant.
_QUIET_CONNECT: dict[str, Any] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)
try:
    from redis.maint_notifications import MaintNotificationsConfig
except ImportError:  # an older redis-py, which does not send it
    pass
else:
    _QUIET_CONNECT["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)


def auth_refusal(exc: BaseException) -> str | None:
    """What Redis refused, when ``exc`` is a refused password or missing permission.

    redis-py raises these as ``ConnectionError`` subclasses (or ``ResponseError``), and a
    wrong password reported as "cannot reach Redis" sends the operator after the network.
    """
    reply = str(exc).lstrip().upper()
    # a script's ACL refusal has no code on Redis 7 (refusals.py knows its wording)
    if isinstance(exc, redis.exceptions.NoPermissionError) or reply_code(exc) == "NOPERM":
        return "Redis refused the user's permissions"
    if isinstance(
        exc, redis.AuthenticationError | redis.exceptions.AuthenticationWrongNumberOfArgsError
    ) or reply.startswith(("WRONGPASS", "NOAUTH")):
        return "Redis refused the password"
    return None


#: getaddrinfo's answers that a host name does not exist (not "try again later")
_NO_SUCH_HOST = frozenset(
    code
    for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)


def url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as a Redis URL, found without I/O; None if nothing.

    redis-py raises a bare ValueError for a scheme it does not know (deep in a traceback
    that never names the setting), and quietly uses DB 0 for a path that is not a number.
    """
    try:
        redis.connection.parse_url(url)
    except ValueError as exc:
        return str(exc)
    parts = urlsplit(url)
    if parts.scheme in ("redis", "rediss"):
        path = unquote(parts.path).strip("/")
        if path and not path.lstrip("-").isdigit():
            return f"the path must be a database number (redis://host:port/0), not {path!r}"
    return None


def unmendable(exc: BaseException, *, started: bool) -> str | None:
    """Why retrying cannot get past ``exc``, when it is such an error; None for an outage.

    A wrong password, a database the server does not have, and (before the worker ever
    reached Redis: ``started`` False) a host name that does not exist stay so whatever the
    wait; a worker retrying them forever looks alive and crawls nothing. A refused or timed
    out connection, or a name lookup that failed for now, is an outage that ends.
    """
    refused = auth_refusal(exc)
    if refused is not None and "password" in refused:
        return refused
    if isinstance(exc, redis.ResponseError) and "DB index" in str(exc):
        return "Redis has no such database (the DB index of the URL is out of range)"
    if not started and isinstance(exc, redis.ConnectionError):
        seen: set[int] = set()
        cause: BaseException | None = exc
        while cause is not None and id(cause) not in seen:
            seen.add(id(cause))
            if isinstance(cause, socket.gaierror) and cause.errno in _NO_SUCH_HOST:
                return "the host name of the URL does not resolve"
            cause = cause.__cause__ or cause.__context__
    return None


def make_redis(
    url: str, *, socket_timeout: float = 10.0, cluster: bool | None = False
) -> redis.Redis:
    """A client for ``url`` (``redis://``, ``rediss://``, ``unix://``, with user and password).

    With ``cluster=False`` no I/O happens here: redis-py connects lazily, on the first
    command, which distcrawl issues from its I/O thread, never from the reactor. With
    ``cluster=True`` (``url`` is any node of a Redis Cluster) redis-py's ``RedisCluster``
    loads the slot map here, and ``cluster=None`` first asks the node (``HELLO``):
    call those off the reactor (``RedisIO.connect``).
    """
    if cluster is None:
        cluster = is_cluster_node(url, socket_timeout=socket_timeout)
    if cluster:
        return _make_cluster(url, socket_timeout)
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        health_check_interval=30,
        decode_responses=False,
        # never re-send a command behind distcrawl's back when its reply is lost: a commit
        # sent again is recognised (its id), but a lease sent twice would hold requests
        # nobody works on until the lease expires; the callers retry what is safe to retry
        retry=Retry(NoBackoff(), 0),
        **_QUIET_CONNECT,
    )


def node_client(url: str, key: str, *, socket_timeout: float, cluster: bool | None) -> redis.Redis:
    """A client of one connection of its own to the node holding ``key`` (a blocking read,
    a subscription): nothing else waits behind it, and on a cluster it stays on that node.
    Makes the cluster client, with its I/O, when ``cluster`` is not False: call it off the
    reactor."""
    base = make_redis(url, socket_timeout=socket_timeout, cluster=cluster)
    if isinstance(base, RedisCluster):
        node = base.get_node_from_key(key)
        base = node.redis_connection
        assert base is not None
    return redis.Redis(connection_pool=base.connection_pool, single_connection_client=True)


def is_cluster_node(url: str, *, socket_timeout: float = 10.0) -> bool:
    """Whether the server at ``url`` runs in cluster mode; one round trip.

    Asked with ``HELLO 2`` (its ``mode`` field), which Redis allows every user, so a
    least-privilege ACL user (``distcrawl acl``) needs no INFO for it, and which keeps the
    connection's protocol as it is.
    """
    probe = make_redis(url, socket_timeout=socket_timeout, cluster=False)
    try:
        reply = probe.execute_command("HELLO", "2")
    finally:
        probe.close()
    fields = dict(zip(reply[::2], reply[1::2], strict=False)) if isinstance(reply, list) else {}
    if isinstance(reply, dict):
        fields = reply
    mode = fields.get(b"mode", fields.get("mode", b""))
    return (mode.decode() if isinstance(mode, bytes) else str(mode)) == "cluster"


def is_cluster(client: Any) -> bool:
    """Whether ``client`` (or a pipeline of it) talks to a Redis Cluster."""
    return isinstance(client, RedisCluster | ClusterPipeline)


def node_info(client: redis.Redis, section: str, key: str) -> dict[str, Any]:
    """``INFO section`` of the server holding ``key``: on a cluster, of the master of its
    slot (a plain ``INFO`` there asks every node and answers per node)."""
    if is_cluster(client):
        cluster = cast(RedisCluster, client)
        node = cluster.get_node_from_key(key)
        return cluster.info(section, target_nodes=node)
    return client.info(section)


def execute_timed(client: redis.Redis, pipe: Any, key: str) -> list[Any]:
    """``pipe``'s replies, then ``TIME`` of the server holding ``key``, for ages on that
    server's clock. On a cluster TIME names no key to be routed by (nor may a MULTI there
    hold a keyless command), so it is asked of the slot's master right after the pipeline."""
    if not is_cluster(client):
        pipe.time()
        return list(pipe.execute())
    values = list(pipe.execute())
    cluster = cast(RedisCluster, client)
    values.append(cluster.time(target_nodes=cluster.get_node_from_key(key)))
    return values


def server_ms(client: redis.Redis, key: str) -> int:
    """Now on the clock of the Redis server holding ``key`` (ms): the clock of due times and
    of the workers' beats, by which Redis ages them (TIME, one round trip)."""
    seconds, micros = execute_timed(client, client.pipeline(transaction=False), key)[-1]
    return int(seconds) * 1000 + int(micros) // 1000


def _outage(exc: redis.exceptions.RedisClusterException) -> redis.RedisError:
    """redis-py raises these when no node answers or a slot has no master (a failover):
    an outage to distcrawl, which keeps its work and retries, not a bug."""
    error = redis.ConnectionError(f"Redis Cluster unavailable: {exc}")
    error.__cause__ = exc
    return error


class _Cluster(RedisCluster):
    """RedisCluster whose "cluster unreachable" errors are ``redis.ConnectionError``s, which
    every caller of distcrawl already treats as an outage."""

    # the base's two methods are unannotated, and untyped_calls_exclude does not reach a
    # super() call
    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except redis.exceptions.RedisClusterException as exc:
            if _is_outage(exc):
                raise _outage(exc) from exc
            raise

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        pipe: ClusterPipeline = super().pipeline(  # type: ignore[no-untyped-call]
            transaction, shard_hint
        )
        execute = pipe.execute

        def guarded(raise_on_error: bool = True) -> list[Any]:
            try:
                return execute(raise_on_error)
            except redis.exceptions.RedisClusterException as exc:
                if _is_outage(exc):
                    raise _outage(exc) from exc
                raise

        pipe.execute = guarded  # type: ignore[method-assign]  # this pipeline's own, guarded
        return pipe


def _is_outage(exc: redis.exceptions.RedisClusterException) -> bool:
    return isinstance(exc, redis.exceptions.SlotNotCoveredError) or "cannot be connected" in str(
        exc
    )


def _make_cluster(url: str, socket_timeout: float) -> redis.Redis:
    try:
        client = _Cluster.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            decode_responses=False,
            # the cluster client's own retries: a MOVED, ASK or TRYAGAIN reply is always
            # followed (the command did not run, following it is safe; redis-py does that
            # whatever this says), but a connection error or timeout is raised, never
            # answered by sending the command again, as make_redis does for a single server
            retry=Retry(NoBackoff(), 0),
            # a slot without a master (during a failover) fails only the commands of that
            # slot, as an outage the caller retries
            require_full_coverage=False,
            **_QUIET_CONNECT,
        )
    except redis.exceptions.RedisClusterException as exc:
        if _is_outage(exc):
            raise _outage(exc) from exc
        raise
    # RedisCluster offers the commands distcrawl sends (keyed commands, EVALSHA, MULTI
    # pipelines of one slot) under the same names as redis.Redis
    return cast(redis.Redis, client)


class RedisIO(SerialThread):
    """The crawler's Redis client and the single thread its commands run on.

    One thread keeps commands in the order they were issued (a push before the
    acknowledgement that depends on it) and keeps every socket wait off the reactor.
    """

    def __init__(
        self, url: str, *, socket_timeout: float = 10.0, cluster: bool | None = False
    ) -> None:
        super().__init__("distcrawl-redis")
        self.url = url
        self.socket_timeout = socket_timeout
        #: whether ``url`` is a Redis Cluster node; None until ``connect()`` asked it
        self.cluster = cluster
        self._client: redis.Redis | None = None
        self._users = 0
        self._connect_lock = threading.Lock()

    def connect(self) -> redis.Redis:
        """The client, made on first use: for a cluster (or "auto") that is I/O (HELLO
        cluster, the slot map), so call it on the Redis thread (``run(io.connect)``)."""
        with self._connect_lock:
            if self._client is None:
                if self.cluster is None:
                    self.cluster = is_cluster_node(self.url, socket_timeout=self.socket_timeout)
                self._client = make_redis(
                    self.url, socket_timeout=self.socket_timeout, cluster=self.cluster
                )
            return self._client

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            if self.cluster is not False:
                # a cluster client does I/O when made: it must come from connect()
                raise RuntimeError("RedisIO.client before connect() on a Redis Cluster")
            return self.connect()
        return self._client

    def start(self) -> None:
        """The thread, started by the first of the crawler's components that needs it."""
        self._users += 1
        super().start()

    def stop(self) -> None:
        """Stop the thread and close the client once the last user stopped."""
        self._users -= 1
        if self._users > 0:
            return
        super().stop()
        if self._client is not None:
            self._client.close()
            self._client = None


_IO: WeakKeyDictionary[Any, RedisIO] = WeakKeyDictionary()


def redis_io(crawler: Crawler) -> RedisIO:
    """The one RedisIO of this crawler, shared by every distcrawl component in it."""
    io = _IO.get(crawler)
    if io is None:
        from distcrawl.config import DistcrawlConfig

        config = DistcrawlConfig.from_settings(crawler.settings)
        io = _IO[crawler] = RedisIO(
            config.redis_url, socket_timeout=config.socket_timeout, cluster=config.redis_cluster
        )
    return io
