"""The one thread every pymongo call of a pipeline runs on, so that no MongoDB call ever
blocks the reactor and writes keep the order they were issued in."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

T = TypeVar("T")


def _daemon_thread(*args: Any, **kwargs: Any) -> threading.Thread:
    # a worker whose MongoDB hangs must still be able to exit
    return threading.Thread(*args, daemon=True, **kwargs)


class _DaemonThreadPool(ThreadPool):
    threadFactory = staticmethod(_daemon_thread)  # type: ignore[assignment]


class MongoIO:
    """The one thread every pymongo call of a pipeline runs on, in the order issued."""

    def __init__(self) -> None:
        self._pool: ThreadPool | None = None

    def start(self) -> None:
        if self._pool is None:
            self._pool = _DaemonThreadPool(minthreads=1, maxthreads=1, name="distcrawl-mongo")
            self._pool.start()

    def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        if self._pool is None:
            raise RuntimeError("MongoIO.run() before start()")
        from twisted.internet import reactor

        return deferToThreadPool(reactor, self._pool, func, *args, **kwargs)

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
