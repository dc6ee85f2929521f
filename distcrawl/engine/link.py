"""What the scheduler makes once Redis answers, held once for the parts that use it.

Whether REDIS_URL is a cluster (and so the key names) is learnt by I/O, so the batch runner,
the liveness beat and an idle worker's blocking reads are made on the Redis thread at the
first connection (``Scheduler._connect``), after the parts that use them were made: the pump
(pump.py), the batch builder (building.py) and the parking of an idle worker (parking.py)
read them here, through one reference, and find None until then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distcrawl.engine.batch import Runner
    from distcrawl.engine.holds import HoldListener
    from distcrawl.engine.idle import IdleWaits
    from distcrawl.engine.liveness import Liveness


@dataclass(eq=False)
class Link:
    """The scheduler's parts that exist only once Redis answered (see the module
    docstring)."""

    #: runs the batches (batch.py); None again once nothing of this worker's may reach the
    #: crawl (a start no retry cures, a frontier reset by a worker with other settings)
    runner: Runner | None = None
    #: this worker's liveness beat (liveness.py)
    liveness: Liveness | None = None
    #: an idle worker's blocking reads (idle.py), made with the frontier
    idle_waits: IdleWaits | None = None
    #: the subscription to the crawl's holds (holds.py), made with the frontier
    holds: HoldListener | None = None
