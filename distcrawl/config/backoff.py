"""How long a retry waits: exponential backoff with jitter, and at least what ``Retry-After``
asks (capped).

The ``DISTCRAWL_RETRY_*`` settings and the delay they describe, in one record that the config
holds (``config.retry``) and the retry middlewares (retry.py) call. A module of its own
because retry.py needs the scheduler, and the scheduler needs the config.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from scrapy.settings import BaseSettings

from distcrawl.config._convert import _at_least, _fraction, _get, _seconds


@dataclass(frozen=True)
class RetrySettings:
    """A retry waits ``backoff_base * backoff_factor**(n-1)`` seconds, at most
    ``backoff_max``, give or take ``jitter`` of it, and never less than a ``Retry-After`` up to
    ``after_max``; a callback that raises is retried ``callback_retries`` times."""

    backoff_base: float = 1.0
    backoff_factor: float = 2.0
    backoff_max: float = 300.0
    jitter: float = 0.2
    #: also caps the Retry-After a 429/503 sets as its slot's delay (politeness.py)
    after_max: float = 600.0
    callback_retries: int = 2

    def delay(
        self,
        attempt: int,
        retry_after: float | None = None,
        rng: Callable[[], float] = random.random,
    ) -> float:
        """Seconds until retry number ``attempt`` (1 for the first)."""
        delay = min(
            self.backoff_max, self.backoff_base * self.backoff_factor ** max(0, attempt - 1)
        )
        delay *= 1 + self.jitter * (2 * rng() - 1)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.after_max))
        return max(0.0, delay)


def retry_settings(settings: BaseSettings) -> RetrySettings:
    """DISTCRAWL_RETRY_* and DISTCRAWL_CALLBACK_RETRIES."""
    return RetrySettings(
        backoff_base=_get(
            settings, "DISTCRAWL_RETRY_BACKOFF_BASE", RetrySettings.backoff_base, _seconds
        ),
        backoff_factor=_get(
            settings,
            "DISTCRAWL_RETRY_BACKOFF_FACTOR",
            RetrySettings.backoff_factor,
            _at_least(1.0, float),
        ),
        backoff_max=_get(
            settings, "DISTCRAWL_RETRY_BACKOFF_MAX", RetrySettings.backoff_max, _seconds
        ),
        jitter=_get(settings, "DISTCRAWL_RETRY_JITTER", RetrySettings.jitter, _fraction),
        after_max=_get(settings, "DISTCRAWL_RETRY_AFTER_MAX", RetrySettings.after_max, _seconds),
        callback_retries=_get(
            settings,
            "DISTCRAWL_CALLBACK_RETRIES",
            RetrySettings.callback_retries,
            _at_least(0, int),
        ),
    )
