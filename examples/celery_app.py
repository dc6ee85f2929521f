"""A runnable Celery app that feeds a distcrawl crawl (used by tests/test_celery.py).

Start the crawl's workers and this app's worker, each pointed at its own Redis::

    export REDIS_URL=redis://127.0.0.1:6379/0            # the frontier
    export CELERY_BROKER_URL=redis://127.0.0.1:6380/0    # Celery's broker (another server)
    export SCRAPY_SETTINGS_MODULE=distcrawl.settings     # the crawl's settings
    scrapy crawl site &
    celery -A examples.celery_app worker --loglevel=INFO

then, from any Python process with the same environment::

    from examples.celery_app import discover
    from distcrawl.celery import push
    push.delay("site", "https://example.com/", priority=9)   # one URL, frontier priority 9
    discover.delay(["https://a.example/", "https://b.example/"])

With ``DISTCRAWL_CELERY_ITEM_TASK = "example.on_item"`` (and DISTCRAWL_CELERY_BROKER_URL) in
the crawl's settings, ``on_item`` gets the key of every document the workers store.

A Celery app of your own that imports no Scrapy project (no SCRAPY_SETTINGS_MODULE, no
scrapy.cfg) can push too: with its spider not importable there, ``distcrawl.push`` stores
start URL entries (``<ns>:start_urls``) that the crawl's workers make requests of, and the
Celery worker says so once in its log (docs/producers.md).

``push`` retries with exponential backoff and jitter while the frontier's Redis is
unreachable, and pushing a URL the crawl has seen is a no-op: see docs/producers.md.
"""

from __future__ import annotations

import json
import os

import redis
from celery import Celery

from distcrawl.celery import push

BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6380/0")

app = Celery("distcrawl_example", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(
    # the frontier's Redis: REDIS_URL from the environment when not set here
    distcrawl_redis_url=os.environ.get("REDIS_URL"),
    # a task is acknowledged once it ran: a Celery worker killed mid-task loses no push
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=3600,
)


@app.task(name="example.discover")
def discover(urls: list[str], priority: int = 0) -> int:
    """The seed pattern: a task that found URLs hands each to distcrawl.push."""
    for url in urls:
        push.delay("site", url, priority=priority)
    return len(urls)


@app.task(name="example.on_item")
def on_item(collection: str, _id: object, database: str | None = None) -> None:
    """A downstream task of item notifications (DISTCRAWL_CELERY_ITEM_TASK =
    "example.on_item"): it gets the key of a stored document, never the item; a real one
    would read the document from MongoDB and index it. This one records the key in the
    list ``example:notified`` of NOTIFIED_REDIS_URL (default: the broker's Redis)."""
    client = redis.Redis.from_url(os.environ.get("NOTIFIED_REDIS_URL") or BROKER_URL)
    try:
        client.rpush("example:notified", json.dumps([database, collection, _id]))
    finally:
        client.close()
