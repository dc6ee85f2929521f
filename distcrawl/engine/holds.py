"""A slot a site asked to wait for, held back by every worker at once, not a batch later.

A 429 or 503 with ``Retry-After`` holds its slot back in Redis (commit.lua): nothing of it is
leased before the time is up. But workers already hold requests of that slot, ready for the
engine or kept as reserves, and a reserve takes a place the moment a request of its slot
leaves the downloader: the answered 429 itself. Left alone they reach the site within the
Retry-After: the worker that read the answer's at once, the others' until their leases run
out. So the worker that reads such an answer publishes the slot and the wait on the crawl's
channel (``FrontierKeys.holds``) the moment it reads it, and every worker, itself included,
gives back the requests of that slot it holds and has not sent (``Leases.hold``); they wait
in the queue for the slot's turn.

A message is a hint, never work: lost (a connection down, a worker subscribing late) the
crawl is as it was without it, and Redis still holds the slot; one that is not a hold is
logged and ignored (a shared Redis lets others publish). Subscribing costs Redis nothing
while no site says to wait: a subscribed connection sends no command but redis-py's health
check (a PING every 30 s of silence).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from distcrawl.codec.politeness import Hold, parse_hold
from distcrawl.model.connection import node_client
from distcrawl.model.redact import redact_error

logger = logging.getLogger(__name__)

#: seconds a subscriber's read waits before it looks whether it must stop
LISTEN_WAIT = 1.0
#: seconds a subscription that failed (Redis unreachable) waits before it is made again
RETRY_AFTER = 1.0


class HoldListener:
    """This worker's subscription to the crawl's holds, on a daemon thread and a connection
    of its own; ``deliver`` is called on that thread with each hold (the scheduler passes it
    on to the reactor)."""

    def __init__(
        self,
        redis_url: str,
        channel: str,
        *,
        socket_timeout: float,
        cluster: bool | None,
        max_ms: int,
        deliver: Callable[[Hold], None],
    ) -> None:
        self.channel = channel
        self._url = redis_url
        self._socket_timeout = socket_timeout
        self._cluster = cluster
        self._max_ms = max_ms
        self._deliver = deliver
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: set once the subscription is in place (tests wait for it)
        self.subscribed = threading.Event()
        #: messages that were not a hold, ignored
        self.ignored = 0
        #: the Redis user may not subscribe (an ACL without the channel): the thread ended
        self.refused = False

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="distcrawl-holds", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """No more messages are delivered; the thread ends within LISTEN_WAIT."""
        self._stop.set()

    def _run(self) -> None:
        failed = False
        while not self._stop.is_set():
            client: redis.Redis | None = None
            subscription: Any = None
            try:
                client = node_client(
                    self._url,
                    self.channel,
                    socket_timeout=LISTEN_WAIT + self._socket_timeout,
                    cluster=self._cluster,
                )
                subscription = client.pubsub(ignore_subscribe_messages=True)
                subscription.subscribe(self.channel)
                self.subscribed.set()
                if failed:
                    logger.info("Subscribed to %s again", self.channel)
                    failed = False
                self._listen(subscription)
            except redis.exceptions.NoPermissionError as exc:
                # a worker ACL user made before the channel was granted: no retry mends it
                logger.warning(
                    "The Redis user may not subscribe to %s (%s): this worker will not hear "
                    "other workers' holds, and only Redis holds a slot back for it; create "
                    "the worker user again with `distcrawl acl`",
                    self.channel,
                    redact_error(exc, self._url),
                )
                self.refused = True
                return
            except Exception as exc:
                # an outage (RedisError, OSError), or a bug: the thread goes on either way
                self.subscribed.clear()
                if not failed:
                    # once per outage: the batches log the outage itself
                    logger.warning(
                        "Cannot hear other workers' holds on %s (%s: %s): only Redis holds "
                        "a slot back for this worker until it can",
                        self.channel,
                        type(exc).__name__,
                        redact_error(exc, self._url),
                    )
                    failed = True
                self._stop.wait(RETRY_AFTER)
            finally:
                if subscription is not None:
                    subscription.close()
                if client is not None:
                    client.close()

    def _listen(self, subscription: Any) -> None:
        while not self._stop.is_set():
            message = subscription.get_message(timeout=LISTEN_WAIT)
            if message is None or message.get("type") != "message":
                continue
            hold = parse_hold(message.get("data"), self._max_ms)
            if hold is None:
                self.ignored += 1
                if not _logged(self.ignored):
                    continue
                logger.warning(
                    "Ignored a message on %s that is not a hold (%d so far): %r",
                    self.channel,
                    self.ignored,
                    str(message.get("data"))[:200],
                )
                continue
            self._deliver(hold)


def _logged(count: int) -> bool:
    """The 1st, 10th, 100th... message that is not a hold is logged: a shared Redis lets
    anyone publish, and a flood of them must not flood the log."""
    while count % 10 == 0:
        count //= 10
    return count == 1
