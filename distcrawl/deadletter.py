"""Reading, filtering and re-driving the dead-letter store (``<ns>:dead``).

Records are JSON written by workers (see ``frontier.dead_letter``). A record of a request
carries the encoded request (``payload``), so re-driving restores it exactly (callback,
meta, priority) with a fresh attempt count; a bad ``start_urls`` entry carries its raw entry
and goes back to ``start_urls``, where it is validated again.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from distcrawl.frontier import Frontier
from distcrawl.politeness import slot_for
from distcrawl.serialize import DecodeError, RequestCodec, SerializationError

#: meta keys that count attempts: a re-driven request starts again from zero
ATTEMPT_META = ("retry_times", "distcrawl_errors", "distcrawl_callback_failures")


@dataclass(frozen=True)
class DeadLetter:
    raw: bytes
    record: dict[str, Any]

    @property
    def url(self) -> str:
        return str(self.record.get("url") or "")

    def matches(self, *, error: str | None, domain: str | None, source: str | None) -> bool:
        if source is not None and self.record.get("source") != source:
            return False
        if error is not None:
            text = f"{self.record.get('reason', '')} {self.record.get('last_error', '')}"
            if error.lower() not in text.lower():
                return False
        if domain is not None:
            host = (urlsplit(self.url).hostname or "").lower()
            wanted = domain.lower()
            if host != wanted and not host.endswith("." + wanted):
                return False
        return True


def read(frontier: Frontier, limit: int = 0) -> Iterator[DeadLetter]:
    """Dead letters, newest first; ``limit`` 0 means all."""
    raws: list[bytes] = frontier.client.lrange(frontier.keys.dead, 0, limit - 1)  # type: ignore[assignment]
    for raw in raws:
        try:
            record = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        yield DeadLetter(raw, record if isinstance(record, dict) else {"reason": "?"})


def _requeue_payload(letter: DeadLetter, codec: RequestCodec) -> tuple[str, int, bytes] | None:
    record = letter.record
    if record.get("payload"):
        try:
            data = codec.decode_dict(base64.b64decode(record["payload"]))
        except (binascii.Error, ValueError, DecodeError):
            return None
        meta = {k: v for k, v in (data.get("M") or {}).items() if k not in ATTEMPT_META}
        if meta:
            data["M"] = meta
        else:
            data.pop("M", None)
        slot = slot_for(str(data.get("u", "")), data.get("M"))
        return slot, int(data.get("p", 0)), codec.encode_dict(data)
    if record.get("url") and record.get("source") != "queue":
        try:
            payload = codec.encode_dict({"u": record["url"]})
            return slot_for(record["url"], None), int(record.get("priority") or 0), payload
        except SerializationError:
            return None
    return None


def redrive(
    frontier: Frontier,
    codec: RequestCodec,
    *,
    error: str | None = None,
    domain: str | None = None,
    source: str | None = None,
) -> tuple[int, int]:
    """Re-drive the matching dead letters; returns (re-driven, matching but not re-drivable)."""
    moves: list[tuple[bytes, str, str, int, bytes]] = []
    unusable = 0
    for letter in read(frontier):
        if not letter.matches(error=error, domain=domain, source=source):
            continue
        if letter.record.get("source") == "start_urls" and letter.record.get("raw") is not None:
            raw = str(letter.record["raw"])
            encoding = letter.record.get("raw_encoding", "utf-8")
            moves.append((letter.raw, "u", "", 0, raw.encode(encoding)))
            continue
        requeue = _requeue_payload(letter, codec)
        if requeue is None:
            unusable += 1
            continue
        moves.append((letter.raw, "q", *requeue))
    return frontier.redrive(moves), unusable
