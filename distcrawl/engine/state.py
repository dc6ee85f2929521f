"""The scheduler's state, as its parts see it.

``Scheduler`` (distcrawl/scheduler.py) is one object to Scrapy, but its methods are written in
several modules, one per responsibility: ``building`` (what goes in the next batch), ``pump``
(running batches and taking in their results) and ``handlers`` (the engine's signals). Each of
those classes is a base of ``Scheduler`` and works on the scheduler's own attributes; this class
declares them once, with the methods one part calls in another, so that each part type-checks
on its own. It holds no value and runs no code: ``Scheduler.__init__`` sets every attribute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from twisted.internet import task

    from distcrawl.codec.politeness import ServerClock
    from distcrawl.config import DistcrawlConfig
    from distcrawl.dupefilter import RedisDupeFilter
    from distcrawl.engine._batch_types import Batch
    from distcrawl.engine.batch import Runner
    from distcrawl.engine.idle import IdleWaits
    from distcrawl.engine.intake import Intake
    from distcrawl.engine.leases import Leases
    from distcrawl.engine.liveness import Liveness
    from distcrawl.engine.outage import Outage
    from distcrawl.engine.outbox import Outbox
    from distcrawl.engine.polling import Polling
    from distcrawl.engine.report import Reporter
    from distcrawl.engine.riders import Riders
    from distcrawl.model.connection import RedisIO
    from distcrawl.model.keys import FrontierKeys
    from distcrawl.model.replies import Drained


class SchedulerState:
    """The attributes and methods of ``Scheduler`` that its parts share (see the module
    docstring); what each one means is said where ``Scheduler.__init__`` sets it."""

    crawler: Crawler
    config: DistcrawlConfig
    df: RedisDupeFilter | None
    io: RedisIO
    spider: Spider | None
    keys: FrontierKeys | None
    _runner: Runner | None
    _liveness: Liveness | None
    clock: ServerClock
    _outbox: Outbox
    _leases: Leases
    _report: Reporter
    _outage: Outage
    _intake: Intake | None
    _busy: bool
    _closing: bool
    _paused: bool
    _unclaimed: bool
    _kick_pending: bool
    _loop: task.LoopingCall | None
    _remote_queue: int
    _start_pending: int
    _polling: Polling
    _idle_waits: IdleWaits | None
    _parked: bool
    _park_until: float
    _next_idle_reap: float
    _woken: bool
    _claims_empty: bool
    _last_work: float
    _had_work: bool
    _noted_no_work: bool
    _drained: tuple[float, Drained] | None
    _drain_wanted: bool
    _held_back: bool
    _riders: Riders

    if TYPE_CHECKING:
        # written in one part (or in scheduler.py) and called from another

        def has_pending_requests(self) -> bool: ...

        def _reconnect(self) -> None: ...

        def _park(self, now: float, until: float) -> None: ...

        def _unpark(self, now: float) -> None: ...

        def _inc(self, key: str, count: int = 1) -> None: ...

        def _kick(self) -> None: ...

        def _build_batch(self, now: float) -> Batch: ...

        def _idle(self) -> bool: ...

        def _full(self) -> bool: ...

        def _claims_waiting(self) -> bool: ...
