"""Feed and watch a crawl from Python: :class:`Producer` and :class:`AsyncProducer`.

Without this, a web app or a task queue feeds a crawl with ``r.lpush("site:start_urls", url)``
and learns only later, from the dead letters, that an entry was bad or that the crawl was
full. A Producer checks each entry exactly as a worker does (the same functions, with the
crawl's settings and the spider's own ``make_request_from_data``) and tells the caller, per
entry, what happened: :class:`Outcome`.

Two targets:

``"queue"`` (default)
    The producer stores the request itself, through the frontier's commit script, as a worker
    stores the request it makes of a ``start_urls`` entry: the seen-set check is atomic with
    the push, so pushing the same URL again (a task retried after a lost reply) is a no-op
    that reports :attr:`Outcome.SEEN`, and an entry over ``DISTCRAWL_MAX_PENDING`` is
    reported :attr:`Outcome.FULL` instead of waiting unseen. The spider class must be
    importable (``SPIDER_MODULES`` of the settings), its requests are encoded with the
    crawl's serializer and fingerprinter, and the frontier's layout record (layout.py) is
    checked first. It needs the worker's Redis permissions (``distcrawl acl``).
``"start_urls"``
    The producer LPUSHes each valid entry to ``<ns>:start_urls``, like ``distcrawl push``: no
    spider code needed, only the producer's ACL user, and the workers make the request (and
    drop a duplicate); the outcome is :attr:`Outcome.ACCEPTED`, never ``SEEN``.

Settings are Scrapy settings: ``get_project_settings()`` (``scrapy.cfg`` or
``SCRAPY_SETTINGS_MODULE``) unless given, with the spider's ``custom_settings`` applied as
``scrapy crawl`` applies them, parsed once into a :class:`~distcrawl.config.DistcrawlConfig`.
"""

from __future__ import annotations

from distcrawl.config._convert import ConfigError
from distcrawl.producer._async import AsyncProducer
from distcrawl.producer._results import (
    Outcome,
    ProducerError,
    PushResult,
    RedriveResult,
)
from distcrawl.producer._sync import Producer

__all__ = [
    "AsyncProducer",
    "ConfigError",
    "Outcome",
    "Producer",
    "ProducerError",
    "PushResult",
    "RedriveResult",
]
