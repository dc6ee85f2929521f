"""Celery tasks that feed a crawl: ``distcrawl.push`` and ``distcrawl.push_many``.

Install with ``pip install distcrawl[celery]`` and have the Celery app import this module
(``include=["distcrawl.celery"]``); any app can then call::

    from distcrawl.celery import push
    push.delay("site", "https://example.com/", priority=9, meta={"source": "signup"})

``priority`` is the request's priority in the frontier (higher first, as in Scrapy). Celery's
own message priority (``push.apply_async(args=[...], priority=5)``) only orders the push
tasks in the broker, and how depends on the broker.

A task checks and stores its entry with a :class:`~distcrawl.producer.Producer` (target
"queue", one per spider and worker process), so a retried task stores nothing twice: the
push of a URL already seen reports ``"seen"``. When the frontier's Redis is unreachable the
task is retried with exponential backoff and full jitter (``autoretry_for``); when the crawl
is at its pending cap it is retried later. The result is ``PushResult.as_dict()`` (the URL
redacted), or a list of them for ``push_many``.

Configuration, read once per worker process, from the Celery app's conf:

``distcrawl_redis_url``
    the frontier's Redis; default: the ``REDIS_URL`` environment variable, else the Scrapy
    setting ``REDIS_URL``. Never the broker's URL: the frontier and the broker are
    separate servers (or at least databases).
``distcrawl_settings``
    a dict of Scrapy settings set over the project's (``SCRAPY_SETTINGS_MODULE``, or
    ``scrapy.cfg``), at the priority of ``scrapy crawl -s``.
``distcrawl_target``
    ``"queue"`` (default) or ``"start_urls"`` (see distcrawl/producer/).

Note on the name: this module is ``distcrawl.celery``; it imports the ``celery`` package
absolutely (``from __future__ import annotations`` and no relative imports), which Python 3
always does.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import redis
from celery import Task, shared_task
from scrapy.settings import Settings
from scrapy.utils.project import get_project_settings

from distcrawl.entries import EntryLike
from distcrawl.producer import Outcome, Producer

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
    target = conf.get("distcrawl_target") or "queue"
    return Producer.from_url(url, spider, settings, target=target)


def reset() -> None:
    """Forget the producers (tests, and a process that changed its configuration)."""
    with _lock:
        for producer in _producers.values():
            producer.close()
        _producers.clear()


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
    self: Task,
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
def push_many(self: Task, spider: str, entries: list[EntryLike]) -> list[dict[str, Any]]:
    """Push many entries in pipelined batches (each a URL or JSON entry's text, or its
    fields as a dict); entries over the pending cap are reported ``"full"``, not retried
    (the caller decides which to send again)."""
    results = producer_for(self.app, spider).push_many(entries, push_id=self.request.id)
    return [r.as_dict() for r in results]
