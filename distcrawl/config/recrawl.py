"""When a fetched page is due again: an adaptive revisit schedule (issue #15, first part).

A crawl that keeps pages fresh cannot fetch every page at one fixed rate: a price page that
changes hourly would be stale most of the day at a daily interval, and a legal notice that
never changes would waste most of the fetches at an hourly one. Like Nutch's
AdaptiveFetchSchedule, each page's interval grows while the page stays the same and shrinks
when it changes, within bounds, so fetches go where the changes are. Errors and pages that
are gone (404/410) get intervals of their own; gone may mean never.

This module is pure: the state of one URL in, its next state out, on whatever clock the
caller passes. The frontier keeps the state (its revisit queue) and the worker says what a
fetch found; neither is needed to test the rules, which ``tests/test_recrawl.py`` checks on a
virtual clock and ``benchmarks/recrawl.py`` measures against a fixed interval.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from lxml import etree
from scrapy.settings import BaseSettings

from distcrawl.config._convert import ConfigError, _at_least, _fraction, _get, _positive

#: one day, in seconds
DAY = 86_400.0


class Outcome(str, Enum):
    """What a revisit found."""

    #: the content differs from the last fetch (its signature changed)
    CHANGED = "changed"
    #: the same content, or a 304 to a conditional request
    UNCHANGED = "unchanged"
    #: the fetch failed (a network error, a 5xx after its retries)
    ERROR = "error"
    #: 404 or 410: the page is gone
    GONE = "gone"


@dataclass(frozen=True)
class RecrawlPolicy:
    """The rules, with Nutch's defaults (``db.fetch.schedule.adaptive.*``): an unchanged page's
    interval grows by 40%, a changed one's shrinks by 20%, between 1 minute and 365 days."""

    #: the first interval of a page fetched once
    interval: float = DAY
    min_interval: float = 60.0
    max_interval: float = 365 * DAY
    #: unchanged: interval *= 1 + inc_rate
    inc_rate: float = 0.4
    #: changed: interval *= 1 - dec_rate
    dec_rate: float = 0.2
    #: after an error, the page is tried again this much later (its interval kept)
    error_interval: float = DAY
    #: a gone page is tried again this much later; None: never
    gone_interval: float | None = 30 * DAY

    def __post_init__(self) -> None:
        if not 0 < self.min_interval <= self.interval <= self.max_interval:
            raise ValueError(
                f"recrawl intervals must satisfy 0 < min ({self.min_interval}) <= interval "
                f"({self.interval}) <= max ({self.max_interval})"
            )
        if self.inc_rate < 0 or not 0 <= self.dec_rate < 1:
            raise ValueError(f"inc_rate {self.inc_rate} must be >= 0, dec_rate in [0, 1)")
        if self.error_interval <= 0 or (self.gone_interval is not None and self.gone_interval <= 0):
            raise ValueError("error_interval and gone_interval must be positive")


@dataclass(frozen=True)
class PageState:
    """What the schedule keeps of one URL (the fields the page's document gains too)."""

    interval: float
    #: when it is due again; math.inf: never
    due: float
    first_seen: float
    last_fetched: float
    #: when a change was last seen (the first fetch counts as one)
    last_changed: float
    fetch_count: int = 1
    change_count: int = 0


def first_fetch(policy: RecrawlPolicy, now: float) -> PageState:
    """The state after a page's first fetch: due one initial interval later."""
    return PageState(policy.interval, now + policy.interval, now, now, now)


@dataclass(frozen=True)
class NextFetch:
    """A page's interval after a fetch, and how long until it is due again."""

    interval: float
    #: seconds from the fetch; None: never again
    delay: float | None


def next_fetch(policy: RecrawlPolicy, interval: float, outcome: Outcome) -> NextFetch:
    """The rule itself: what a fetch that found ``outcome`` does to a page's interval."""
    if outcome is Outcome.ERROR:
        # says nothing about how often the page changes: keep its interval
        return NextFetch(interval, policy.error_interval)
    if outcome is Outcome.GONE:
        return NextFetch(interval, policy.gone_interval)
    if outcome is Outcome.CHANGED:
        interval = interval * (1 - policy.dec_rate)
    else:
        interval = interval * (1 + policy.inc_rate)
    interval = min(max(interval, policy.min_interval), policy.max_interval)
    return NextFetch(interval, interval)


def revisit(policy: RecrawlPolicy, state: PageState, outcome: Outcome, now: float) -> PageState:
    """The state after a revisit at ``now`` found ``outcome``."""
    step = next_fetch(policy, state.interval, outcome)
    fetched = replace(state, last_fetched=now, fetch_count=state.fetch_count + 1)
    if outcome is Outcome.CHANGED:
        fetched = replace(fetched, last_changed=now, change_count=state.change_count + 1)
    due = math.inf if step.delay is None else now + step.delay
    return replace(fetched, interval=step.interval, due=due)


@dataclass(frozen=True)
class RecrawlSettings:
    """The ``DISTCRAWL_RECRAWL_*`` settings; the crawl revisits pages only when
    ``DISTCRAWL_RECRAWL_INTERVAL`` is set (:func:`recrawl_settings` returns None otherwise)."""

    policy: RecrawlPolicy
    #: the share of a slot's turns that due revisits may take while new URLs wait too
    share: float = 0.5
    #: domain -> its first interval (s), or None: its pages are never revisited; a domain
    #: covers its subdomains, the longest match wins
    domains: tuple[tuple[str, float | None], ...] = ()
    #: XPath expressions whose text the content signature leaves out (ads, timestamps)
    signature_exclude: tuple[str, ...] = ()

    def first_interval(self, host: str) -> float | None:
        """The first interval of a page on ``host``: its domain's override, else the
        policy's; None when the domain is never revisited."""
        host = host.lower().rstrip(".")
        best: tuple[int, float | None] | None = None
        for domain, interval in self.domains:
            if (host == domain or host.endswith("." + domain)) and (
                best is None or len(domain) > best[0]
            ):
                best = (len(domain), interval)
        if best is None:
            return self.policy.interval
        if best[1] is None:
            return None
        return min(max(best[1], self.policy.min_interval), self.policy.max_interval)


def _seconds_or_never(name: str, raw: Any) -> float | None:
    """A positive number of seconds, or None / "never"."""
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "never", "none")):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={raw!r}: expected seconds or 'never'") from None
    if not value > 0 or math.isinf(value):
        raise ConfigError(f"{name}={raw!r}: must be > 0 (or 'never')")
    return value


def _xpaths(raw: Any) -> list[str]:
    """DISTCRAWL_RECRAWL_SIGNATURE_EXCLUDE: a list of XPath expressions, or one string (from
    ``-s``: a JSON list, or one expression, never split at commas, which XPath uses; ``|``
    joins several), each compiled here so that a typo stops the start, not every page."""
    name = "DISTCRAWL_RECRAWL_SIGNATURE_EXCLUDE"
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.lstrip().startswith("[") else [raw]
        except ValueError:
            raw = [raw]
    if not isinstance(raw, list | tuple) or not all(isinstance(x, str) and x.strip() for x in raw):
        raise ConfigError(f"{name}={raw!r}: expected XPath expressions")
    for expression in raw:
        try:
            etree.XPath(expression)
        except etree.XPathSyntaxError as exc:
            raise ConfigError(f"{name}: {expression!r} is not an XPath expression: {exc}") from None
    return [x.strip() for x in raw]


def recrawl_settings(settings: BaseSettings) -> RecrawlSettings | None:
    """The parsed ``DISTCRAWL_RECRAWL_*`` settings, or None when revisits are off."""
    interval = _seconds_or_never(
        "DISTCRAWL_RECRAWL_INTERVAL", settings.get("DISTCRAWL_RECRAWL_INTERVAL")
    )
    if interval is None:
        return None
    defaults = RecrawlPolicy()
    # the bounds follow a short first interval down (a test, a live price page), so that
    # setting only DISTCRAWL_RECRAWL_INTERVAL is always valid
    min_interval = _get(
        settings,
        "DISTCRAWL_RECRAWL_MIN_INTERVAL",
        min(defaults.min_interval, interval),
        _positive(float),
    )
    max_interval = _get(
        settings,
        "DISTCRAWL_RECRAWL_MAX_INTERVAL",
        max(defaults.max_interval, interval),
        _positive(float),
    )
    gone_raw = settings.get("DISTCRAWL_RECRAWL_GONE_INTERVAL", defaults.gone_interval)
    try:
        policy = RecrawlPolicy(
            interval=interval,
            min_interval=min_interval,
            max_interval=max_interval,
            inc_rate=_get(
                settings, "DISTCRAWL_RECRAWL_INC_RATE", defaults.inc_rate, _at_least(0.0, float)
            ),
            dec_rate=_get(settings, "DISTCRAWL_RECRAWL_DEC_RATE", defaults.dec_rate, _fraction),
            error_interval=_get(
                settings,
                "DISTCRAWL_RECRAWL_ERROR_INTERVAL",
                min(defaults.error_interval, max_interval),
                _positive(float),
            ),
            gone_interval=_seconds_or_never("DISTCRAWL_RECRAWL_GONE_INTERVAL", gone_raw),
        )
    except ValueError as exc:
        raise ConfigError(f"DISTCRAWL_RECRAWL_*: {exc}") from None
    domains = []
    for domain, value in settings.getdict("DISTCRAWL_RECRAWL_DOMAINS").items():
        if not isinstance(domain, str) or not domain.strip(".").strip():
            raise ConfigError(f"DISTCRAWL_RECRAWL_DOMAINS: {domain!r} is not a domain")
        domains.append(
            (
                domain.strip().strip(".").lower(),
                _seconds_or_never(f"DISTCRAWL_RECRAWL_DOMAINS[{domain!r}]", value),
            )
        )
    exclude = _xpaths(settings.get("DISTCRAWL_RECRAWL_SIGNATURE_EXCLUDE"))
    return RecrawlSettings(
        policy=policy,
        share=_get(settings, "DISTCRAWL_RECRAWL_SHARE", RecrawlSettings.share, _fraction),
        domains=tuple(domains),
        signature_exclude=tuple(x.strip() for x in exclude),
    )
