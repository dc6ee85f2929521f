"""An idle worker's waits for work: blocking reads on connections of their own, not polls.

A worker whose lease poll found the shared queue empty and that holds nothing is *parked*
(parking.py): it sends no lease poll and no claim, and waits in Redis instead, on two blocking
commands that return the moment work arrives:

- ``BLMOVE <ns>:start_urls <ns>:claims:<tag> RIGHT LEFT`` takes a pushed start URL straight
  into this worker's claim list, as ``claim.lua`` would: the entry is never out of Redis
  without being in a claim list registered in ``<ns>:claimants`` (``SADD`` before the first
  wait of a park), so a worker killed at any instant loses nothing; the reaper gives the claim
  list back once its beats lapse. A plain ``LPUSH`` of a producer ends it at once.
- ``BLPOP <ns>:wake`` takes a wake-up token that a commit pushed with the requests it queued
  (commit.lua): work another worker discovered.

Each runs on a daemon thread with a connection that nothing else uses, so the crawler's Redis
thread stays free, and each is one command per ``timeout`` seconds while nothing comes (a
blocking command costs Redis nothing while it waits). A wait that returns something disarms
itself and hands it to the reactor (``deliver``); the scheduler re-arms both when it parks
again. While a ``BLMOVE`` may be waiting, the claim list may still grow: the scheduler neither
claims with ``claim.lua`` nor gives its claims back until ``claiming`` is False; ``end_claims``
ends that wait early with ``CLIENT UNBLOCK`` where the Redis user may send it (else the wait
runs out its timeout, at most ``CLAIM_WAIT`` seconds).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from distcrawl.model.connection import node_client
from distcrawl.model.keys import FrontierKeys

logger = logging.getLogger(__name__)

#: seconds a BLMOVE waits for a start URL before it is sent again (also the longest a close
#: or a pause waits for it when CLIENT UNBLOCK is refused); at most half the worker timeout
#: (``claim_wait_for``)
CLAIM_WAIT = 10.0
#: seconds a BLPOP waits for a wake-up token before it is sent again
WAKE_WAIT = 30.0
#: seconds between two CLIENT UNBLOCKs while ending a BLMOVE wait that is still being sent
UNBLOCK_EVERY = 0.1
#: seconds a wait that failed (Redis unreachable) waits before it is armed again
RETRY_AFTER = 1.0
#: seconds a parked worker's claim wait may be late (frozen process, stalled thread) before
#: it registers its claim list again with the next BLMOVE: a worker frozen long enough to be
#: taken for dead (a third of the worker timeout late, at least) had its claim list given back
#: and unregistered by the reaper
STALL = 1.0
#: seconds between a parked worker's looks for dead workers' work (batch.py); one of the
#: parked workers looks per interval (``<ns>:reaper:idle``)
IDLE_REAP_INTERVAL = 30.0


def claim_wait_for(worker_timeout: float) -> float:
    """How long a parked worker's BLMOVE may wait: under the worker timeout less one idle
    beat interval (a third of it), so that a BLMOVE sent by a worker that then froze or died
    has returned in Redis before anyone can take the worker for dead and give its claim list
    back (unregistering it): no entry moves into a list nobody will find. Half the timeout
    keeps a sixth of it as margin."""
    return min(CLAIM_WAIT, worker_timeout / 2)


class BlockingWait:
    """One blocking command sent again and again while armed, on a thread and a connection
    of its own; the first reply that is not empty (or the first error) disarms it and is
    handed to ``deliver`` (or ``failed``)."""

    def __init__(
        self,
        name: str,
        make_client: Callable[[], redis.Redis],
        command: Callable[[redis.Redis, bool], Any],
        deliver: Callable[[Any], None],
        failed: Callable[[BaseException], None],
        *,
        want_id: bool = False,
        wait: float = 0.0,
        stall: float | None = None,
    ) -> None:
        self.name = name
        #: the command's own timeout, and how much longer than that a command (or the gap
        #: before the next) may take before the next one counts as the first of an arming
        #: again (``command``'s ``fresh``): the process was frozen, and may have been taken
        #: for dead meanwhile (its claim list given back and unregistered)
        self._wait = wait
        self._stall = stall
        self._ended: float | None = None
        self._make_client = make_client
        self._command = command
        self._deliver = deliver
        self._failed = failed
        self._want_id = want_id
        self._cond = threading.Condition()
        self._armed = False
        #: the next command is the first of this arming (``command``'s second argument)
        self._fresh = False
        #: a command is being sent or waits in Redis
        self._outstanding = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._client: redis.Redis | None = None
        #: CLIENT ID of the connection the command waits on (None: unknown or refused)
        self.client_id: int | None = None
        #: commands sent, for tests and stats
        self.sent = 0

    @property
    def outstanding(self) -> bool:
        with self._cond:
            return self._outstanding

    @property
    def armed(self) -> bool:
        with self._cond:
            return self._armed

    def arm(self) -> None:
        with self._cond:
            if self._stopping:
                return
            if not self._armed:
                self._armed = self._fresh = True
                self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"distcrawl-{self.name}", daemon=True
                )
                self._thread.start()

    def refresh(self) -> None:
        """The next command is sent as the first of an arming (``fresh``)."""
        with self._cond:
            self._fresh = True

    def disarm(self) -> None:
        """Send the command no more; one waiting in Redis ends at its timeout (or reply)."""
        with self._cond:
            self._armed = False

    def quiet(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until no command is outstanding; whether none is."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._outstanding, timeout)

    def unblock(self) -> None:
        """Ask Redis to end the wait now (CLIENT UNBLOCK, from another connection of the same
        pool); nothing happens when the user may not, or no command waits."""
        client, client_id = self._client, self.client_id
        if client is None or client_id is None:
            return
        other = redis.Redis(connection_pool=client.connection_pool)
        try:
            other.client_unblock(client_id)
        except redis.RedisError as exc:
            logger.debug("CLIENT UNBLOCK refused (%s): the wait runs out its timeout", exc)
            self.client_id = None

    def stop(self, *, cut: bool = False) -> None:
        """End the thread: the command waiting in Redis, if any, is left to its timeout and
        the connection closed once it returns; ``cut``: the connection is closed now (a
        BLPOP of a closed worker would take a wake-up token another worker waits for)."""
        with self._cond:
            self._stopping = True
            self._armed = False
            self._cond.notify_all()
            outstanding = self._outstanding
        client = self._client
        if cut and outstanding and client is not None and client.connection is not None:
            try:
                client.connection.disconnect()
            except Exception:
                logger.debug("cutting a wait's connection failed", exc_info=True)

    def _stalled(self, late: float) -> bool:
        return self._stall is not None and late > self._stall

    def _connect(self) -> redis.Redis:
        if self._client is None:
            self._client = self._make_client()
            self.client_id = None
            if self._want_id:
                try:
                    self.client_id = int(self._client.client_id())
                except redis.ResponseError:
                    self.client_id = None  # CLIENT not granted: waits run out instead
        return self._client

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                logger.debug("closing a wait's connection failed", exc_info=True)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._armed or self._stopping)
                if self._stopping:
                    break
                self._outstanding = True
                fresh, self._fresh = self._fresh, False
            began = time.monotonic()
            if self._stalled(began - (began if self._ended is None else self._ended)):
                fresh = True  # frozen between two commands
            reply: Any = None
            error: BaseException | None = None
            try:
                client = self._connect()
                self.sent += 1
                reply = self._command(client, fresh)
            except Exception as exc:
                error = exc
            self._ended = time.monotonic()
            with self._cond:
                if self._stalled(self._ended - began - self._wait):
                    self._fresh = True  # frozen while it waited
                self._outstanding = False
                if reply is not None or error is not None:
                    self._armed = False
                self._cond.notify_all()
                stopping = self._stopping
            if error is not None:
                self._drop_client()
            if stopping:
                break
            if error is not None:
                self._failed(error)
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, RETRY_AFTER)
            elif reply is not None:
                self._deliver(reply)
        self._drop_client()


class IdleWaits:
    """The two waits of a parked worker (see the module docstring). ``deliver(kind, value)``
    is called on the waits' threads: ``("claimed", raw entry)``, ``("woken", None)`` or
    ``("failed", error)``; the scheduler passes it on to its reactor."""

    def __init__(
        self,
        redis_url: str,
        keys: FrontierKeys,
        tag: str,
        *,
        socket_timeout: float,
        cluster: bool | None,
        deliver: Callable[[str, Any], None],
        claim_wait: float = CLAIM_WAIT,
        wake_wait: float = WAKE_WAIT,
    ) -> None:
        self.keys = keys
        self.tag = tag
        self._url = redis_url
        self._cluster = cluster
        self._deliver = deliver
        self.claim_wait = claim_wait
        self.wake_wait = wake_wait
        self._socket_timeout = socket_timeout
        self._claims = BlockingWait(
            f"claims-{tag}",
            lambda: self._client_for(keys.start_urls, claim_wait),
            self._claim,
            lambda raw: deliver("claimed", raw),
            lambda exc: deliver("failed", exc),
            want_id=True,
            wait=claim_wait,
            stall=STALL,
        )
        self._wake = BlockingWait(
            f"wake-{tag}",
            lambda: self._client_for(keys.wake, wake_wait),
            self._wait_wake,
            lambda _: deliver("woken", None),
            lambda exc: deliver("failed", exc),
        )
        self._ending: threading.Thread | None = None

    # -- what the scheduler calls (reactor thread: nothing here blocks) ------------------

    def park(self, *, claims: bool) -> None:
        """Wait for work: for a wake-up token, and (``claims``) for a start URL."""
        self._wake.arm()
        if claims:
            self._claims.arm()

    def registered_again(self) -> None:
        """This worker's liveness beat found its tag gone from ``alive`` (taken for dead, or
        a reset): its claim list is registered again before the next BLMOVE."""
        self._claims.refresh()

    def unpark(self) -> None:
        """Stop waiting: neither wait is sent again; one already waiting in Redis goes on
        until it returns (a BLMOVE: ``claiming``, what it takes is handed over as any claim)."""
        self._wake.disarm()
        self._claims.disarm()

    @property
    def claiming(self) -> bool:
        """Whether a BLMOVE may still move an entry into this worker's claim list: armed or
        waiting in Redis. The claim list is then neither claimed from nor given back."""
        return self._claims.armed or self._claims.outstanding

    def end_claims(self) -> None:
        """End the BLMOVE wait soon: disarmed, and CLIENT UNBLOCK sent (on a thread of its
        own) until it returns; ``claiming`` turns False then."""
        self._claims.disarm()
        if not self._claims.outstanding or (self._ending and self._ending.is_alive()):
            return
        self._ending = threading.Thread(
            target=self._end_claims, name=f"distcrawl-unblock-{self.tag}", daemon=True
        )
        self._ending.start()

    def stop(self) -> None:
        """No more waits; the wake-up wait's connection is closed at once (it holds no
        claim: nothing is lost), the BLMOVE's only once it returned (``end_claims``)."""
        self._claims.stop()
        self._wake.stop(cut=True)

    @property
    def sent(self) -> int:
        return self._claims.sent + self._wake.sent

    # -- the waits' threads ------------------------------------------------------------

    def _end_claims(self) -> None:
        deadline = time.monotonic() + self.claim_wait + self._socket_timeout
        while self._claims.outstanding and time.monotonic() < deadline:
            self._claims.unblock()
            if self._claims.quiet(UNBLOCK_EVERY if self._claims.client_id is not None else 1.0):
                return

    def _client_for(self, key: str, wait: float) -> redis.Redis:
        """A client of one connection to the node holding ``key``, whose reads outlast
        ``wait``."""
        return node_client(
            self._url, key, socket_timeout=wait + self._socket_timeout, cluster=self._cluster
        )

    def _claim(self, client: redis.Redis, fresh: bool) -> bytes | None:
        k = self.keys
        if fresh:
            # registered before the first entry can move: the reaper finds the claim list
            # of a worker killed right after (commit.lua unregisters an emptied list)
            client.sadd(k.claimants, self.tag)
        # a float (Redis 6+): rounded down to whole seconds, a short wait would be 0: for ever
        wait: Any = round(self.claim_wait, 3)
        reply: bytes | None = client.blmove(  # type: ignore[assignment]
            k.start_urls, k.claims(self.tag), wait, "RIGHT", "LEFT"
        )
        return reply

    def _wait_wake(self, client: redis.Redis, fresh: bool) -> bool | None:
        reply = client.blpop([self.keys.wake], self.wake_wait)
        return None if reply is None else True
