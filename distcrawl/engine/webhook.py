"""The completion webhook (DISTCRAWL_FINISH_WEBHOOK): the crawl's one ``finished`` event,
POSTed as JSON to a URL of the operator's, with retries.

The event itself is decided and recorded exactly once, in Redis, by finish.lua (an entry of
``<ns>:events``); its id stays in ``<ns>:lifecycle``'s ``webhook`` field until a POST of it
was answered 2xx. The worker whose call finished the crawl posts it at once; the reaper of
any worker finds an event whose delivery is still pending (that worker was killed, or the
endpoint was down through every retry) and posts it again, one worker at a time (a lock of
an attempt and its wait, renewed). So the endpoint gets the event at least once, and with the same
``id`` (also sent as the ``Idempotency-Key`` header) however often: a receiver that keeps
the ids it has seen acts on it exactly once.

The POST runs in a thread of the reactor's pool (urllib, a bounded timeout), never on the
reactor; the URL is logged redacted (credentials in it never appear in a log line).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import redis

from distcrawl.model.redact import redact_url

if TYPE_CHECKING:
    from distcrawl.model.keys import FrontierKeys

logger = logging.getLogger(__name__)

#: POST attempts per delivery, and the wait before each retry (doubling from the first)
ATTEMPTS = 5
FIRST_RETRY_S = 1.0
#: seconds one POST may take
TIMEOUT_S = 10.0
#: how long one worker holds the delivery past the attempt it starts (s): renewed before
#: each attempt, so a worker killed mid-delivery holds it up for one attempt at most
LOCK_MARGIN_S = 5.0


def _lock_ms(wait: float) -> int:
    return int((TIMEOUT_S + wait + LOCK_MARGIN_S) * 1000)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def event_payload(namespace: str, event_id: str, fields: dict[Any, Any]) -> dict[str, Any]:
    """The JSON body of the event stored under ``event_id``: its fields, the crawl-wide
    counters (``stats.*``) gathered under ``stats``."""
    plain = {_text(k): _text(v) for k, v in fields.items()}
    stats = {k[len("stats.") :]: int(v) for k, v in plain.items() if k.startswith("stats.")}
    return {
        "crawl": namespace,
        "event": plain.get("event", "finished"),
        "id": event_id,
        "run": int(plain.get("run", 0)),
        "at": int(plain.get("at", 0)),
        "by": plain.get("by", ""),
        "stats": stats,
    }


class FinishWebhook:
    """Delivers completion events for one worker; ``deliver`` runs in a thread."""

    def __init__(self, url: str, client: redis.Redis, keys: FrontierKeys, tag: str) -> None:
        self.url = url
        self.client = client
        self.keys = keys
        self.tag = tag
        #: a delivery is under way in this worker (the reaper does not start another)
        self.busy = False

    def deliver(self, event_id: str) -> bool:
        """POST the event, retrying; True once it is delivered (by this call or before)."""
        k = self.keys
        if not self.client.set(k.webhook_lock, self.tag, nx=True, px=_lock_ms(FIRST_RETRY_S)):
            return False  # another worker delivers it
        try:
            if _text(self.client.hget(k.lifecycle, "webhook") or b"") != event_id:
                return True  # delivered meanwhile
            found = self.client.xrange(k.events, event_id, event_id)
            if not found:
                logger.error(
                    "Completion event %s is no longer in %s: its webhook is not sent",
                    event_id,
                    k.events,
                )
                self.client.hdel(k.lifecycle, "webhook")
                return False
            fields = dict(found[0][1] or {})
            body = json.dumps(event_payload(k.namespace, event_id, fields)).encode()
            if self._post(event_id, body):
                self._delivered(event_id)
                return True
            return False
        finally:
            if _text(self.client.get(k.webhook_lock) or b"") == self.tag:
                self.client.delete(k.webhook_lock)

    def _post(self, event_id: str, body: bytes) -> bool:
        shown = redact_url(self.url)
        wait = FIRST_RETRY_S
        for attempt in range(1, ATTEMPTS + 1):
            # still this worker's for this attempt and the wait after it
            self.client.set(self.keys.webhook_lock, self.tag, px=_lock_ms(wait))
            request = urllib.request.Request(
                self.url,
                data=body,
                method="POST",
                headers={"Content-Type": "application/json", "Idempotency-Key": event_id},
            )
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                    status = answer.status
            except urllib.error.HTTPError as exc:
                status, why = exc.code, f"HTTP {exc.code}"
            except (OSError, ValueError) as exc:
                status, why = 0, type(exc).__name__
            else:
                why = f"HTTP {status}"
            if 200 <= status < 300:
                logger.info("Completion event %s posted to %s", event_id, shown)
                return True
            logger.warning(
                "Completion webhook %s refused event %s (%s), attempt %d of %d",
                shown,
                event_id,
                why,
                attempt,
                ATTEMPTS,
            )
            if attempt < ATTEMPTS:
                time.sleep(wait)
                wait *= 2
        logger.error(
            "Completion event %s not delivered to %s after %d attempts: the reaper tries again",
            event_id,
            shown,
            ATTEMPTS,
        )
        return False

    def _delivered(self, event_id: str) -> None:
        """Clear the pending mark, if it is still this event's (a later run's stays)."""
        k = self.keys
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(k.lifecycle)
                if _text(pipe.hget(k.lifecycle, "webhook") or b"") == event_id:
                    pipe.multi()
                    pipe.hdel(k.lifecycle, "webhook")
                    pipe.execute()
            except redis.RedisError:  # a changed mark (the next run's): kept
                logger.debug("Webhook mark of %s changed meanwhile", event_id)
