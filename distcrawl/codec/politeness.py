"""Cluster-wide politeness: the slot a request counts against, and what responses say.

Scrapy's DOWNLOAD_DELAY, CONCURRENT_REQUESTS_PER_DOMAIN and AutoThrottle hold per process,
so ten workers hit a site ten times as hard as one. distcrawl keeps each slot's turn,
in-flight count and adaptive delay in Redis and applies them when it leases (lease.lua),
so the limits hold for the whole cluster. Slots are Scrapy's download slots: the host
name, its IP address when CONCURRENT_REQUESTS_PER_IP is set, or ``meta["download_slot"]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy.resolver import dnscache
from scrapy.utils.httpobj import urlparse_cached

from distcrawl.model.records import Feedback, Politeness

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response

    from distcrawl.config import DistcrawlConfig

DOWNLOAD_SLOT = "download_slot"

#: the longest slot name a hold may carry (a host name is at most 253 characters; a
#: download_slot is the user's, but never this long)
MAX_SLOT = 1024


@dataclass(frozen=True, slots=True)
class Hold:
    """A slot a site asked to wait for, and for how long (ms) from when it is read: what a
    worker publishes on the crawl's holds channel (engine/holds.py), an untrusted message
    for every worker that reads it (``parse_hold``)."""

    slot: str
    ms: int

    def message(self) -> str:
        return json.dumps({"slot": self.slot, "ms": self.ms}, separators=(",", ":"))


def parse_hold(data: Any, max_ms: int) -> Hold | None:
    """The hold a message names, its wait capped at ``max_ms`` (DISTCRAWL_RETRY_AFTER_MAX);
    None for anything else."""
    if not isinstance(data, bytes | str) or len(data) > MAX_SLOT * 2:
        return None
    try:
        value = json.loads(data)
    except (TypeError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict):
        return None
    slot, ms = value.get("slot"), value.get("ms")
    if not isinstance(slot, str) or not 0 < len(slot) <= MAX_SLOT:
        return None
    if not isinstance(ms, int) or isinstance(ms, bool) or ms <= 0:
        return None
    return Hold(slot, min(ms, max_ms))


def parse_retry_after(
    value: bytes | str | None, now: float | None = None, *, date: bytes | str | None = None
) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date.

    A date is the origin server's clock, so it is taken against the same server's ``Date``
    header (RFC 9110 10.2.3): the worker's clock, which may be off by any amount, is not
    involved. Only an answer without a usable ``Date`` falls back to ``now``: the caller's
    best clock, the Redis server's as the last lease told it (ServerClock), whose time is
    the one every slot's turn is kept in; this host's clock when neither is known."""
    text = _header_text(value)
    if not text:
        return None
    if text.isdigit():
        return float(text)
    when = _http_date(text)
    if when is None:
        return None
    sent = _http_date(_header_text(date))
    if sent is None:
        sent = time.time() if now is None else now
    return max(0.0, when - sent)


def retry_after_of(response: Response, now: float | None = None) -> float | None:
    """``parse_retry_after`` of a response's own ``Retry-After`` and ``Date`` headers."""
    headers = response.headers
    return parse_retry_after(headers.get(b"Retry-After"), now, date=headers.get(b"Date"))


def _header_text(value: bytes | str | None) -> str:
    if not value:
        return ""
    return (value.decode("latin-1") if isinstance(value, bytes) else value).strip()


def _http_date(text: str) -> float | None:
    """An HTTP date as a POSIX time; None for anything else (an empty header included)."""
    if not text:
        return None
    try:
        return parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


class ServerClock:
    """The Redis server's clock, as the last lease reply gave it (lease.lua returns its
    TIME) and this host's monotonic clock carries it on: the frontier's clock at no round
    trip, for a Retry-After date whose answer has no Date header to be read against."""

    def __init__(self) -> None:
        self._at: tuple[float, float] | None = None

    def learn(self, server_ms: int) -> None:
        if server_ms > 0:
            self._at = (server_ms / 1000, time.monotonic())

    def now(self) -> float | None:
        """The server's time now, in seconds; None until a lease told it."""
        if self._at is None:
            return None
        at, since = self._at
        return at + (time.monotonic() - since)


def slot_for(url: str, meta: Mapping[str, Any] | None, *, by_ip: bool = False) -> str:
    """Scrapy's download slot key (``Downloader.get_slot_key``), from a URL and meta."""
    return _slot_key(meta, urlsplit(url).hostname or "", by_ip)


def slot_of(request: Request, *, by_ip: bool = False) -> str:
    return _slot_key(request.meta, urlparse_cached(request).hostname or "", by_ip)


def _slot_key(meta: Mapping[str, Any] | None, host: str, by_ip: bool) -> str:
    if meta and meta.get(DOWNLOAD_SLOT) is not None:
        return str(meta[DOWNLOAD_SLOT])
    # like Scrapy: the IP once this process has resolved the host, its name before that
    return dnscache.get(host, host) if by_ip else host


def politeness(config: DistcrawlConfig) -> Politeness:
    """The limits lease.lua and commit.lua apply, in milliseconds."""
    overrides = {
        slot: [-1 if d is None else int(d * 1000), -1 if c is None else c]
        for slot, d, c in config.slot_overrides
    }
    robots, throttle = config.robots, config.throttle
    share = f"{throttle.share:.4f}".rstrip("0").rstrip(".")  # never 1e-05: Lua reads it
    return Politeness(
        delay_ms=int(config.domain_delay * 1000),
        concurrency=config.domain_concurrency,
        overrides=json.dumps(overrides, separators=(",", ":")) if overrides else "",
        robots=(
            f"{int(robots.probe_timeout * 1000)}:{int(robots.crawl_delay_max * 1000)}"
            if robots.obey
            else ""
        ),
        throttle=(
            f"{int(throttle.start_delay * 1000)}:{int(throttle.max_delay * 1000)}"
            f":{throttle.target_concurrency:g}:{throttle.window}:{share}"
        ),
        max_pending=config.max_pending or 0,
        max_pending_per_slot=config.max_pending_per_slot or 0,
        keep_priority=(
            2**31 if config.max_pending_keep_priority is None else config.max_pending_keep_priority
        ),
        revisit_share=config.recrawl.share if config.recrawl is not None else 0.0,
        reserves_per_place=config.reserves_per_place,
    )


class FeedbackBuffer:
    """Sums what responses said per slot until the next commit sends it to Redis: one
    record per slot and batch, not one per response."""

    def __init__(self, config: DistcrawlConfig, clock: ServerClock | None = None) -> None:
        self.codes = config.throttle.codes
        self.clock = clock if clock is not None else ServerClock()
        self.retry_after_max = config.retry.after_max
        self.by_ip = config.slots_by_ip
        self._slots: dict[str, list[int]] = {}

    def add(self, request: Request, response: Response) -> bool:
        """Count one response; True when it asked to slow down (429/503).

        Only first attempts feed the rate of 429/503 answers (commit.lua): a retry's answer
        says more about its page than about the site (a broken page answers 503 to every
        attempt, and once the other pages are done its retries are all a slot gets), so it
        is left out, unless it carries a Retry-After, which always counts."""
        throttled = response.status in self.codes
        after = retry_after_of(response, self.clock.now()) if throttled else None
        if request.meta.get("retry_times", 0) and after is None:
            return throttled
        record = self._slots.setdefault(slot_of(request, by_ip=self.by_ip), [0, 0, 0, 0])
        if throttled:
            record[2] += 1
            if after is not None:
                after_ms = int(min(after, self.retry_after_max) * 1000)
                record[3] = max(record[3], after_ms)
        else:
            record[0] += 1
            record[1] += int(float(request.meta.get("download_latency", 0.0)) * 1000)
        return throttled

    def hold_of(self, request: Request, response: Response) -> Hold | None:
        """The wait a throttled answer asks of its whole slot: its ``Retry-After``, capped
        at DISTCRAWL_RETRY_AFTER_MAX, as commit.lua holds the slot back; None without one."""
        if response.status not in self.codes:
            return None
        after = retry_after_of(response, self.clock.now())
        if after is None:
            return None
        ms = int(min(after, self.retry_after_max) * 1000)
        if ms <= 0:
            return None
        return Hold(slot_of(request, by_ip=self.by_ip), ms)

    def __bool__(self) -> bool:
        return bool(self._slots)

    def drain(self) -> list[Feedback]:
        out = [Feedback(slot, *values) for slot, values in self._slots.items()]
        self._slots.clear()
        return out
