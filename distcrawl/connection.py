"""The one place a Redis client is made (URLs are shown through :mod:`distcrawl.redact`)."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from weakref import WeakKeyDictionary

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from distcrawl.redact import redact_url

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

T = TypeVar("T")

__all__ = ["RedisIO", "auth_refusal", "make_redis", "redact_url", "redis_io"]

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
    if isinstance(exc, redis.exceptions.NoPermissionError) or reply.startswith("NOPERM"):
        return "Redis refused the user's permissions"
    if isinstance(
        exc, redis.AuthenticationError | redis.exceptions.AuthenticationWrongNumberOfArgsError
    ) or reply.startswith(("WRONGPASS", "NOAUTH")):
        return "Redis refused the password"
    return None


def make_redis(url: str, *, socket_timeout: float = 10.0) -> redis.Redis:
    """A client for ``url`` (``redis://``, ``rediss://``, ``unix://``, with user and password).

    No I/O happens here: redis-py connects lazily, on the first command, which distcrawl
    issues from its I/O thread, never from the reactor.
    """
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


class RedisIO:
    """The crawler's Redis client and the single thread its commands run on.

    One thread keeps commands in the order they were issued (a push before the
    acknowledgement that depends on it) and keeps every socket wait off the reactor.
    """

    def __init__(self, url: str, *, socket_timeout: float = 10.0) -> None:
        self.url = url
        self.socket_timeout = socket_timeout
        self._client: redis.Redis | None = None
        self._pool: ThreadPool | None = None
        self._users = 0

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = make_redis(self.url, socket_timeout=self.socket_timeout)
        return self._client

    def start(self) -> None:
        self._users += 1
        if self._pool is None:
            self._pool = _DaemonThreadPool(minthreads=1, maxthreads=1, name="distcrawl-redis")
            self._pool.start()

    def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        if self._pool is None:
            raise RuntimeError("RedisIO.run() before start()")
        from twisted.internet import reactor

        return deferToThreadPool(reactor, self._pool, func, *args, **kwargs)

    def stop(self) -> None:
        self._users -= 1
        if self._users > 0:
            return
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
        if self._client is not None:
            self._client.close()
            self._client = None


def _daemon_thread(*args: Any, **kwargs: Any) -> threading.Thread:
    # a worker that failed half-way through opening must still be able to exit
    return threading.Thread(*args, daemon=True, **kwargs)


class _DaemonThreadPool(ThreadPool):
    threadFactory = staticmethod(_daemon_thread)  # type: ignore[assignment]


_IO: WeakKeyDictionary[Any, RedisIO] = WeakKeyDictionary()


def redis_io(crawler: Crawler) -> RedisIO:
    """The one RedisIO of this crawler, shared by every distcrawl component in it."""
    io = _IO.get(crawler)
    if io is None:
        from distcrawl.config import DistcrawlConfig

        config = DistcrawlConfig.from_settings(crawler.settings)
        io = _IO[crawler] = RedisIO(config.redis_url, socket_timeout=config.socket_timeout)
    return io
