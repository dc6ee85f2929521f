"""Which masters have the replicas DISTCRAWL_WAIT_REPLICAS asks for, so that a commit waits
only where a replica can answer.

After a failover the new master often has no replica until one is rebuilt: a WAIT there
always runs its whole timeout, and with it every commit that crosses shards (the crawl's
throughput fell from 56 to 22 pages/s). A master's ``connected_slaves`` (INFO replication)
says beforehand whether a WAIT can be answered. It is read on the Redis thread when a node
is first written to, every RECHECK seconds after, and at the next commit after a WAIT that
counted fewer replicas than wanted, never on every commit. While a node has fewer replicas
than wanted its commits send no WAIT (the scheduler counts them as unreplicated); the
scheduler logs one warning when a node loses its replicas and one line when they are back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

#: seconds between two reads of a node's INFO replication
RECHECK = 5.0


@dataclass(frozen=True)
class ReplicaChange:
    """A node's connected replicas crossed DISTCRAWL_WAIT_REPLICAS, one way or the other."""

    #: the node's ``host:port`` on a cluster; "" for the one server of REDIS_URL
    node: str
    connected: int
    wanted: int

    @property
    def lost(self) -> bool:
        return self.connected < self.wanted


@dataclass
class _Node:
    #: fewer connected replicas than wanted, at the last reading
    short: bool = False
    #: monotonic time of the next reading
    next_check: float = 0.0
    #: INFO is refused to this user: WAIT's own replies tell instead, a commit every
    #: RECHECK seconds waiting as a probe
    blind: bool = False


class ReplicaWatch:
    """Per node, whether a commit's WAIT can be answered; used on the Redis thread only."""

    def __init__(
        self,
        wanted: int,
        *,
        recheck: float = RECHECK,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.wanted = wanted
        self.recheck = recheck
        self._clock = clock
        self._nodes: dict[str, _Node] = {}
        self._changes: list[ReplicaChange] = []

    def should_wait(self, node: str, info: Callable[[], dict[str, Any]]) -> bool:
        """Whether a commit to ``node`` waits for its replicas; ``info`` reads the node's
        INFO replication when a reading is due."""
        state = self._nodes.setdefault(node, _Node())
        now = self._clock()
        if now >= state.next_check:
            state.next_check = now + self.recheck
            try:
                connected = int(info().get("connected_slaves", 0))
            except redis.exceptions.NoPermissionError:
                state.blind = True
                return True  # this commit's WAIT is the probe
            except redis.RedisError:
                return not state.short  # Redis gone: the commit fails anyway
            self._learn(node, state, connected)
        return not state.short

    def waited(self, node: str, acknowledged: int) -> None:
        """A WAIT to ``node`` counted ``acknowledged`` replicas: fewer than wanted, and the
        node is read again at its next commit (a replica may be gone)."""
        state = self._nodes.setdefault(node, _Node())
        if state.blind:
            self._learn(node, state, acknowledged)
        elif acknowledged < self.wanted:
            state.next_check = 0.0

    def _learn(self, node: str, state: _Node, connected: int) -> None:
        short = connected < self.wanted
        if short != state.short:
            state.short = short
            self._changes.append(ReplicaChange(node, connected, self.wanted))

    def take_changes(self) -> list[ReplicaChange]:
        changes, self._changes = self._changes, []
        return changes
