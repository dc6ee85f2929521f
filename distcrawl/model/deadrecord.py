"""The dead-letter record: what a worker writes to ``<ns>:dead`` (JSON, so that operators can
read it with ``redis-cli``) for a request or a start_urls entry it gives up on. Reading,
filtering and re-driving the records is ``distcrawl.codec.deadletter``'s."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import socket
import time
from typing import Any

#: raw bytes a dead-letter record keeps of what it quarantines (plus their length and SHA1)
DEAD_RAW_BYTES = 65536


def worker_id() -> str:
    """Who did it, for dead letters and logs: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def dead_letter(
    reason: str,
    *,
    raw: bytes | str | None = None,
    url: str | None = None,
    source: str,
    **extra: Any,
) -> bytes:
    """A dead-letter record: JSON, so that operators can read it with ``redis-cli``."""
    record: dict[str, Any] = {
        "reason": reason,
        "source": source,
        "url": url,
        "worker": worker_id(),
        "time": time.time(),
    }
    if raw is not None:
        data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        record.update(raw_length=len(data), raw_sha1=hashlib.sha1(data).hexdigest())
        record.update(_raw_text(data[:DEAD_RAW_BYTES], cut=len(data) > DEAD_RAW_BYTES))
        if len(data) > DEAD_RAW_BYTES:
            record["truncated"] = True
    payload = extra.get("payload")
    if isinstance(payload, str) and len(payload) > DEAD_RAW_BYTES * 4 // 3 + 4:
        # a request too large to keep: the record holds what fits of it (its URL, callback
        # and small meta, for a re-drive), says what it left out, not megabytes
        extra = {**extra, "payload": None, "payload_length": len(payload)}
        from distcrawl.codec.serialize import shrink_payload  # scrapy: not for every import

        try:
            shrunk = shrink_payload(base64.b64decode(payload), DEAD_RAW_BYTES)
        except binascii.Error:
            shrunk = None
        if shrunk is not None:
            kept, dropped = shrunk
            extra.update(payload=base64.b64encode(kept).decode("ascii"), payload_dropped=dropped)
    record.update(extra)
    return json.dumps(record, separators=(",", ":"), default=repr).encode()


def _raw_text(kept: bytes, *, cut: bool) -> dict[str, str]:
    """Raw bytes as JSON text: UTF-8 when they are (a cut may split the last character),
    else latin-1, which maps every byte to one character and back."""
    for trim in range(4 if cut else 1):
        try:
            return {"raw": kept[: len(kept) - trim].decode("utf-8")}
        except UnicodeDecodeError:
            continue
    return {"raw": kept.decode("latin-1"), "raw_encoding": "latin-1"}
