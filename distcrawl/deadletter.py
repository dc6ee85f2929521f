"""Reading, filtering and re-driving the dead-letter store (``<ns>:dead``).

Records are JSON written by workers (see ``deadrecord.dead_letter``). A record of a request
carries the encoded request (``payload``), so re-driving restores it exactly (callback,
meta, priority) with a fresh attempt count; a bad ``start_urls`` entry carries its raw entry
and goes back to ``start_urls``, where it is validated again. A record that holds only the
request's URL (its request could not be encoded) becomes the request the spider makes of
that URL (``rebuild``: its ``make_request_from_data``, as for a start URL), so that what the
spider's hook adds (the site spider's ``site_scope``) is not lost with the payload.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request

from distcrawl.frontier import Frontier, Redrive, RedriveKind
from distcrawl.politeness import slot_for
from distcrawl.serialize import DecodeError, RequestCodec, SerializationError

#: dead letters read, and re-driven in one script call, at a time
PAGE = 500

#: meta keys that count attempts: a re-driven request starts again from zero
ATTEMPT_META = ("retry_times", "distcrawl_errors", "distcrawl_callback_failures")

#: makes the request of a record holding only a URL, from ``{"url": ..., "priority": ...}``;
#: raises (anything) when it cannot
Rebuild = Callable[[dict[str, Any]], Request]


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


def _letter(raw: bytes) -> DeadLetter:
    try:
        record = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        record = None
    return DeadLetter(raw, record if isinstance(record, dict) else {"reason": "?"})


def read(frontier: Frontier, limit: int = 0) -> Iterator[DeadLetter]:
    """Dead letters, newest first; ``limit`` 0 means all. Read a page at a time: one LRANGE
    of a whole list of large records would hold Redis for as long as it takes to send."""
    at = 0
    while limit <= 0 or at < limit:
        count = PAGE if limit <= 0 else min(PAGE, limit - at)
        raws: list[bytes] = frontier.client.lrange(frontier.keys.dead, at, at + count - 1)  # type: ignore[assignment]
        yield from (_letter(raw) for raw in raws)
        if len(raws) < count:
            return
        at += count


def _requeue_payload(
    letter: DeadLetter, codec: RequestCodec, rebuild: Rebuild | None = None
) -> tuple[str, int, bytes] | None:
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
    # an import's dead letter holds another crawler's request (callback, body...): a plain
    # GET of its URL would not be that request; the import itself tries it again
    redrivable = record.get("url") and record.get("source") not in ("queue", "import")
    if redrivable and rebuild is not None:
        try:
            entry: dict[str, Any] = {"url": str(record["url"])}
            if record.get("priority"):
                entry["priority"] = int(record["priority"])
            request = rebuild(entry)
            payload = codec.encode(request)
        except Exception:  # the spider's hook or the codec refusing it: nothing to re-drive
            return None
        return slot_for(request.url, request.meta), request.priority, payload
    if redrivable:
        # no spider to make the request with: a GET of the URL, all else lost
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
    page: int = 0,
    rebuild: Rebuild | None = None,
) -> tuple[int, int]:
    """Re-drive the matching dead letters; returns (re-driven, matching but not re-drivable).

    The list is read from its oldest end, ``page`` records at a time, and each page's matches
    go back in one script call that finds them by their index from that end (stable while
    workers push new dead letters at the other end): each call costs the page and its
    distance from that end, never a scan of the list per record."""
    page = page or PAGE
    dead = frontier.keys.dead
    moved = unusable = 0
    skip = 0  # records at the oldest end that stay (they did not match)
    while True:
        raws: list[bytes] = frontier.client.lrange(dead, -(skip + page), -(skip + 1))  # type: ignore[assignment]
        if not raws:
            break
        moves: list[Redrive] = []
        # raws[-1] is the oldest: index -(skip + 1)
        for offset, raw in enumerate(reversed(raws)):
            letter = _letter(raw)
            if not letter.matches(error=error, domain=domain, source=source):
                continue
            move = _move(letter, codec, rebuild)
            if move is None:
                unusable += 1
            else:
                moves.append(move._replace(at=-(skip + offset + 1)))
        done = frontier.redrive(moves)
        moved += done
        skip += len(raws) - done
        if len(raws) < page:
            break
    return moved, unusable


def _move(letter: DeadLetter, codec: RequestCodec, rebuild: Rebuild | None) -> Redrive | None:
    record = letter.record
    if record.get("source") == "start_urls" and record.get("raw") is not None:
        raw = str(record["raw"])
        encoding = record.get("raw_encoding", "utf-8")
        return Redrive(letter.raw, RedriveKind.START_URLS, "", 0, raw.encode(encoding))
    requeue = _requeue_payload(letter, codec, rebuild)
    if requeue is None:
        return None
    return Redrive(letter.raw, RedriveKind.QUEUE, *requeue)
