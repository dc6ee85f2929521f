"""Turning producer entries of ``<spider>:start_urls`` into requests, or into reasons.

Producers are people and scripts (``redis-cli lpush site:start_urls URL``), so every entry
is untrusted input: it is either a request or a reason that goes to the dead letters with
the raw entry. Nothing here raises for bad input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request

#: keys a JSON entry may carry, with the type each must have
JSON_FIELDS: dict[str, type | tuple[type, ...]] = {
    "url": str,
    "priority": int,
    "meta": dict,
    "method": str,
    "headers": dict,
    "body": str,
    "dont_filter": bool,
}


class InvalidEntry(ValueError):
    """The entry cannot become a request; the message is the dead-letter reason."""


@dataclass(frozen=True)
class StartEntry:
    raw: bytes
    data: dict[str, Any]


def parse_entry(raw: bytes, *, max_bytes: int, schemes: tuple[str, ...]) -> StartEntry:
    """The entry as a dict of Request arguments (``url`` always present)."""
    if len(raw) > max_bytes:
        raise InvalidEntry(f"entry too large: {len(raw)} bytes (limit {max_bytes})")
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InvalidEntry("entry is not UTF-8 text") from None
    if not text:
        raise InvalidEntry("empty entry")
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidEntry(f"invalid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidEntry("JSON entry must be an object")
        unknown = sorted(set(data) - set(JSON_FIELDS))
        if unknown:
            raise InvalidEntry(f"unknown field(s) in JSON entry: {', '.join(unknown)}")
        if "url" not in data:
            raise InvalidEntry("JSON entry has no 'url'")
        for key, kind in JSON_FIELDS.items():
            value = data.get(key)
            if value is None:
                continue
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise InvalidEntry(f"JSON field {key!r} must be {getattr(kind, '__name__', kind)}")
        data = {k: v for k, v in data.items() if v is not None}
    else:
        data = {"url": text}
    data["url"] = validate_url(data["url"], schemes)
    return StartEntry(raw, data)


def validate_url(url: str, schemes: tuple[str, ...]) -> str:
    url = url.strip()
    if not url or any(c.isspace() for c in url):
        raise InvalidEntry(f"not a URL: {url[:200]!r}")
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a bad port
    except ValueError as exc:
        raise InvalidEntry(f"malformed URL {url[:200]!r}: {exc}") from None
    if not parts.scheme:
        raise InvalidEntry(f"not a URL (no scheme): {url[:200]!r}")
    if parts.scheme.lower() not in schemes:
        raise InvalidEntry(f"unsupported scheme {parts.scheme!r} in {url[:200]!r}")
    if not parts.hostname:
        raise InvalidEntry(f"URL has no host: {url[:200]!r}")
    return url


def request_from_entry(data: dict[str, Any]) -> Request:
    """The default way an entry becomes a request (spiders may override
    ``make_request_from_data``)."""
    kwargs = dict(data)
    if "body" in kwargs:
        kwargs["body"] = kwargs["body"].encode("utf-8")
    try:
        return Request(**kwargs)
    except (TypeError, ValueError) as exc:
        raise InvalidEntry(f"cannot build a request: {exc}") from None
