"""Liveness beats from a thread of their own, so that a busy worker is never taken for dead.

Other workers give a worker's leases back once its tag's score in ``<ns>:alive`` is older than
the worker timeout (10 s by default). If the beat went through the reactor or the crawler's
Redis thread, a long parse, a burst of callbacks or one slow pipeline in front of it could
delay it past that timeout and get a healthy worker's requests fetched twice. So the beat has a
daemon thread and a Redis connection that nothing else uses: it is late only when the process
is frozen or Redis is unreachable, which is what the timeout is meant to detect.

Beats that ride along: a worker's Redis thread runs a batch about once a second even when idle
(scheduler.py), and a ``ZADD alive`` in that batch's pipeline costs no round trip of its own,
where the thread's beat is one more per second for every idle worker. So the batches carry the
beat whenever the last one is half an interval old (``due``), and the thread beats only when no
beat at all reached Redis for ``own_after`` seconds (1.5 intervals for a scheduler's, still
well inside the worker timeout, which is at least three). The guarantee is the one above: a
worker whose reactor or batch thread is stuck, but whose process is alive and can reach Redis,
keeps beating from its own thread and is never taken for dead; only a frozen process or an
unreachable Redis lets the beats lapse.

The score is Redis' own TIME (``lua/alive.lua``): ages are then computed against the clock of
the node holding the key, whatever the clocks of the workers' hosts say.

An idle worker (parked, idle.py: it holds no lease and waits for work in blocking reads) sends
no batch, and nothing of its own depends on a quick beat: it holds nothing to reap. Its beats
(``idle()``) come every third of ``DISTCRAWL_WORKER_TIMEOUT`` instead of every interval, still
three within the timeout, so that it stays live for the fair shares, ``distcrawl status``,
``reset`` and the reaper of its claim list; and each is one plain ``ZADD`` of the server's time
as the last ``alive.lua`` reply and the monotonic clock tell it (``alive.lua`` runs again at
least every ``RESYNC_AFTER`` seconds), not a script of three calls.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence

import redis

from distcrawl.model.connection import auth_refusal, execute_timed, make_redis, redact_url
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.lua import LuaScript, lua_script
from distcrawl.model.redact import redact_error, redacted_exc_info

logger = logging.getLogger(__name__)

_TAG = re.compile(r"[0-9a-fA-F]{8}")
#: how much longer than one Redis call stop() waits for the thread before leaving it behind
JOIN_MARGIN = 1.0
#: a wake-up this close to its due time beats rather than sleeps again for a moment
TICK_SLACK = 0.005
#: an idle worker's plain beats estimate the server's time from the last alive.lua reply;
#: alive.lua runs again once that reply is this old (s)
RESYNC_AFTER = 300.0


class Liveness:
    """Beats ``ZADD <ns>:alive <server ms> <tag>`` every ``interval`` seconds until stopped.

    Nothing is sent before ``start()`` or ``beat()``: creating one costs no I/O, so it can be
    built wherever the scheduler is configured, reactor thread included.
    """

    def __init__(
        self,
        redis_url: str,
        keys: FrontierKeys,
        tag: str,
        *,
        interval: float,
        socket_timeout: float,
        own_after: float | None = None,
        cluster: bool | None = False,
        shards: Sequence[FrontierKeys] = (),
        idle_interval: float | None = None,
    ) -> None:
        if not _TAG.fullmatch(tag):
            raise ValueError(f"invalid worker tag {tag!r}: expected 8 hex characters")
        if interval <= 0 or socket_timeout <= 0:
            raise ValueError(
                f"interval and socket_timeout must be positive: {interval!r}, {socket_timeout!r}"
            )
        self.keys = keys
        #: the shards' keys (DISTCRAWL_SHARDS): each shard's scripts read its own ``alive``
        self.shards = tuple(k for k in shards if k != keys)
        self.tag = tag
        self.interval = interval
        #: the thread beats once no beat (its own or one riding with a batch) reached Redis
        #: for this long; default one interval, for a Liveness nobody else beats for
        self.own_after = interval if own_after is None else own_after
        self.socket_timeout = socket_timeout
        #: the beats' period while the worker is idle (``idle()``): default ``own_after``
        self.idle_interval = self.own_after if idle_interval is None else idle_interval
        self._idle = False
        #: per key set (the crawl's, then each shard's): the server's ms at the last
        #: alive.lua reply and the monotonic time it came
        self._synced: list[tuple[int, float]] = []
        #: set to end the thread's sleep early (idle() changed how long it may sleep)
        self._tick = threading.Event()
        #: called (on the liveness thread) when a plain beat found the tag gone from alive
        self.on_readded: Callable[[], None] | None = None
        #: monotonic time at which the last beat, from whichever thread, reached Redis
        self._last = float("-inf")
        #: beats that reached Redis, for stats (written by whichever thread beats)
        self.beats = 0
        self._url = redis_url
        #: whether redis_url is a Redis Cluster node (None: ask it, on this thread)
        self._cluster = cluster
        self._client: redis.Redis | None = None
        self._script: LuaScript | None = None
        # held for each beat and for the final ZREM, so that a beat in flight when stop()
        # gives up waiting cannot land after the tag was removed and resurrect it
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._failing = False

    # ------------------------------------------------------------------ public API

    def start(self) -> None:
        """Start the thread: it beats at once, then every ``interval`` seconds."""
        if self._thread is not None or self._closed:
            raise RuntimeError("Liveness.start() called twice or after stop()")
        self._thread = threading.Thread(
            target=self._run, name=f"distcrawl-liveness-{self.tag}", daemon=True
        )
        self._thread.start()

    def beat(self) -> None:
        """One beat, synchronous; raises redis.RedisError when Redis cannot be reached.

        After ``stop()`` it does nothing: a tag removed at a clean close must stay removed.
        """
        with self._lock:
            if self._closed:
                return
            parts = (self.keys, *self.shards)
            now = time.monotonic()
            synced = len(self._synced) == len(parts) and all(
                now - at < RESYNC_AFTER for _, at in self._synced
            )
            if self._idle and synced:
                # the server's time as the last alive.lua told it: one plain ZADD a key set
                pipe = self._redis().pipeline(transaction=False)
                for keys, (ms, at) in zip(parts, self._synced, strict=True):
                    pipe.zadd(keys.alive, {self.tag: ms + int((now - at) * 1000)})
                if any(pipe.execute()):
                    # the tag was gone: taken for dead (a frozen process, a server clock that
                    # jumped ahead of the estimate) or a reset. alive.lua next time, and the
                    # claim list registered again (idle.py)
                    self._synced = []
                    if self.on_readded is not None:
                        self.on_readded()
            else:
                if self._script is None:
                    self._script = lua_script(self._redis(), "alive")
                synced_now = []
                for keys in parts:
                    ms = self._script(keys=keys.script_keys("alive"), args=[self.tag])
                    synced_now.append((int(ms), time.monotonic()))
                self._synced = synced_now
            self.beats += 1
            self._last = time.monotonic()

    def idle(self, idle: bool) -> None:
        """The worker is idle (parked: no lease held, waiting for work in blocking reads)
        or no longer: its thread beats every ``idle_interval`` s, with plain ZADDs, or
        again every ``own_after`` s."""
        if idle != self._idle:
            self._idle = idle
            self._tick.set()

    def due(self, ahead: float = 0.0) -> bool:
        """Whether a batch should carry a beat: the last one is half an interval old, or will
        be by the time the beat reaches Redis (``ahead`` s: an idle poll's beat goes after its
        wait for work). Never a reason to run a batch: the thread beats when none does."""
        if self._idle:
            return False  # the thread's rarer beats are enough
        return not self._closed and time.monotonic() + ahead - self._last >= self.interval / 2

    def noted(self, stamps: Sequence[int] = ()) -> None:
        """A beat that rode with a batch reached Redis (``Frontier.alive_op``); ``stamps``:
        the server's ms each key set's alive.lua wrote, when known."""
        self.beats += 1
        self._last = time.monotonic()
        if len(stamps) == 1 + len(self.shards):
            self._synced = [(int(ms), self._last) for ms in stamps]

    def stop(self, *, clean: bool) -> None:
        """Stop beating; ``clean=True`` (a normal close) also removes the tag, so that nobody
        waits for it to lapse or reaps leases it no longer holds. ``clean=False`` leaves the
        score to age, as a crash would: the others then reap it after the worker timeout.

        Waits at most about one Redis call for the thread, and never raises on Redis
        trouble: it runs while the worker closes, where an error would only hide the reason
        for closing.
        """
        self._stopping.set()
        self._tick.set()
        bound = self.socket_timeout + JOIN_MARGIN
        deadline = time.monotonic() + bound
        if self._thread is not None:
            self._thread.join(bound)
        locked = self._lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
        if not locked:
            logger.warning(
                "Liveness beat of worker %s still in flight after %.1fs; leaving it behind",
                self.tag,
                bound,
            )
        try:
            self._closed = True
            if clean:
                try:
                    for keys in (self.keys, *self.shards):
                        self._redis().zrem(keys.alive, self.tag)
                except redis.RedisError as exc:
                    logger.warning(
                        "Could not remove worker %s from %s at %s (%s); it will be reaped "
                        "as dead once its last beat is old",
                        self.tag,
                        self.keys.alive,
                        redact_url(self._url),
                        redact_error(exc, self._url),
                    )
        finally:
            if locked:
                self._lock.release()
        if self._client is not None:
            self._client.close()

    # ------------------------------------------------------------------ internals

    def _redis(self) -> redis.Redis:
        if self._client is None:
            self._client = make_redis(
                self._url, socket_timeout=self.socket_timeout, cluster=self._cluster
            )
        return self._client

    def _run(self) -> None:
        # wakes when the last beat, whoever sent it, is ``own_after`` old; after a failed
        # beat it tries again one interval later
        while not self._stopping.is_set():
            every = self.idle_interval if self._idle else self.own_after
            if time.monotonic() - self._last >= every - TICK_SLACK:
                self._beat_logged()
            wait = self._last + every - time.monotonic()
            if wait <= TICK_SLACK:
                wait = self.interval
            self._tick.wait(wait)
            self._tick.clear()

    def _beat_logged(self) -> None:
        """A beat whose failure is logged once per outage: a dead Redis must not flood the
        log with one line per interval, nor kill the thread and leave the worker beatless
        once Redis is back."""
        try:
            self.beat()
        except Exception as exc:
            if not self._failing:
                self._failing = True
                refusal = auth_refusal(exc)
                logger.warning(
                    "Liveness beats of worker %s to %s failing (%s%s: %s); other workers will "
                    "take back its requests if this lasts",
                    self.tag,
                    redact_url(self._url),
                    f"{refusal}, " if refusal else "",
                    type(exc).__name__,
                    redact_error(exc, self._url),
                    exc_info=None
                    if isinstance(exc, redis.RedisError)
                    else redacted_exc_info(exc, self._url),
                )
            return
        if self._failing:
            self._failing = False
            logger.info(
                "Liveness beats of worker %s to %s succeed again", self.tag, redact_url(self._url)
            )


def live_workers(client: redis.Redis, keys: FrontierKeys, worker_timeout: float) -> list[str]:
    """The tags of the workers whose last beat is younger than ``worker_timeout`` seconds,
    by the clock of the server holding the beats (the reaper's): those an operator's
    command that changes the whole frontier (a reset, a move) would pull the floor from."""
    (seconds, micros) = execute_timed(client, client.pipeline(transaction=False), keys.alive)[-1]
    since = int(seconds) * 1000 + int(micros) // 1000 - int(worker_timeout * 1000)
    tags: list[bytes] = client.zrange(keys.alive, since, "+inf", byscore=True)  # type: ignore[assignment]
    return [t.decode(errors="replace") if isinstance(t, bytes) else str(t) for t in tags]
