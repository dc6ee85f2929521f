"""The demo site's fresh pages: pages that change at known rates and answer conditional
requests, for the tests of revisits (pages fetched again on an adaptive schedule, with
``If-None-Match`` and ``If-Modified-Since``).

``/fresh/<kind>/<i>.html`` (``i`` in ``0 .. pages-1``) has a version that depends on the time
alone: ``floor((now - start) / period)`` where ``start`` is when the site started and the period
is ``fast`` or ``slow`` seconds by kind; ``never`` pages stay at version 0. So a test knows how
often a page changed without asking the site, and a crawler that revisits too seldom or too
often is visible in the counters.

Validators: ``ETag: "<kind>-<i>-v<version>"`` and ``Last-Modified`` (when the version began,
at HTTP's whole seconds). A matching ``If-None-Match`` (a list, ``W/`` or ``*``) or, without
one, an ``If-Modified-Since`` at or after the version's start gets ``304 Not Modified``. With
``?validators=0`` the page has neither validator, is never 304, and also shows the server's
clock, which changes on every fetch: a content signature has to leave that part out.

``/fresh/`` links to every fresh page (``/fresh/?validators=0`` to every variant); nothing
else links to it, so a crawl from ``/`` never sees these pages. ``/_fresh/stats`` is JSON:
per request target under ``/fresh/``, how many 200s and 304s the site sent (counted where the
request log is written, so a client that has its answer also finds it counted).
"""

from __future__ import annotations

import argparse
import email.utils
import json
import math
import re
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, NamedTuple
from urllib.parse import parse_qs

from distcrawl.demo.pages import HTML_TYPE, _anchors, _document, _parse_index, _Route

FRESH_INDEX = "/fresh/"
FRESH_STATS = "/_fresh/stats"
#: the kinds, in the index's order
KINDS = ("fast", "slow", "never")
DEFAULT_PAGES = 10
DEFAULT_FAST = 2.0
DEFAULT_SLOW = 10.0
JSON_TYPE = b"application/json"

#: one entity tag of an If-None-Match list; the weak prefix does not matter to If-None-Match
#: (RFC 9110, 13.1.2: weak comparison)
_ETAG = re.compile(r'(?:W/)?("[^"]*")')


def fresh_path(kind: str, i: int, validators: bool = True) -> str:
    """The path (and query) of one fresh page."""
    return f"{FRESH_INDEX}{kind}/{i}.html" + ("" if validators else "?validators=0")


def fresh_paths(pages: int = DEFAULT_PAGES, validators: bool = True) -> list[str]:
    """Every fresh page, in the index's order."""
    return [fresh_path(kind, i, validators) for kind in KINDS for i in range(max(pages, 0))]


def etag(kind: str, i: int, version: int) -> str:
    """The quoted entity tag: kind, page and version, so a test reads the version from it."""
    return f'"{kind}-{i}-v{version}"'


def http_date(when: float) -> str:
    """An HTTP date; the fraction of the second is dropped, as HTTP dates have none."""
    return email.utils.format_datetime(datetime.fromtimestamp(when, timezone.utc), usegmt=True)


def etag_matches(if_none_match: str, current: str) -> bool:
    """Whether an If-None-Match value names ``current``: ``*``, or any tag of the list."""
    if if_none_match.strip() == "*":
        return True
    return current in _ETAG.findall(if_none_match)


def parse_http_date(value: str) -> float | None:
    """Seconds since the epoch, or None for anything that is not a date (then ignored)."""
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed is None:  # Python 3.10 returns None for some malformed dates
        return None
    if parsed.tzinfo is None:  # "-0000": UTC by HTTP's rules
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


class FreshCount(NamedTuple):
    """What the site sent for one request target."""

    ok: int = 0
    not_modified: int = 0


class FreshStats(NamedTuple):
    """``/_fresh/stats`` read back: the site's clock origin and periods, and its counts."""

    #: when the site started (seconds since the epoch): version 0 of every page began then
    start: float
    pages: int
    #: seconds per version, by kind; None for ``never``
    periods: dict[str, float | None]
    #: per request target (path and query, as in the request log)
    counts: dict[str, FreshCount]

    def of(self, target: str) -> FreshCount:
        """Counts of one target; zeros for a target never answered."""
        return self.counts.get(target, FreshCount())

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FreshStats:
        counts = {
            target: FreshCount(int(c.get("200", 0)), int(c.get("304", 0)))
            for target, c in data["counts"].items()
        }
        return cls(float(data["start"]), int(data["pages"]), dict(data["periods"]), counts)


def read_stats(base_url: str, timeout: float = 10.0) -> FreshStats:
    """Ask a running site for its counts (the site may run in another process)."""
    with urllib.request.urlopen(base_url.rstrip("/") + FRESH_STATS, timeout=timeout) as resp:
        return FreshStats.from_json(json.loads(resp.read()))


class FreshPages:
    """The fresh pages of one running site: their clock origin and what was sent.

    ``clock`` is a parameter so the unit tests can move time without waiting.
    """

    def __init__(
        self,
        pages: int = DEFAULT_PAGES,
        fast: float = DEFAULT_FAST,
        slow: float = DEFAULT_SLOW,
        start: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if fast <= 0 or slow <= 0:
            raise ValueError(f"fresh periods must be positive (fast={fast}, slow={slow})")
        self.pages = pages
        self.periods: dict[str, float | None] = {"fast": fast, "slow": slow, "never": None}
        self.clock = clock
        self.start = clock() if start is None else start
        #: request target -> status -> answers sent
        self._counts: dict[str, dict[int, int]] = {}

    def version(self, kind: str, now: float) -> int:
        period = self.periods[kind]
        if period is None:
            return 0
        return max(math.floor((now - self.start) / period), 0)

    def version_start(self, kind: str, version: int) -> float:
        """When ``version`` began; what Last-Modified says (at whole seconds)."""
        period = self.periods[kind]
        return self.start if period is None else self.start + version * period

    def answer_request(self, request: Any) -> _Route | None:
        """:meth:`answer` for a Twisted request."""
        headers = [request.getHeader(name) for name in (b"if-none-match", b"if-modified-since")]
        return self.answer(
            request.path.decode("utf-8", "replace"),
            request.uri.partition(b"?")[2].decode("utf-8", "replace"),
            *(None if value is None else value.decode("latin-1") for value in headers),
        )

    def answer(
        self,
        path: str,
        query: str = "",
        if_none_match: str | None = None,
        if_modified_since: str | None = None,
    ) -> _Route | None:
        """The answer to a request for ``path``, or None if it is not one of these pages."""
        if path == FRESH_STATS:
            return _Route(200, JSON_TYPE, json.dumps(self.stats(), sort_keys=True).encode())
        if not path.startswith(FRESH_INDEX):
            return None
        validators = parse_qs(query).get("validators", ["1"])[-1] != "0"
        if path == FRESH_INDEX:
            return _Route(200, HTML_TYPE, self.render_index(validators))
        kind, _, name = path.removeprefix(FRESH_INDEX).partition("/")
        i = _parse_index(name.removesuffix(".html")) if name.endswith(".html") else None
        if kind not in self.periods or i is None or i >= self.pages:
            return None  # the site's own 404
        now = self.clock()
        version = self.version(kind, now)
        if not validators:
            return _Route(200, HTML_TYPE, self.render_page(kind, i, version, now))
        began = self.version_start(kind, version)
        tag = etag(kind, i, version)
        headers = ((b"etag", tag.encode()), (b"last-modified", http_date(began).encode()))
        if if_none_match is not None:
            fresh = etag_matches(if_none_match, tag)
        else:
            since = parse_http_date(if_modified_since) if if_modified_since else None
            # a date after the server's clock is not a valid date (RFC 9110, 13.1.3)
            fresh = since is not None and since <= now and since >= math.floor(began)
        if fresh:
            return _Route(304, b"", b"", None, headers)
        return _Route(200, HTML_TYPE, self.render_page(kind, i, version, None), None, headers)

    def render_page(self, kind: str, i: int, version: int, clock: float | None) -> bytes:
        """The version is in the text; ``clock`` (the variant without validators) adds the
        server's time in milliseconds, different on every fetch."""
        text = f"{kind} page {i}, version {version}"
        body = f'<h1>{kind.capitalize()} page {i}</h1>\n<p class="version">{text}</p>'
        if clock is not None:
            body += f'\n<p class="clock">{round(clock * 1000)}</p>'
        index = FRESH_INDEX + ("" if clock is None else "?validators=0")
        body += f"\n<ul>\n{_anchors([index])}\n</ul>"
        return _document(f"Fresh {kind} page {i}", text, body)

    def render_index(self, validators: bool) -> bytes:
        body = f"<h1>Fresh pages</h1>\n<ul>\n{_anchors(fresh_paths(self.pages, validators))}\n</ul>"
        return _document("Fresh pages", "Pages that change at known rates", body)

    def count(self, target: str, status: int) -> None:
        """Called for every request the site answered (where its request log is written)."""
        if target.startswith(FRESH_INDEX) and status in (200, 304):
            per_status = self._counts.setdefault(target, {})
            per_status[status] = per_status.get(status, 0) + 1

    def stats(self) -> dict[str, Any]:
        """What ``/_fresh/stats`` serves (:meth:`FreshStats.from_json` reads it back)."""
        return {
            "start": self.start,
            "pages": self.pages,
            "periods": self.periods,
            "counts": {
                target: {str(status): n for status, n in sorted(per.items())}
                for target, per in sorted(self._counts.items())
            },
        }


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The site's command-line options for its fresh pages."""
    parser.add_argument("--fresh-pages", type=int, default=DEFAULT_PAGES, help="pages per kind")
    parser.add_argument(
        "--fresh-fast", type=_positive, default=DEFAULT_FAST, help="seconds per fast version"
    )
    parser.add_argument(
        "--fresh-slow", type=_positive, default=DEFAULT_SLOW, help="seconds per slow version"
    )
