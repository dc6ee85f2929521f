"""Items as MongoDB documents: the stable ``_id`` that makes every write an upsert, the checks
that tell a document MongoDB will refuse before it is sent, and the dead-letter record of one.
A scraped item becomes its document here too, so that its key is chosen in one place.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import bson
from bson import json_util
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions
from bson.errors import InvalidDocument
from itemadapter import ItemAdapter
from scrapy import Request

if TYPE_CHECKING:
    from distcrawl.mongo._config import MongoConfig

#: MongoDB's document size limit (``maxBsonObjectSize``), the same on every server since 1.8
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024


#: how much of a refused item a dead-letter record keeps (as JSON text)
DEAD_ITEM_MAX_CHARS = 1_000_000


#: how documents are turned into BSON (UUIDs in the standard representation)
CODEC_OPTIONS: CodecOptions[Any] = CodecOptions(uuid_representation=UuidRepresentation.STANDARD)


JSON_OPTIONS = json_util.JSONOptions(
    json_mode=json_util.JSONMode.RELAXED,
    uuid_representation=UuidRepresentation.STANDARD,
    tz_aware=True,
)


class NoKey(ValueError):
    """The item has no usable key; the message says why."""


def key_from_fields(data: Mapping[str, Any], fields: Iterable[str]) -> str:
    """A stable hex key of the values of ``fields``: the same values give the same key."""
    values = []
    for name in fields:
        if name not in data or data[name] is None:
            raise NoKey(f"key field {name!r} is missing")
        values.append(data[name])
    try:
        text = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        text = json_util.dumps(values, json_options=JSON_OPTIONS, sort_keys=True)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()  # a key, not a secret


@dataclass
class Doc:
    """One item on its way to MongoDB: the document (with ``_id`` first) and its target.

    By default it is written as a replacement of the document with its ``_id``. With
    ``update`` set it is written as that update instead (an upsert too), so that fields
    written by others (the change-tracking fields, ``_tracking``) survive; ``doc`` is then
    what a dead letter shows of it."""

    collection: str
    doc: dict[str, Any]
    #: the item's key, or None if it has none (then ``error`` says why)
    key: Any = None
    item_type: str = "dict"
    #: set when the item was refused before any write (no key)
    error: str | None = None
    #: an update document (``{"$set": ...}``...) to write instead of replacing with ``doc``
    update: dict[str, Any] | None = None
    #: the filter of the update, if more than ``{"_id": key}``: a guard that makes it a no-op
    #: once applied (a duplicate key error on ``_id`` then means "already recorded")
    filter: dict[str, Any] | None = None
    #: a PageFetch's tracking update rather than an item: counted and notified apart
    tracking: bool = False


@dataclass
class FlushResult:
    """What became of each Doc of a batch: "upserted", "updated", "dead" or "spilled", or
    "skipped" for a guarded update that was already recorded (see ``Doc.filter``)."""

    outcomes: list[str] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return self.outcomes.count(outcome)


@dataclass(frozen=True)
class DocContext:
    """What turns an item into its Doc, the same for every item of a crawl: the settings
    (which collection, which key), the collection of the items they do not place (the
    spider's name), and the request fingerprinter that keys an item by its URL."""

    config: MongoConfig
    default_collection: str
    fingerprint: Callable[[Request], bytes]


def item_document(item: Any, ctx: DocContext) -> Doc:
    """The Doc of a scraped item, keyed; an item that cannot be one (not an item, no key)
    still becomes a Doc, with ``error`` set, so that it is dead-lettered, not lost."""
    collection, type_name = placed(item, ctx)
    if not ItemAdapter.is_item(item):
        return Doc(
            collection,
            {"value": repr(item)},
            item_type=type_name,
            error="not an item (itemadapter does not support this type)",
        )
    data = ItemAdapter(item).asdict()
    try:
        key = item_key(data, ctx.config, ctx.fingerprint)
    except NoKey as exc:
        return Doc(collection, data, item_type=type_name, error=f"no key: {exc}")
    doc: dict[str, Any] = {"_id": key}
    doc.update((k, v) for k, v in data.items() if k != "_id")
    return Doc(collection, doc, key=key, item_type=type_name)


def placed(item: Any, ctx: DocContext) -> tuple[str, str]:
    """The collection ``item`` goes to and the dotted name of its type, which its Doc (and
    any dead letter of it) records: the same for items and PageFetches."""
    item_type = type(item)
    collection = ctx.config.collection_for(item_type, ctx.default_collection)
    return collection, f"{item_type.__module__}.{item_type.__qualname__}"


def item_key(
    data: Mapping[str, Any], config: MongoConfig, fingerprint: Callable[[Request], bytes]
) -> Any:
    """The item's ``_id``: its own, or the hash of DISTCRAWL_MONGO_KEY_FIELDS, or (by
    default) the request fingerprint of its URL, the key Redis dedups pages by."""
    if data.get("_id") is not None:
        return data["_id"]
    if config.key_fields:
        return key_from_fields(data, config.key_fields)
    name = config.url_field
    url = data.get(name)
    if not isinstance(url, str) or not url:
        raise NoKey(
            f"the item has no {name!r} field; set DISTCRAWL_MONGO_KEY_FIELDS for items "
            "without a URL"
        )
    try:
        request = Request(url)
    except (TypeError, ValueError) as exc:
        raise NoKey(f"{name!r} is not a URL: {exc}") from None
    return fingerprint(request).hex()


def check_document(doc: Mapping[str, Any]) -> bytes | str:
    """The BSON of ``doc``, or the reason MongoDB would refuse it."""
    for name in doc:
        if isinstance(name, str) and name.startswith("$"):
            return (
                f"field name {name!r} starts with '$' (MongoDB refuses it at the top level "
                "of a replacement document, error 52)"
            )
    return _encoded(doc)


def check_update(update: Mapping[str, Any]) -> bytes | str:
    """The BSON of an update document, or the reason MongoDB would refuse it (or, for a
    field name with a dot, store it otherwise than a replacement would)."""
    for operator, fields in update.items():
        if not isinstance(operator, str) or not operator.startswith("$"):
            return f"not an update operator: {operator!r}"
        if not isinstance(fields, Mapping):
            return f"{operator} needs a document of fields"
        for name in fields:
            if not isinstance(name, str) or not name:
                return f"field name {name!r} is not a non-empty string"
            if name.startswith("$"):
                return (
                    f"field name {name!r} starts with '$' (MongoDB refuses it at the top level "
                    "of a document, error 52)"
                )
            if "." in name:
                return (
                    f"field name {name!r} contains '.', which an update ({operator}) reads as "
                    "a path into a subdocument; with revisits on, items are written as updates"
                )
    return _encoded(update)


def _encoded(doc: Mapping[str, Any]) -> bytes | str:
    """The BSON of a replacement or update document, or why MongoDB could not take it: the
    checks both kinds share, after each kind's own checks of its field names."""
    try:
        data = bson.encode(doc, codec_options=CODEC_OPTIONS)
    except (InvalidDocument, OverflowError, TypeError, ValueError) as exc:
        return f"cannot be encoded as BSON: {_short(str(exc))}"
    if len(data) > MAX_DOCUMENT_BYTES:
        return (
            f"document too large: {len(data)} bytes of BSON, "
            f"MongoDB's limit is {MAX_DOCUMENT_BYTES}"
        )
    return data


def _short(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def item_text(doc: Mapping[str, Any]) -> tuple[str, bool]:
    """A JSON rendering of a (possibly unencodable) item for a dead letter, and whether it
    was cut to DEAD_ITEM_MAX_CHARS."""
    try:
        text = json.dumps(doc, default=repr, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(doc)
    if len(text) > DEAD_ITEM_MAX_CHARS:
        return text[:DEAD_ITEM_MAX_CHARS], True
    return text, False


def dead_record(
    doc: Doc, reason: str, code: int | None, *, database: str, source: str
) -> dict[str, Any]:
    text, truncated = item_text(doc.doc)
    key = doc.key if isinstance(doc.key, str | int) else None
    if key is not None and doc.tracking:
        # a page's fetch shares its page item's key: its own record, one per fetch, so that
        # it never replaces the record of the page's refused item
        at = (doc.update or {}).get("$set", {}).get("last_fetched")
        key = f"fetch:{key}:{at.isoformat() if isinstance(at, datetime) else ''}"
    return {
        # the same item refused again replaces its record instead of adding one
        "_id": key if key is not None else bson.ObjectId(),
        "reason": reason,
        "code": code,
        "database": database,
        "collection": doc.collection,
        "item_type": doc.item_type,
        "item": text,
        "truncated": truncated,
        "source": source,
        "time": datetime.now(timezone.utc),
    }
