"""The names of every ``DISTCRAWL_*`` setting, to tell a misspelt one from a setting.

Scrapy reads no setting it does not know and says nothing of one it was given: an idle
timeout spelt ``_IDLE_TIMOUT`` is ignored in silence, and the worker it was meant to stop
never does. The add-on warns at start, once per unknown name, with the nearest known one.
tests/test_docs.py checks this list against the settings the code reads, so a new setting
cannot be left out of it (nor a removed one left in).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable

from scrapy.settings import BaseSettings

logger = logging.getLogger("distcrawl.config")

PREFIX = "DISTCRAWL_"

#: every setting distcrawl reads whose name starts with ``DISTCRAWL_`` (docs/settings.md)
KNOWN: frozenset[str] = frozenset(
    (
        "DISTCRAWL_ALLOWED_CALLBACKS",
        "DISTCRAWL_ALLOWED_SCHEMES",
        "DISTCRAWL_BLOOM_CAPACITY",
        "DISTCRAWL_BLOOM_ERROR_RATE",
        "DISTCRAWL_CALLBACK_RETRIES",
        "DISTCRAWL_CELERY_BROKER_URL",
        "DISTCRAWL_CELERY_ITEM_TASK",
        "DISTCRAWL_CRAWL_DELAY_MAX",
        "DISTCRAWL_DOMAIN_CONCURRENCY",
        "DISTCRAWL_DOMAIN_DELAY",
        "DISTCRAWL_DRAIN_TIMEOUT",
        "DISTCRAWL_FINISH_WEBHOOK",
        "DISTCRAWL_FLUSH_INTERVAL",
        "DISTCRAWL_FLUSH_ON_START",
        "DISTCRAWL_HEARTBEAT_INTERVAL",
        "DISTCRAWL_IDLE_POLL_MAX",
        "DISTCRAWL_IDLE_TIMEOUT",
        "DISTCRAWL_LEASE_TIMEOUT",
        "DISTCRAWL_LOCAL_SEEN_CACHE",
        "DISTCRAWL_MAXMEMORY_WARN",
        "DISTCRAWL_MAX_PENDING",
        "DISTCRAWL_MAX_PENDING_KEEP_PRIORITY",
        "DISTCRAWL_MAX_PENDING_PER_SLOT",
        "DISTCRAWL_METRICS_HOST",
        "DISTCRAWL_METRICS_PORT",
        "DISTCRAWL_MONGO_BATCH_SIZE",
        "DISTCRAWL_MONGO_CLOSE_TIMEOUT",
        "DISTCRAWL_MONGO_COLLECTION",
        "DISTCRAWL_MONGO_COLLECTIONS",
        "DISTCRAWL_MONGO_FLUSH_INTERVAL",
        "DISTCRAWL_MONGO_KEY_FIELDS",
        "DISTCRAWL_MONGO_MAX_BUFFER",
        "DISTCRAWL_MONGO_SPILL_DIR",
        "DISTCRAWL_MONGO_TIMEOUT",
        "DISTCRAWL_MONGO_URL_FIELD",
        "DISTCRAWL_MONITOR_ENABLED",
        "DISTCRAWL_NAMESPACE",
        "DISTCRAWL_PREFETCH",
        "DISTCRAWL_PUSH_BATCH_SIZE",
        "DISTCRAWL_RECLAIM_INTERVAL",
        "DISTCRAWL_RECRAWL_DEC_RATE",
        "DISTCRAWL_RECRAWL_DOMAINS",
        "DISTCRAWL_RECRAWL_ERROR_INTERVAL",
        "DISTCRAWL_RECRAWL_GONE_INTERVAL",
        "DISTCRAWL_RECRAWL_INC_RATE",
        "DISTCRAWL_RECRAWL_INTERVAL",
        "DISTCRAWL_RECRAWL_MAX_INTERVAL",
        "DISTCRAWL_RECRAWL_MIN_INTERVAL",
        "DISTCRAWL_RECRAWL_SHARE",
        "DISTCRAWL_RECRAWL_SIGNATURE_EXCLUDE",
        "DISTCRAWL_REDIS_CLUSTER",
        "DISTCRAWL_RETRY_AFTER_MAX",
        "DISTCRAWL_RETRY_BACKOFF_BASE",
        "DISTCRAWL_RETRY_BACKOFF_FACTOR",
        "DISTCRAWL_RETRY_BACKOFF_MAX",
        "DISTCRAWL_RETRY_JITTER",
        "DISTCRAWL_ROBOTS_PROBE_TIMEOUT",
        "DISTCRAWL_ROBOTS_TTL",
        "DISTCRAWL_SEEN",
        "DISTCRAWL_SERIALIZER",
        "DISTCRAWL_SHARDS",
        "DISTCRAWL_SOCKET_TIMEOUT",
        "DISTCRAWL_START_META_KEYS",
        "DISTCRAWL_START_URLS_BATCH",
        "DISTCRAWL_START_URL_MAX_BYTES",
        "DISTCRAWL_THROTTLE_HTTP_CODES",
        "DISTCRAWL_THROTTLE_MAX_DELAY",
        "DISTCRAWL_THROTTLE_SHARE",
        "DISTCRAWL_THROTTLE_START_DELAY",
        "DISTCRAWL_THROTTLE_WINDOW",
        "DISTCRAWL_WAIT_REPLICAS",
        "DISTCRAWL_WAIT_REPLICAS_TIMEOUT",
        "DISTCRAWL_WORKER_TIMEOUT",
    )
)

_SUFFIXES = sorted(name[len(PREFIX) :] for name in KNOWN)


def misspelt(names: Iterable[str]) -> list[tuple[str, str | None]]:
    """``(name, nearest known name or None)`` for every ``DISTCRAWL_`` name not a setting."""
    out = []
    for name in sorted(set(names)):
        if not isinstance(name, str) or not name.upper().startswith(PREFIX) or name in KNOWN:
            continue
        # by what follows the prefix, which every name shares and would make all alike
        rest = name.upper()[len(PREFIX) :]
        close = difflib.get_close_matches(rest, _SUFFIXES, n=1, cutoff=0.6)
        out.append((name, PREFIX + close[0] if close else None))
    return out


def warn_unknown(settings: BaseSettings) -> None:
    """One WARNING per ``DISTCRAWL_`` name in ``settings`` that no part of distcrawl reads."""
    for name, near in misspelt(name for name, _value in settings.items()):
        hint = f" (did you mean {near}?)" if near else ""
        logger.warning(
            "%s is not a distcrawl setting%s: it is ignored; every setting: docs/settings.md",
            name,
            hint,
        )
