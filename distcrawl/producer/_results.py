"""What a push returns (:class:`Outcome`, :class:`PushResult`), what a redrive returns, the
producer's error, and how a dead-letter record is read back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from distcrawl.model.redact import redact_url


class Outcome(str, Enum):
    """What happened to one pushed entry."""

    #: stored in the frontier's queue (target "queue")
    QUEUED = "queued"
    #: pushed to ``<ns>:start_urls`` (target "start_urls"); a worker makes the request
    ACCEPTED = "accepted"
    #: the URL's fingerprint is in the seen-set: nothing stored (a re-sent push is a no-op)
    SEEN = "seen"
    #: the entry can never become a request; ``reason`` says why, as a dead letter would
    REFUSED = "refused"
    #: the crawl is at DISTCRAWL_MAX_PENDING: nothing stored, push again later
    FULL = "full"


@dataclass(frozen=True)
class PushResult:
    outcome: Outcome
    #: the URL of the request (None when the entry did not parse)
    url: str | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the URL is, or already was, in the crawl's hands."""
        return self.outcome in (Outcome.QUEUED, Outcome.ACCEPTED, Outcome.SEEN)

    def as_dict(self) -> dict[str, Any]:
        """For JSON and task results: the URL redacted (a URL may carry a password)."""
        url = None if self.url is None else redact_url(self.url)
        return {"outcome": self.outcome.value, "url": url, "reason": self.reason}


@dataclass(frozen=True)
class RedriveResult:
    redriven: int
    #: matching records that hold no request to re-drive
    not_redrivable: int


class ProducerError(RuntimeError):
    """The producer cannot push for this crawl (spider not found, layout disagreement)."""


def dead_record(raw: bytes) -> dict[str, Any]:
    """The stored record, or (for something else LPUSHed there) its text as ``raw``."""
    text = raw.decode("utf-8", errors="backslashreplace")
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict):
        return {"reason": "not a dead-letter record", "source": None, "raw": text}
    return record


def _url_of(item: Any) -> str | None:
    if isinstance(item, Mapping):
        url = item.get("url")
        return url if isinstance(url, str) else None
    if isinstance(item, str) and not item.lstrip().startswith("{"):
        return item.strip()
    return None
