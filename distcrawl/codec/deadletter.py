"""Reading, filtering and re-driving the dead-letter store (``<ns>:dead``).

Records are JSON written by workers (see ``deadrecord.dead_letter``). A record of a request
carries the encoded request (``payload``), so re-driving restores it exactly (callback,
meta, priority) with a fresh attempt count; a bad ``start_urls`` entry carries its raw entry
and goes back to ``start_urls``, where it is validated again. A record that holds only the
request's URL (its request could not be encoded) becomes the request the spider makes of
that URL (``rebuild``: its ``make_request_from_data``, as for a start URL), so that what the
spider's hook adds (the site spider's ``site_scope``) is not lost with the payload.

In a sharded crawl (DISTCRAWL_SHARDS above 1) a request goes back to the shard of its URL,
in two steps per page (see :func:`redrive`).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request

from distcrawl.codec.politeness import slot_for
from distcrawl.codec.serialize import DecodeError, RequestCodec, SerializationError
from distcrawl.model.frontier import Frontier
from distcrawl.model.queue_entry import bad_slot
from distcrawl.model.records import Entry, EntryKind, Redrive, RedriveKind
from distcrawl.model.shards import shard_of_url

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
) -> tuple[str, int, bytes, str] | None:
    """(slot, priority, encoded request, URL) of the request a record re-drives, or None."""
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
        url = str(data.get("u", ""))
        return slot_for(url, data.get("M")), int(data.get("p", 0)), codec.encode_dict(data), url
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
        return slot_for(request.url, request.meta), request.priority, payload, request.url
    if redrivable:
        # no spider to make the request with: a GET of the URL, all else lost
        try:
            url = str(record["url"])
            payload = codec.encode_dict({"u": url})
            return slot_for(url, None), int(record.get("priority") or 0), payload, url
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
    shards: Sequence[Frontier] = (),
) -> tuple[int, int]:
    """Re-drive the matching dead letters; returns (re-driven, matching but not re-drivable).

    The list is read from its oldest end, ``page`` records at a time, and each page's matches
    go back in one script call that finds them by their index from that end (stable while
    workers push new dead letters at the other end): each call costs the page and its
    distance from that end, never a scan of the list per record.

    ``shards``: the Frontier of each shard of a sharded crawl (``frontier`` holds the crawl's
    own keys, its dead letters and start URLs). redrive.lua cannot queue a request there: its
    keys share the dead list's hash slot, and a request belongs in the shard of its URL. So
    each page takes two steps. First its requests are stored in their shards, one commit per
    shard, as retries due at once (commit.lua's kind ``l``: never filtered, as a re-driven
    request was never checked against the seen-set; the workers' next lease queues them).
    Then exactly those records leave the dead list, by redrive.lua's own rule (at their index
    from the oldest end, else by value; one already gone is skipped). A crash or an error
    between the two steps leaves stored requests' records in the dead list: re-driven again,
    such a request is fetched twice, but no record is ever lost; two operators re-driving
    the same records at once may likewise both store them. Bad start_urls entries go back to
    start_urls in one script, as with one shard."""
    page = page or PAGE
    parts = list(shards)
    dead = frontier.keys.dead
    moved = unusable = 0
    skip = 0  # records at the oldest end that stay (they did not match)
    while True:
        raws: list[bytes] = frontier.client.lrange(dead, -(skip + page), -(skip + 1))  # type: ignore[assignment]
        if not raws:
            break
        moves: list[Redrive] = []
        urls: list[str] = []
        # raws[-1] is the oldest: index -(skip + 1)
        for offset, raw in enumerate(reversed(raws)):
            letter = _letter(raw)
            if not letter.matches(error=error, domain=domain, source=source):
                continue
            found = _move(letter, codec, rebuild)
            if found is None:
                unusable += 1
            else:
                move, url = found
                moves.append(move._replace(at=-(skip + offset + 1)))
                urls.append(url)
        if len(parts) > 1:
            done = _redrive_to_shards(frontier, parts, moves, urls)
        else:
            done = frontier.redrive(moves)
        moved += done
        skip += len(raws) - done
        if len(raws) < page:
            break
    return moved, unusable


def _redrive_to_shards(
    frontier: Frontier, parts: Sequence[Frontier], moves: Sequence[Redrive], urls: Sequence[str]
) -> int:
    """One page of a sharded crawl's redrive (see :func:`redrive`): the requests stored in
    their shards, then the start_urls entries moved back, then the stored requests' records
    taken out of the dead list; returns how many records left it."""
    starts = [m for m in moves if m.kind is RedriveKind.START_URLS]
    # a slot that could not be one stays in the dead list, as redrive.lua leaves it
    requests = [
        (m, url)
        for m, url in zip(moves, urls, strict=True)
        if m.kind is RedriveKind.QUEUE and bad_slot(m.slot) is None
    ]
    by_shard: dict[int, list[Entry]] = {}
    for move, url in requests:
        retry = Entry(EntryKind.RETRY, b"", move.priority, move.payload, b"0", move.slot)
        by_shard.setdefault(shard_of_url(url, len(parts)), []).append(retry)
    for shard, entries in sorted(by_shard.items()):
        parts[shard].commit([], entries)
    # the shards' commits wake nobody: idle workers wait on the crawl's own wake list
    frontier.wake(len(requests))
    done = frontier.redrive(starts)
    stored = [_after(move, starts) for move, _ in requests]
    return done + _forget(frontier, stored)


def _after(move: Redrive, removed: Sequence[Redrive]) -> Redrive:
    """``move`` with its index from the oldest end as it stands once the ``removed`` records
    (older ones shift it) left the list; a wrong guess only costs redrive.lua a lookup by
    value, since it checks the record at the index first."""
    return move._replace(at=move.at + sum(1 for r in removed if move.at < r.at < 0))


def _forget(frontier: Frontier, moves: Sequence[Redrive]) -> int:
    """Take the records of ``moves`` (already re-driven) out of the dead list with
    redrive.lua's removal, its pushes to start_urls sent to a list of this call's own in
    the same hash slot, deleted at once; returns how many records were still there."""
    if not moves:
        return 0
    keys = frontier.keys
    scratch = f"{keys.prefix}redrive:{uuid.uuid4().hex}"
    names = [scratch if k == keys.start_urls else k for k in keys.script_keys("redrive")]
    args: list[Any] = []
    for move in moves:
        args += [move.at, move.record, RedriveKind.START_URLS, "", 0, b""]
    try:
        return int(frontier.scripts.redrive(keys=names, args=args))
    finally:
        frontier.client.delete(scratch)


def _move(
    letter: DeadLetter, codec: RequestCodec, rebuild: Rebuild | None
) -> tuple[Redrive, str] | None:
    """Where a record goes back to, and the URL of its request ("" for a start_urls
    entry); None when it holds nothing to re-drive."""
    record = letter.record
    if record.get("source") == "start_urls" and record.get("raw") is not None:
        raw = str(record["raw"])
        encoding = record.get("raw_encoding", "utf-8")
        return Redrive(letter.raw, RedriveKind.START_URLS, "", 0, raw.encode(encoding)), ""
    requeue = _requeue_payload(letter, codec, rebuild)
    if requeue is None:
        return None
    slot, priority, payload, url = requeue
    return Redrive(letter.raw, RedriveKind.QUEUE, slot, priority, payload), url
