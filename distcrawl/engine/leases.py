"""The requests a worker holds under a lease, from the lease to the acknowledgement.

A leased request is *ready* (waiting for the engine), a *reserve* (leased without a place in
its slot, lease.lua), *active* (in the engine) and, while it is there, *fetching* until it
leaves the downloader. Those states, the slot of every held lease and what Redis has yet to
hear about places (requests sent, places freed, reserves swapped in) change together on
every lease, every response and every close; keeping them in one class, apart from the
scheduler's Scrapy interface and its batches, keeps the rules of places and reserves
(Frontier.places, Frontier.sent) readable in one place. Nothing here touches Redis.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Container

from scrapy import Request

from distcrawl.engine._batch_types import Batch, LeasedRequest
from distcrawl.model.queue_entry import LeaseRef


class Leases:
    """The leases this worker holds, and the place reports Redis has not had yet."""

    def __init__(self, short: int = 1) -> None:
        #: the engine holding fewer of this worker's requests than this (half of
        #: CONCURRENT_REQUESTS), with none waiting here, is short of work (``starving``)
        self._short = short
        #: lease id -> slot of every request this worker holds (for the fair share)
        self._slots: dict[str, str] = {}
        #: request -> (slot, server time of the lease) of held requests of slots with a
        #: delay, until they reach the downloader (past its middlewares, robots.txt included)
        self._to_send: dict[Request, tuple[str, int]] = {}
        #: the same, of those that reached it since the last batch (Frontier.sent)
        self._sent: list[tuple[str, int]] = []
        self._ready: deque[tuple[LeaseRef, Request]] = deque()
        self._active: dict[LeaseRef, Request] = {}
        #: the lease of each request handed to the engine, until its response arrives
        self._fetching: dict[Request, LeaseRef] = {}
        #: leases that left the downloader since the last batch, and the reserves sent in
        #: their places (Frontier.places)
        self._freed: list[LeaseRef] = []
        self._swapped: list[LeaseRef] = []
        #: a report that may not wait for the next batch sent for other work: a place left
        #: free (Redis' count is one too high until it hears) or a paced request sent; and
        #: since when the others (a reserve's swap: the count stays right) wait
        self._report_urgent = False
        self._unreported_since: float | None = None
        #: slot -> reserves: leased requests holding no place, sent only in the place of a
        #: request of their slot that left the downloader (lease.lua)
        self._reserves: dict[str, deque[tuple[LeaseRef, Request]]] = {}
        #: leases of requests the engine stopped waiting for (a drain ended early): never
        #: acknowledged, given back with the close
        self._abandoned: list[LeaseRef] = []
        #: slot -> monotonic time until which a site asked to wait (holds.py): its requests
        #: are given back, not sent, and no reserve takes a place of it
        self._holds: dict[str, float] = {}
        #: leases of requests of a held slot, to give back with the next batch
        self._given_back: list[LeaseRef] = []

    # -- what the scheduler asks -----------------------------------------------------

    @property
    def ready(self) -> int:
        """Requests waiting for the engine (reserves not counted)."""
        return len(self._ready)

    @property
    def waiting(self) -> int:
        """Requests held and not yet handed to the engine, reserves included."""
        return len(self._ready) + self._reserve_count()

    @property
    def held(self) -> int:
        """Leases held and not finished with: waiting, and in the engine (downloading, in
        the callback, or waiting for the item pipeline to store what the page yielded)."""
        return self.waiting + len(self._active)

    @property
    def active(self) -> bool:
        """Some request is in the engine."""
        return bool(self._active)

    @property
    def unreported(self) -> int:
        """Places freed or taken that Redis has yet to hear about (0: none)."""
        return len(self._freed) + len(self._swapped)

    def report_due(self, now: float, interval: float) -> bool:
        """Whether the place reports go now, even in a batch of their own: urgent, or
        waiting ``interval`` s already (else they ride with the next batch sent)."""
        if self._report_urgent:
            return True
        since = self._unreported_since
        return since is not None and now - since >= interval

    def _note_unreported(self, *, urgent: bool) -> None:
        self._report_urgent = self._report_urgent or urgent
        if self._unreported_since is None:
            self._unreported_since = time.monotonic()

    def starving(self) -> bool:
        """Nothing waits here and the engine holds fewer than ``short`` of this worker's
        requests: a lease may not wait for the next turn. A CPU-bound worker whose downloader
        still holds requests (the engine pulls every ready one at once) is not short: a
        batch each time its ready ones ran out cost Redis a script call every page or two."""
        return not self.waiting and len(self._active) < self._short

    def busy(self) -> bool:
        """Some lease is held, or some report is due."""
        return bool(
            self._ready
            or self._active
            or self._reserves
            or self._sent
            or self._given_back
            or self.unreported
        )

    def _reserve_count(self) -> int:
        return sum(len(q) for q in self._reserves.values())

    def reserved(self) -> Counter[str]:
        return Counter({s: len(q) for s, q in self._reserves.items()})

    def held_refs(self) -> list[LeaseRef]:
        """Every lease this worker holds and has not finished with: waiting and in
        progress (the scheduler adds those done but not yet acknowledged)."""
        refs = [ref for ref, _ in self._ready] + list(self._active)
        refs += [ref for q in self._reserves.values() for ref, _ in q]
        return refs + self._given_back

    # -- changes -----------------------------------------------------------------------

    def add(self, item: LeasedRequest, leased_at: int) -> None:
        """A request Redis leased to this worker (decoded: ``item.request`` is set)."""
        assert item.request is not None
        if self.holding(item.slot):
            # leased before Redis held the slot (or before this worker heard): back it goes
            self._given_back.append(item.ref)
            return
        if item.reserve:
            self._reserves.setdefault(item.slot, deque()).append((item.ref, item.request))
            return
        self._slots[item.ref.id] = item.slot
        if item.paced:
            # its slot's turn began in Redis when it was leased: sent behind the requests
            # already waiting here, it would leave the next worker's turn closer than the
            # slot's delay; what lag remains is reported when it is sent (sent.lua)
            self._to_send[item.request] = (item.slot, leased_at)
            self._ready.appendleft((item.ref, item.request))
        else:
            self._ready.append((item.ref, item.request))

    def hand_out(self) -> Request | None:
        """The next ready request, now in the engine; None when none is ready."""
        if not self._ready:
            return None
        ref, request = self._ready.popleft()
        self._active[ref] = request
        self._fetching[request] = ref
        return request

    def finished(self, in_progress: Container[Request]) -> list[LeaseRef]:
        """The leases of the requests that left the engine, forgotten: to acknowledge."""
        if not self._active:
            return []
        done = [ref for ref, req in self._active.items() if req not in in_progress]
        for ref in done:
            request = self._active.pop(ref)
            self._to_send.pop(request, None)
            self._fetching.pop(request, None)
            self._slots.pop(ref.id, None)
        return done

    def holds(self, request: Request) -> bool:
        """Whether ``request`` is one this worker leased and the engine still has (not a
        robots.txt fetch, nor a download some component made itself)."""
        return any(held is request for held in self._active.values())

    def downloading(self, request: Request) -> bool:
        """``request`` reached the downloader; True when Redis must hear it soon (its
        slot has a delay, whose next turn this lag pushes back)."""
        paced = self._to_send.pop(request, None)
        if paced is not None:
            self._sent.append(paced)
            self._note_unreported(urgent=True)
            return True
        return False

    def left(self, request: Request) -> bool | None:
        """``request`` left the downloader: None if it is not one of ours, True when a
        reserve of its slot took its place (now ready), False when its place is free."""
        ref = self._fetching.pop(request, None)
        if ref is None:
            return None
        if ref in self._swapped:
            # a reserve that took a place since the last report, and left it again: Redis,
            # not told yet, still counts it as holding none, which is true once more. Both
            # reports would count it at the site until its acknowledgement (places.lua reads
            # the freed before the taken), the place lost to the slot meanwhile
            self._swapped.remove(ref)
        else:
            self._freed.append(ref)
        slot = self._slots.pop(ref.id, None)
        waiting = self._reserves.get(slot) if slot is not None else None
        if slot is not None and waiting and not self.holding(slot):
            # a reserve of the same slot takes the place, now; Redis hears of it after
            taken, taken_request = waiting.popleft()
            if not waiting:
                del self._reserves[slot]
            self._slots[taken.id] = slot
            self._swapped.append(taken)
            self._note_unreported(urgent=False)
            self._ready.appendleft((taken, taken_request))
            # no batch of its own: Redis' count is right meanwhile (the place is still
            # counted, for the request that left), and the report goes with the next batch,
            # before any acknowledgement of that request
            return True
        # a place left free: at once when this worker is short of work (a lease in the same
        # batch gives it some); else with its next batch, at most an interval later (a batch
        # on every answer cost Redis a script call a page), which is also how soon a worker
        # short of its share of a contended slot asks again (lease.lua)
        self._note_unreported(urgent=self.starving())
        return False

    def holding(self, slot: str) -> bool:
        """Whether a site asked to wait and the wait is not over (``hold``)."""
        until = self._holds.get(slot)
        if until is None:
            return False
        if until > time.monotonic():
            return True
        del self._holds[slot]
        return False

    def hold(self, slot: str, seconds: float) -> int | None:
        """A site asked to wait ``seconds`` before its next request (holds.py): this
        worker's requests of that slot that are not in the engine yet, ready ones and
        reserves, are given back with the next batch (Redis holds the slot, so they wait in
        the queue for its turn), and so is each one leased before the wait is over.
        Returns how many were given back now; None when the slot was held that long
        already (nothing new to tell the other workers)."""
        now = time.monotonic()
        until = now + seconds
        if until <= self._holds.get(slot, 0.0):
            return None
        # holds are rare, slots many: the ended ones go here, not only when read again
        self._holds = {s: t for s, t in self._holds.items() if t > now}
        self._holds[slot] = until
        back = [ref for ref, _ in self._reserves.pop(slot, ())]
        keep: deque[tuple[LeaseRef, Request]] = deque()
        for ref, request in self._ready:
            if self._slots.get(ref.id) == slot:
                back.append(ref)
                self._to_send.pop(request, None)
            else:
                keep.append((ref, request))
        self._ready = keep
        self._forget(back)
        self._given_back += back
        return len(back)

    def take_given_back(self) -> list[LeaseRef]:
        """The leases of held slots' requests to give back (``hold``), forgotten here."""
        back, self._given_back = self._given_back, []
        return back

    def _take_reserves(self) -> list[LeaseRef]:
        """Every reserve's lease, the reserves forgotten: for giving them back."""
        refs = [ref for q in self._reserves.values() for ref, _ in q]
        self._reserves.clear()
        return refs

    def _forget(self, refs: list[LeaseRef]) -> None:
        for ref in refs:
            self._slots.pop(ref.id, None)

    # -- batches -------------------------------------------------------------------------

    def report(self, batch: Batch) -> None:
        """Put the place reports waiting in ``batch`` (added to any it holds)."""
        batch.sent, self._sent = batch.sent + self._sent, []
        batch.freed, self._freed = batch.freed + self._freed, []
        batch.taken, self._swapped = batch.taken + self._swapped, []
        self._report_urgent, self._unreported_since = False, None

    def report_again(self, batch: Batch) -> None:
        """The batch failed: its place reports go with the next one (they are
        idempotent), rather than being lost."""
        self._freed[:0] = batch.freed
        self._swapped[:0] = batch.taken
        if batch.freed or batch.taken:
            self._note_unreported(urgent=True)

    def release_waiting(self) -> list[LeaseRef]:
        """Give back every request not yet in the engine (pausing)."""
        release = [ref for ref, _ in self._ready] + self._take_reserves()
        release += self.take_given_back()
        self._forget(release)
        for _, request in self._ready:
            self._to_send.pop(request, None)
        self._ready.clear()
        return release

    def abandon(self) -> int:
        """The engine stops waiting for the requests it has (a drain that ended early):
        their leases are never acknowledged, whatever the engine says of them from now on,
        and go back with the close. Returns how many."""
        self._abandoned += self._active
        self._active.clear()
        self._fetching.clear()
        return len(self._abandoned)

    def release_all(self) -> list[LeaseRef]:
        """Give back every lease held, the engine's included (closing)."""
        release = [ref for ref, _ in self._ready] + list(self._active) + self._take_reserves()
        release += self._abandoned + self.take_given_back()
        self._abandoned = []
        self._active.clear()
        self._fetching.clear()
        self._freed, self._swapped = [], []
        self._report_urgent, self._unreported_since = False, None
        self._to_send.clear()
        self._forget(release)
        self._ready.clear()
        return release

    def release_idle_reserves(self, count: bool) -> tuple[list[LeaseRef], Counter[str]]:
        """Reserves of a slot of which this worker has no request left to be replaced
        (they arrived after those left the downloader), to give back and be leased with a
        place; and, when ``count``, how many requests this worker holds per slot."""
        # counted only when needed: a batch can start on every response
        held = Counter(self._slots.values()) if count or self._reserves else Counter()
        release: list[LeaseRef] = []
        for slot in [s for s in self._reserves if not held[s]]:
            release += [ref for ref, _ in self._reserves.pop(slot)]
        return release, held
