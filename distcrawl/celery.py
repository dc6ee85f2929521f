"""Celery tasks that feed a crawl: ``distcrawl.push`` and ``distcrawl.push_many``.

Install with ``pip install distcrawl[celery]`` and have the Celery app import this module
(``include=["distcrawl.celery"]``); any app can then call::

    from distcrawl.celery import push
    push.delay("site", "https://example.com/", priority=9, meta={"source": "signup"})

``priority`` is the request's priority in the frontier (higher first, as in Scrapy). Celery's
own message priority (``push.apply_async(args=[...], priority=5)``) only orders the push
tasks in the broker, and how depends on the broker.

A task checks and stores its entry with a :class:`~distcrawl.producer.Producer` (one per
spider and worker process). With the spider's code (target "queue") a retried task stores
nothing twice: the push of a URL already seen reports ``"seen"``; without it (target
"start_urls") the push reports ``"accepted"`` and the workers drop a duplicate. When the
frontier's Redis is unreachable the task is retried with exponential backoff and full jitter
(``autoretry_for``); when the crawl is at its pending cap it is retried later. The result
is ``PushResult.as_dict()`` (the URL redacted), or a list of them for ``push_many``.

Configuration, read once per worker process, from the Celery app's conf:

``distcrawl_redis_url``
    the frontier's Redis; default: the ``REDIS_URL`` environment variable, else the Scrapy
    setting ``REDIS_URL``. Never the broker's URL: the frontier and the broker are
    separate servers (or at least databases).
``distcrawl_settings``
    a dict of Scrapy settings set over the project's (``SCRAPY_SETTINGS_MODULE``, or
    ``scrapy.cfg``), at the priority of ``scrapy crawl -s``.
``distcrawl_target``
    ``"queue"`` or ``"start_urls"`` (see distcrawl/producer/). Unset (or ``"auto"``): the
    queue where the spider is importable (the project's ``SPIDER_MODULES``), else start
    URL entries: a Celery app outside the Scrapy project pushes to ``<ns>:start_urls``, the
    workers make the requests, and the worker process says so once per spider in its log.

Note on the name: this module is ``distcrawl.celery``; it imports the ``celery`` package
absolutely (``from __future__ import annotations`` and no relative imports), which Python 3
always does.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

import redis
from celery import Task, shared_task
from scrapy.settings import Settings
from scrapy.utils.project import get_project_settings

from distcrawl.codec.entries import EntryLike
from distcrawl.producer import Outcome, Producer
from distcrawl.producer._sync import TARGETS, _spider_class

logger = logging.getLogger(__name__)

#: the target when the app's conf names none: "queue" if the spider imports, else "start_urls"
AUTO = "auto"

#: what makes a push worth retrying: Redis unreachable, too slow, or still loading its data
RETRY_FOR = (redis.ConnectionError, redis.TimeoutError)
#: ConnectionErrors to redis-py that no retry mends: a refused password
NOT_RETRIED = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
)
#: seconds before a push refused at the pending cap is tried again
FULL_RETRY_DELAY = 30.0

_producers: dict[tuple[int, str, int], Producer] = {}
_lock = threading.Lock()
#: the spiders this process pushes start URL entries for, the choice logged
_fallbacks: set[str] = set()


def producer_for(app: Any, spider: str) -> Producer:
    """The producer of ``spider`` for this Celery app, made on first use in each process
    and thread (a Producer keeps state between calls; the threads pool runs tasks at once)."""
    key = (id(app), spider, threading.get_ident())
    with _lock:
        producer = _producers.get(key)
        if producer is None:
            producer = _make(app.conf, spider)
            _producers[key] = producer
        return producer


def _make(conf: Mapping[str, Any], spider: str) -> Producer:
    settings: Settings = get_project_settings()
    overrides = conf.get("distcrawl_settings") or {}
    for name, value in dict(overrides).items():
        settings.set(name, value, priority="cmdline")
    url = conf.get("distcrawl_redis_url") or os.environ.get("REDIS_URL") or None
    target, why = _target(conf.get("distcrawl_target"), settings, spider)
    producer = Producer.from_url(url, spider, settings, target=target)
    if why and _first_fallback(spider):
        logger.info(
            "distcrawl.push: %s; this Celery worker pushes start URL entries to %s (the "
            "crawl's workers make the requests; give it the project's SCRAPY_SETTINGS_MODULE "
            "to store requests in the queue)",
            why,
            producer.keys.start_urls,
        )
    return producer


def _target(configured: object, settings: Settings, spider: str) -> tuple[str, str]:
    """The target named in the app's conf, else the queue where the spider's code is here;
    a Celery app outside the Scrapy project (no SCRAPY_SETTINGS_MODULE, no scrapy.cfg)
    pushes start URL entries, which any worker of the spider turns into requests. The
    second value says why the queue was not chosen ("" when it was, or was configured)."""
    if configured is None or configured == AUTO:
        spidercls, why = _spider_class(settings, spider)
        return ("queue", "") if spidercls is not None else ("start_urls", why)
    if configured not in TARGETS:
        choices = ", ".join((*TARGETS, AUTO))
        raise ValueError(f"distcrawl_target={configured!r}: expected one of {choices}")
    return str(configured), ""


def _first_fallback(spider: str) -> bool:
    """True once per spider and process: the choice of start URL entries is logged once,
    not once per thread of the pool (the caller holds ``_lock``)."""
    if spider in _fallbacks:
        return False
    _fallbacks.add(spider)
    return True


def reset() -> None:
    """Forget the producers (tests, and a process that changed its configuration)."""
    with _lock:
        for producer in _producers.values():
            producer.close()
        _producers.clear()
        _fallbacks.clear()


#: both tasks: retried with exponential backoff and jitter while Redis cannot be reached (at
#: most a minute apart, 12 times), acknowledged once done, so a worker lost mid-push re-runs it
RETRYING: dict[str, Any] = {
    "bind": True,
    "autoretry_for": RETRY_FOR,
    "dont_autoretry_for": NOT_RETRIED,
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": 12,
    "acks_late": True,
}


@shared_task(name="distcrawl.push", **RETRYING)
def push(
    self: Task[Any, Any],
    spider: str,
    url: str,
    priority: int = 0,
    meta: dict[str, Any] | None = None,
    callback: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Push one URL to the crawl of ``spider``; the other keyword arguments are those of
    :meth:`Producer.push <distcrawl.producer.Producer.push>` (method, headers, body,
    dont_filter)."""
    producer = producer_for(self.app, spider)
    # the task id stays the same when the task is retried or delivered again: that push of
    # a dont_filter request is stored once, another task's is another request
    push_id = fields.pop("push_id", None) or self.request.id
    result = producer.push(url, priority, meta, callback, push_id=push_id, **fields)
    if result.outcome is Outcome.FULL:
        raise self.retry(countdown=FULL_RETRY_DELAY)
    return result.as_dict()


@shared_task(name="distcrawl.push_many", **RETRYING)
def push_many(self: Task[Any, Any], spider: str, entries: list[EntryLike]) -> list[dict[str, Any]]:
    """Push many entries in pipelined batches (each a URL or JSON entry's text, or its
    fields as a dict); entries over the pending cap are reported ``"full"``, not retried
    (the caller decides which to send again)."""
    results = producer_for(self.app, spider).push_many(entries, push_id=self.request.id)
    return [r.as_dict() for r in results]
