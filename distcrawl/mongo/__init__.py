"""The MongoDB side of item storage: settings and the blocking writer.

:class:`MongoWriter` is plain synchronous pymongo code; :class:`distcrawl.pipelines.MongoPipeline`
runs it on one dedicated thread (:class:`MongoIO`) so that no MongoDB call ever blocks the
reactor, and the ``distcrawl mongo replay`` command runs it directly.

Every write is an upsert by ``_id`` (a stable key of the item), so writing a batch twice,
after a retry, a redelivered request or a re-crawl, leaves exactly one document per item.
That is what makes "retry the whole batch" the one answer to every failure of a batch. The
one write that counts (a page's fetch, ``$inc``) is guarded so that it applies once.

The package follows the path of an item: its settings (``_config``), the item as a document
with its key (``_documents``), a page's fetches as updates of its document (``_tracking``),
the writer (``_writer``) on its thread (``_io``), the failures worth retrying (``_errors``),
and the spill file (``_spill``) that ``distcrawl mongo replay`` (``_replay``) writes to
MongoDB later. Every public name is importable from here.
"""

from __future__ import annotations

from distcrawl.mongo._config import (
    DEFAULT_DATABASE,
    Buffering,
    MongoConfig,
    client_options,
    uri_database,
)
from distcrawl.mongo._documents import (
    CODEC_OPTIONS,
    DEAD_ITEM_MAX_CHARS,
    JSON_OPTIONS,
    MAX_DOCUMENT_BYTES,
    Doc,
    DocContext,
    FlushResult,
    NoKey,
    check_document,
    check_update,
    dead_record,
    item_document,
    item_key,
    item_text,
    key_from_fields,
)
from distcrawl.mongo._errors import (
    AUTH_FAILED,
    AUTH_REFUSALS,
    TRANSIENT_CODES,
    UNAUTHORIZED,
    WriteConcernFailed,
    auth_refusal,
    error_reason,
    is_transient,
)
from distcrawl.mongo._io import MongoIO
from distcrawl.mongo._replay import ReplayResult, replay
from distcrawl.mongo._spill import (
    SPILL_FORMAT,
    SPILL_FORMAT_OPS,
    SpillFile,
    doc_record,
    json_lines,
    read_spill,
    record_doc,
    spill_record,
)
from distcrawl.mongo._tracking import (
    TRACKING_FIELDS,
    content_update,
    document_for,
    fetch_document,
    fetch_time,
    tracking_filter,
    tracking_update,
)
from distcrawl.mongo._writer import DEAD_SUFFIX, DUPLICATE_KEY, MongoWriter

__all__ = [
    "AUTH_FAILED",
    "AUTH_REFUSALS",
    "CODEC_OPTIONS",
    "DEAD_ITEM_MAX_CHARS",
    "DEAD_SUFFIX",
    "DEFAULT_DATABASE",
    "DUPLICATE_KEY",
    "JSON_OPTIONS",
    "MAX_DOCUMENT_BYTES",
    "SPILL_FORMAT",
    "SPILL_FORMAT_OPS",
    "TRACKING_FIELDS",
    "TRANSIENT_CODES",
    "UNAUTHORIZED",
    "Buffering",
    "Doc",
    "DocContext",
    "FlushResult",
    "MongoConfig",
    "MongoIO",
    "MongoWriter",
    "NoKey",
    "ReplayResult",
    "SpillFile",
    "WriteConcernFailed",
    "auth_refusal",
    "check_document",
    "check_update",
    "client_options",
    "content_update",
    "dead_record",
    "doc_record",
    "document_for",
    "error_reason",
    "fetch_document",
    "fetch_time",
    "is_transient",
    "item_document",
    "item_key",
    "item_text",
    "json_lines",
    "key_from_fields",
    "read_spill",
    "record_doc",
    "replay",
    "spill_record",
    "tracking_filter",
    "tracking_update",
    "uri_database",
]
