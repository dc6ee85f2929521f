"""What a worker has yet to store in Redis, held in the order that makes a crash lose nothing.

Requests and dead letters to push, acknowledgements of the requests the engine is done with,
and politeness feedback wait here for the next commit. An acknowledgement leaves only in the
commit that stores the last entry pushed before it (``Ack.after``), and a commit is sent again,
unchanged, until Redis confirms it (batch.py): the rules that let a worker die at any moment.
Nothing here touches Redis.
"""

from __future__ import annotations

import time
from collections import deque

from scrapy import Request
from scrapy.http import Response

from distcrawl.codec.politeness import FeedbackBuffer, Hold, ServerClock
from distcrawl.config import DistcrawlConfig
from distcrawl.engine._batch_types import Ack, Commit
from distcrawl.model.queue_entry import LeaseRef
from distcrawl.model.records import Entry


class Outbox:
    """Entries, acknowledgements and feedback waiting for a commit, and the commit sent."""

    def __init__(self, config: DistcrawlConfig, clock: ServerClock | None = None) -> None:
        self.config = config
        self._outgoing: deque[Entry] = deque()
        #: entries ever added to _outgoing / taken from it into commits
        self._pushed = 0
        self._taken = 0
        self._acks: deque[Ack] = deque()
        #: the commit being sent; sent again, unchanged, until Redis confirms it
        self.commit: Commit | None = None
        self._feedback = FeedbackBuffer(config, clock)
        #: monotonic time since which entries, acknowledgements or feedback wait (None:
        #: nothing waits), and whether a response asked to slow down since the last commit
        self._waiting_since: float | None = None
        self._throttled = False

    @property
    def entries(self) -> int:
        """Entries not yet in a commit."""
        return len(self._outgoing)

    @property
    def due(self) -> bool:
        """Entries or acknowledgements wait for a commit (the one being sent aside)."""
        return bool(self._outgoing or self._acks)

    def overdue(self, now: float) -> bool:
        """Whether what waits must go now, not with the next batch sent for other work: it
        waited DISTCRAWL_FLUSH_INTERVAL, or fills a commit. A commit of its own is a round
        trip, and a Redis wake-up, per page otherwise."""
        if self._waiting_since is None:
            return False
        if self._throttled:
            return True  # every worker must hold back from now on
        full = len(self._outgoing) >= self.config.push_batch_size
        return full or now - self._waiting_since >= self.config.flush_interval

    def pending(self) -> bool:
        """Anything to store: waiting, or in the commit being sent."""
        return self.due or self.commit is not None

    def counts(self) -> tuple[int, int]:
        """Pushes and acknowledgements not yet stored, the commit being sent included."""
        return (
            len(self._outgoing) + (len(self.commit.entries) if self.commit else 0),
            len(self._acks) + (len(self.commit.acks) if self.commit else 0),
        )

    def acked_refs(self) -> list[LeaseRef]:
        """The leases done but not yet acknowledged (kept while a commit is being retried,
        so that they stay ours)."""
        refs = [ack.ref for ack in self._acks]
        if self.commit is not None:
            refs += self.commit.acks
        return refs

    def push(self, entry: Entry) -> None:
        self._note_waiting()
        self._outgoing.append(entry)
        self._pushed += 1

    def _note_waiting(self) -> None:
        if self._waiting_since is None:
            self._waiting_since = time.monotonic()

    def ack(self, ref: LeaseRef) -> None:
        """Acknowledge ``ref`` once everything pushed so far is stored: everything its
        request produced is pushed by the time the engine is done with it."""
        self._note_waiting()
        self._acks.append(Ack(ref, self._pushed))

    def feedback(self, request: Request, response: Response) -> bool:
        """Politeness feedback for the next commit (FeedbackBuffer.add)."""
        throttled = self._feedback.add(request, response)
        if self._feedback:
            self._note_waiting()
        self._throttled = self._throttled or throttled
        return throttled

    def hold_of(self, request: Request, response: Response) -> Hold | None:
        """The wait a throttled answer asks of its slot (FeedbackBuffer.hold_of)."""
        return self._feedback.hold_of(request, response)

    def forget_feedback(self) -> None:
        """Drop the politeness feedback not sent yet: its slots' state went with the
        frontier it was about (a reset)."""
        self._feedback.drain()

    def current(self) -> Commit | None:
        """The commit to send: the one Redis has not confirmed, or the next."""
        if self.commit is None:
            self.commit = self._next_commit()
        return self.commit

    def take_all(self) -> list[Commit]:
        """Every commit still to send, the buffers emptied (closing)."""
        commits = [self.commit] if self.commit is not None else []
        self.commit = None
        while (commit := self._next_commit()) is not None:
            commits.append(commit)
        return commits

    def _next_commit(self) -> Commit | None:
        """The next commit from the buffers: up to a batch of entries, and the
        acknowledgements of the requests all of whose children are in it or before it."""
        entries: list[Entry] = []
        while self._outgoing and len(entries) < self.config.push_batch_size:
            entries.append(self._outgoing.popleft())
        self._taken += len(entries)
        acks: list[LeaseRef] = []
        while self._acks and self._acks[0].after <= self._taken:
            acks.append(self._acks.popleft().ref)
        if not self.due:
            self._waiting_since = None  # the feedback goes in this commit too
        self._throttled = False
        feedback = self._feedback.drain()
        if not (entries or acks or feedback):
            return None
        return Commit(acks, entries, feedback)
