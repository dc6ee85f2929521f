"""The scheduler's parts that hold a worker's state, made once and handed around whole.

Each part owns its state (leases.py, outbox.py, polling.py, status.py, parking.py...); the
objects that work with several of them (the batch builder, the pump, the signal handlers)
are given this one bundle rather than each its own list of ten arguments, so the wiring is
written once, in ``Scheduler.__init__``. It holds references only: nothing is copied, and a
part is read through it where it is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distcrawl.config import DistcrawlConfig
    from distcrawl.engine.handlers import IdleClock
    from distcrawl.engine.leases import Leases
    from distcrawl.engine.link import Link
    from distcrawl.engine.outage import Outage
    from distcrawl.engine.outbox import Outbox
    from distcrawl.engine.parking import Parking
    from distcrawl.engine.polling import Polling
    from distcrawl.engine.report import Reporter
    from distcrawl.engine.riders import Riders
    from distcrawl.engine.status import Status


@dataclass(frozen=True, eq=False)
class Parts:
    """One worker's parts (see the module docstring)."""

    config: DistcrawlConfig
    #: what exists once Redis answered: the batch runner, the liveness beat, the idle waits
    link: Link
    #: closing, paused, the work known to wait
    status: Status
    leases: Leases
    outbox: Outbox
    polling: Polling
    outage: Outage
    riders: Riders
    report: Reporter
    parking: Parking
    idle_clock: IdleClock
