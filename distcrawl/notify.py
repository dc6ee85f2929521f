"""Item notifications: the key of each stored document, to a Celery task.

With ``DISTCRAWL_CELERY_ITEM_TASK = "myapp.tasks.on_item"`` the MongoDB pipeline sends, once a
batch is written, one task message per document it stored: ``on_item(collection, _id,
database=...)``. Only the key travels (the queue carries tasks, the database holds results),
and only for documents MongoDB stored: a dead-lettered item (``<collection>_dead``) or one
spilled at close sends nothing. Downstream work (indexing, alerts) starts without polling.

At least once: an item's ``process_item`` returns only after its notification is sent, so
its request is acknowledged in Redis only then; a worker killed in between crawls the page
again elsewhere, which writes the same ``_id`` again and notifies again. While the broker is
down the messages of a batch are retried with backoff (items wait, the crawl slows down, as
when MongoDB is down); at close, after DISTCRAWL_MONGO_CLOSE_TIMEOUT, they are appended to a
JSON-lines file beside the item spill files, which ``distcrawl notify replay`` (:func:`replay`)
sends once the broker is back: a notification is lost only if nobody runs it.

The broker is ``DISTCRAWL_CELERY_BROKER_URL``, else the ``CELERY_BROKER_URL`` environment
variable; it is shown only redacted.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bson import json_util
from scrapy.settings import BaseSettings

from distcrawl.config._convert import ConfigError
from distcrawl.model.redact import redact_text, redact_url, url_secrets
from distcrawl.mongo import JSON_OPTIONS, SpillFile, json_lines

logger = logging.getLogger(__name__)

RETRY_MIN_DELAY = 0.25
RETRY_MAX_DELAY = 10.0


@dataclass(frozen=True)
class NotifyConfig:
    task: str | None = None
    broker_url: str | None = None

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> NotifyConfig:
        task = settings.get("DISTCRAWL_CELERY_ITEM_TASK") or None
        if task is None:
            return cls()
        if not isinstance(task, str) or not all(p.isidentifier() for p in task.split(".")):
            raise ConfigError(
                f"DISTCRAWL_CELERY_ITEM_TASK={task!r}: expected a task name such as "
                "'myapp.tasks.on_item'"
            )
        broker = settings.get("DISTCRAWL_CELERY_BROKER_URL") or os.environ.get("CELERY_BROKER_URL")
        if not broker:
            raise ConfigError(
                f"DISTCRAWL_CELERY_ITEM_TASK={task!r}: no broker; set "
                "DISTCRAWL_CELERY_BROKER_URL (or the CELERY_BROKER_URL environment variable)"
            )
        return cls(task=task, broker_url=str(broker))


def plain_key(key: Any) -> Any:
    """An ``_id`` as JSON data (MongoDB's relaxed extended JSON for ObjectId, dates...)."""
    return json.loads(json_util.dumps(key, json_options=JSON_OPTIONS))


def celery_app(broker_url: str) -> Any:
    """A Celery app of distcrawl's own for ``broker_url`` (nothing of the project's app is
    imported); it fails at once when the broker is down, the callers decide what then."""
    try:
        from celery import Celery
    except ImportError:
        raise ConfigError(
            "DISTCRAWL_CELERY_ITEM_TASK needs Celery: pip install distcrawl[celery]"
        ) from None
    app = Celery("distcrawl-notify", broker=broker_url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False
    return app


def send(app: Any, messages: Sequence[tuple[str, str, str, Any]]) -> None:
    """One task message per (task, database, collection, _id): ``task(collection, _id,
    database=...)``, the ``_id`` as JSON data (plain_key)."""
    # one connection and producer for the batch; no retry of kombu's own: the callers wait
    with app.producer_or_acquire() as producer:
        for task, database, collection, key in messages:
            app.send_task(
                task,
                args=[collection, plain_key(key)],
                kwargs={"database": database},
                producer=producer,
                retry=False,
            )


class Notifier:
    """Sends notifications with a Celery app of its own (nothing of the project's app is
    imported), on the MongoDB pipeline's thread, a batch at a time."""

    def __init__(self, config: NotifyConfig, database: str, spill_path: Path) -> None:
        assert config.task is not None and config.broker_url is not None
        self.app = celery_app(config.broker_url)
        self.task = config.task
        self.database = database
        self.shown_broker = redact_url(config.broker_url)
        self._secrets = url_secrets(config.broker_url)
        self.spill = SpillFile(spill_path)
        self.sent = 0
        self.spilled = 0

    def _send(self, keys: Sequence[tuple[str, Any]]) -> None:
        send(self.app, [(self.task, self.database, collection, key) for collection, key in keys])

    def deliver(
        self, keys: Sequence[tuple[str, Any]], closing: Callable[[], bool], close_timeout: float
    ) -> str:
        """Send one message per key, retrying with backoff while the broker is down;
        "sent", or "spilled" once the crawl has been closing for ``close_timeout``."""
        delay = RETRY_MIN_DELAY
        down_since: float | None = None
        closing_since: float | None = None
        while True:
            try:
                self._send(keys)
            except Exception as exc:  # kombu raises the transport's own errors
                now = time.monotonic()
                if down_since is None:
                    down_since = now
                    logger.warning(
                        "Celery broker at %s: cannot send %d item notifications (%s: %s); "
                        "retrying with backoff",
                        self.shown_broker,
                        len(keys),
                        type(exc).__name__,
                        redact_text(str(exc), self._secrets)[:300],
                    )
                if closing():
                    closing_since = closing_since or now
                    if now - closing_since >= close_timeout:
                        self._spill(keys)
                        return "spilled"
                time.sleep(delay)
                delay = min(RETRY_MAX_DELAY, delay * 2)
                continue
            if down_since is not None:
                logger.info("Celery broker at %s is back; notifications sent", self.shown_broker)
            self.sent += len(keys)
            return "sent"

    def _spill(self, keys: Sequence[tuple[str, Any]]) -> None:
        records = [
            {"task": self.task, "database": self.database, "collection": c, "_id": k}
            for c, k in keys
        ]
        self.spill.append(records)
        self.spilled += len(records)
        logger.error(
            "Celery broker at %s unreachable at close: %d item notifications are in %s; "
            "send them once it is back with: distcrawl notify replay %s",
            self.shown_broker,
            len(records),
            self.spill.path.resolve(),
            self.spill.path.resolve(),
        )

    def close(self) -> None:
        self.app.close()


#: suffix a spill file of notifications gets once replay sent every one of them
SENT_SUFFIX = ".sent"


@dataclass
class ReplayResult:
    sent: int = 0
    #: the files sent, each renamed to <file>.sent
    files: list[str] = field(default_factory=list)


def read_notifications(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of a notification spill file (Notifier._spill); ValueError names the
    first line that is not one (an item spill file given by mistake, say)."""
    names = ("task", "database", "collection")
    for number, record, _error in json_lines(path):  # a line not JSON is no record either
        if (
            not isinstance(record, dict)
            or not all(isinstance(record.get(n), str) for n in names)
            or "_id" not in record
        ):
            raise ValueError(
                f"{path}:{number}: not an item notification record (task, database, "
                "collection, _id)"
            )
        yield record


def replay(
    paths: Iterable[str | os.PathLike[str]], broker_url: str, *, batch_size: int = 500
) -> ReplayResult:
    """Send the notifications of spill files, as the worker would have (same task, same
    arguments), then rename each file to ``<file>.sent``, so that running it again does
    not send them twice. Every file is read before anything is sent (a bad line sends
    nothing). Raises what kombu raises when the broker cannot be reached: the files not
    yet renamed are sent again by the next run, some of their messages perhaps twice (at
    least once, as notifications are: the task must be idempotent)."""
    files = [(str(path), list(read_notifications(path))) for path in paths]
    result = ReplayResult()
    app = celery_app(broker_url)
    try:
        for path, records in files:
            messages = [(r["task"], r["database"], r["collection"], r["_id"]) for r in records]
            for at in range(0, len(messages), batch_size):
                send(app, messages[at : at + batch_size])
            os.replace(path, path + SENT_SUFFIX)
            result.sent += len(messages)
            result.files.append(path)
    finally:
        app.close()
    return result
