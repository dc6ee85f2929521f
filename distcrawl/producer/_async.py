"""The :class:`~distcrawl.producer.Producer` of asyncio apps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from distcrawl.codec.entries import EntryLike
from distcrawl.model import dashboard
from distcrawl.producer._results import PushResult, RedriveResult
from distcrawl.producer._sync import Producer

if TYPE_CHECKING:
    from typing_extensions import Self

T = TypeVar("T")


class AsyncProducer:
    """A :class:`Producer` for asyncio apps (FastAPI, aiohttp): every Redis call runs on the
    producer's own thread, never on the event loop, one at a time (the Producer keeps state
    between calls); waits happen on the loop. Same arguments as :class:`Producer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._init(Producer(*args, **kwargs))

    def _init(self, producer: Producer) -> None:
        self.producer = producer
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distcrawl")

    @classmethod
    def from_url(
        cls, redis_url: str | None = None, spider: str = "site", settings: Any = None, **kwargs: Any
    ) -> AsyncProducer:
        self = cls.__new__(cls)
        self._init(Producer.from_url(redis_url, spider, settings, **kwargs))
        return self

    async def _run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(func, *args, **kwargs))

    async def push(
        self,
        url: str,
        priority: int = 0,
        meta: Mapping[str, Any] | None = None,
        callback: str | None = None,
        **kwargs: Any,
    ) -> PushResult:
        return await self._run(self.producer.push, url, priority, meta, callback, **kwargs)

    async def push_many(self, entries: Iterable[EntryLike], **kwargs: Any) -> list[PushResult]:
        items = list(entries)  # iterated here, not on the thread
        return await self._run(self.producer.push_many, items, **kwargs)

    async def status(self, stale_after: float = dashboard.STALE_AFTER) -> dict[str, Any]:
        return await self._run(self.producer.status, stale_after)

    async def idle(self) -> bool:
        return await self._run(self.producer.idle)

    async def wait_until_idle(self, timeout: float, poll: float = 0.25) -> None:
        """As :meth:`Producer.wait_until_idle`; the event loop runs while it waits."""
        deadline = time.monotonic() + timeout
        before = False
        while True:
            now = await self.idle()
            if now and before:
                return
            before = now
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"crawl {self.producer.keys.namespace!r} not idle after {timeout}s"
                )
            await asyncio.sleep(min(poll, left))

    async def dead_letters(self, limit: int = 20) -> list[dict[str, Any]]:
        return await self._run(self.producer.dead_letters, limit)

    async def dead_count(self) -> int:
        return await self._run(self.producer.dead_count)

    async def redrive(self, **kwargs: Any) -> RedriveResult:
        return await self._run(self.producer.redrive, **kwargs)

    async def aclose(self) -> None:
        await self._run(self.producer.close)
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
