"""Change tracking: what each fetch of a page found, kept on the page's own document.

While revisits are on (DISTCRAWL_RECRAWL_INTERVAL), distcrawl emits a
:class:`~distcrawl.items.PageFetch` for every fetch of a page. Its history belongs beside the
page's content, where whoever reads the page finds it, so a PageFetch is not a document of its
own: it becomes an update of the document keyed by its URL's request fingerprint (the default
key of the page's items), which sets the tracking fields (``TRACKING_FIELDS``).

For those fields to survive the next version of the page, the page's items must not replace
its document any more: with revisits on, an item becomes ``{"$set": <its fields>}`` instead
(:func:`content_update`).

A tracking update counts (``$inc``), so writing it twice would count one fetch twice, and a
batch is written again after any failure of the whole batch, and a spill file may be replayed
twice. So its filter is guarded: it matches only while the document's ``last_fetched`` is
older than this fetch. Written again, it matches nothing, its upsert collides with the
existing ``_id``, and that duplicate key is read as "already recorded" (``skipped``).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from itemadapter import ItemAdapter

from distcrawl.items import PageFetch
from distcrawl.mongo._config import MongoConfig
from distcrawl.mongo._documents import Doc, DocContext, NoKey, item_document, item_key, placed

#: the fields a PageFetch maintains on its page's document
TRACKING_FIELDS = (
    "first_seen",
    "last_fetched",
    "last_changed",
    "fetch_count",
    "change_count",
    "signature",
    "status",
)

#: the default key (the URL's request fingerprint), whatever DISTCRAWL_MONGO_KEY_FIELDS says
_URL_KEY = MongoConfig()


def fetch_time(epoch: float) -> datetime:
    """``epoch`` as a timezone-aware UTC datetime, cut to the millisecond as BSON stores it,
    so that the guard compares this fetch's time with exactly what was stored for it."""
    return datetime.fromtimestamp(math.floor(epoch * 1000) / 1000, tz=timezone.utc)


def tracking_update(fetch: PageFetch) -> dict[str, Any]:
    """The update document of one fetch (pure: no clock, no server).

    A first or changed fetch sets every tracking field and counts a change (none on the
    first); an unchanged one (a 304, the same signature) sets only ``last_fetched`` and
    ``status`` and counts the fetch. ``first_seen`` is set with ``$min``, not
    ``$setOnInsert``: the page's own item is written before its PageFetch, so the document
    usually exists already and ``$setOnInsert`` would never set it; ``$min`` sets it when
    missing and keeps the earliest time otherwise."""
    at = fetch_time(fetch.fetched_at)
    if fetch.first or fetch.changed:
        return {
            "$set": {
                "last_fetched": at,
                "last_changed": at,
                "signature": fetch.signature,
                "status": fetch.status,
            },
            "$min": {"first_seen": at},
            "$inc": {"fetch_count": 1, "change_count": 0 if fetch.first else 1},
        }
    return {"$set": {"last_fetched": at, "status": fetch.status}, "$inc": {"fetch_count": 1}}


def tracking_filter(key: Any, fetch: PageFetch) -> dict[str, Any]:
    """The guarded filter: the page's document while it records no fetch as late as this
    one (``$not``/``$gte`` also matches a document without ``last_fetched``, such as one a
    page item just created)."""
    return {"_id": key, "last_fetched": {"$not": {"$gte": fetch_time(fetch.fetched_at)}}}


def _fetch_error(fetch: PageFetch) -> str | None:
    if not isinstance(fetch.url, str) or not fetch.url:
        return "no key: a PageFetch without a URL"
    at = fetch.fetched_at
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        return f"fetched_at {at!r} is not a time in seconds since the epoch"
    if isinstance(fetch.status, bool) or not isinstance(fetch.status, int):
        return f"status {fetch.status!r} is not an integer"
    return None


def fetch_document(fetch: PageFetch, ctx: DocContext) -> Doc:
    """The Doc of a PageFetch: the tracking update of its page's document, in the collection
    of PageFetch items (DISTCRAWL_MONGO_COLLECTIONS may map PageFetch itself; else
    DISTCRAWL_MONGO_COLLECTION or the spider's name, where page items go by default). A
    PageFetch that cannot be one still becomes a Doc with ``error`` set: dead-lettered."""
    collection, type_name = placed(fetch, ctx)
    data = ItemAdapter(fetch).asdict()
    error = _fetch_error(fetch)
    key = None
    if error is None:
        try:
            key = item_key({"url": fetch.url}, _URL_KEY, ctx.fingerprint)
        except NoKey as exc:
            error = f"no key: {exc}"
    if error is not None:
        return Doc(collection, data, item_type=type_name, error=error, tracking=True)
    return Doc(
        collection,
        {"_id": key, **data},
        key=key,
        item_type=type_name,
        update=tracking_update(fetch),
        filter=tracking_filter(key, fetch),
        tracking=True,
    )


def content_update(doc: Doc) -> Doc:
    """An item's Doc written as ``{"$set": <every field but _id>}`` rather than as a
    replacement, so that the tracking fields on its document survive it."""
    if doc.error is None:
        doc.update = {"$set": {k: v for k, v in doc.doc.items() if k != "_id"}}
    return doc


def document_for(item: Any, ctx: DocContext, *, revisits: bool) -> Doc:
    """The Doc the pipeline writes for ``item``: a PageFetch's tracking update; an item's
    replacement, or with ``revisits`` its ``$set`` update."""
    if isinstance(item, PageFetch):
        return fetch_document(item, ctx)
    doc = item_document(item, ctx)
    return content_update(doc) if revisits else doc
