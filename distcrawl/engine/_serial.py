"""One daemon thread on which calls run in the order issued, off the reactor: the Redis
commands of a crawler (:class:`~distcrawl.model.connection.RedisIO`) and the pymongo calls of a
pipeline (:class:`~distcrawl.mongo.MongoIO`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

T = TypeVar("T")


def _daemon_thread(*args: Any, **kwargs: Any) -> threading.Thread:
    # a worker whose Redis or MongoDB hangs, or that failed half-way through opening, must
    # still be able to exit
    return threading.Thread(*args, daemon=True, **kwargs)


class _DaemonThreadPool(ThreadPool):
    threadFactory = staticmethod(_daemon_thread)  # type: ignore[assignment]


class SerialThread:
    """Calls run one at a time on one daemon thread named ``name``, in the order issued (a
    write before the one that depends on it); each gives its result as a Deferred."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool: ThreadPool | None = None

    def start(self) -> None:
        if self._pool is None:
            self._pool = _DaemonThreadPool(minthreads=1, maxthreads=1, name=self.name)
            self._pool.start()

    def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        if self._pool is None:
            raise RuntimeError(f"{type(self).__name__}.run() before start()")
        from twisted.internet import reactor

        return deferToThreadPool(reactor, self._pool, func, *args, **kwargs)

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
