"""The spill file: where a pipeline writes, as JSON lines, what MongoDB could not take by
the time the crawl closes, so that no item is lost to an outage; ``distcrawl mongo replay``
reads it back."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from bson import json_util

from distcrawl.mongo._documents import JSON_OPTIONS, Doc

#: a record whose ``doc`` replaces the document with its ``_id`` (every record before updates)
SPILL_FORMAT = 1
#: a record that says its operation (``op``: "update" with ``update`` and maybe ``filter``).
#: A new number, so that an older ``distcrawl mongo replay`` refuses the record instead of
#: replacing a page's document with the bare ``doc`` such a record carries.
SPILL_FORMAT_OPS = 2


class SpillFile:
    """A JSON-lines file of documents that could not be written, replayable with
    ``distcrawl mongo replay``. Created on the first record; each record is fsynced."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.records = 0
        self._lock = threading.Lock()

    def append(self, records: Iterable[Mapping[str, Any]]) -> int:
        lines = [json_util.dumps(r, json_options=JSON_OPTIONS) + "\n" for r in records]
        if not lines:
            return 0
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.writelines(lines)
                handle.flush()
                os.fsync(handle.fileno())
            self.records += len(lines)
        return len(lines)


def spill_record(
    database: str, collection: str, doc: Mapping[str, Any], reason: str
) -> dict[str, Any]:
    """The record of a replacement (format 1, what every spill file held before updates)."""
    return {
        "v": SPILL_FORMAT,
        "database": database,
        "collection": collection,
        "reason": reason,
        "doc": doc,
    }


def doc_record(database: str, doc: Doc, reason: str) -> dict[str, Any]:
    """The record of a Doc, so that replaying it writes what the pipeline would have: a
    replacement as before, or an update with its filter and what kind of write it is. An
    update's ``doc`` is only its ``_id`` (its fields are in the update, not twice)."""
    if doc.update is None:
        return spill_record(database, doc.collection, doc.doc, reason)
    record: dict[str, Any] = {
        "v": SPILL_FORMAT_OPS,
        "op": "update",
        "database": database,
        "collection": doc.collection,
        "reason": reason,
        "doc": {"_id": doc.doc["_id"]},
        "update": doc.update,
        "tracking": doc.tracking,
    }
    if doc.filter is not None:
        record["filter"] = doc.filter
    return record


def record_doc(record: Mapping[str, Any]) -> Doc:
    """The Doc a spill record (either format) holds, for ``distcrawl mongo replay``."""
    doc = dict(record["doc"])
    if record.get("op", "replace") == "replace":
        return Doc(record["collection"], doc, key=doc["_id"], item_type="replay")
    update = record["update"]
    # what a dead letter shows of it, should the update be refused again
    shown = {"_id": doc["_id"], **update.get("$set", {})}
    return Doc(
        record["collection"],
        shown,
        key=doc["_id"],
        item_type="replay",
        update=update,
        filter=record.get("filter"),
        tracking=bool(record.get("tracking")),
    )


def json_lines(
    path: str | os.PathLike[str],
) -> Iterator[tuple[int, Any, ValueError | TypeError | None]]:
    """(line number, value, None) of each line of a JSON-lines file distcrawl wrote (a spill
    file, a notification spill file), or (line number, None, the error) for a line that is
    not JSON: each reader says in its own words what the line should have been."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                value = json_util.loads(line, json_options=JSON_OPTIONS)
            except (ValueError, TypeError) as exc:
                yield number, None, exc
            else:
                yield number, value, None


def read_spill(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of a spill file; a line that is not a record raises ValueError."""
    for number, record, error in json_lines(path):
        if error is not None:
            raise ValueError(f"{path}:{number}: not JSON: {error}")
        if (
            not isinstance(record, dict)
            or record.get("v") not in (SPILL_FORMAT, SPILL_FORMAT_OPS)
            or not isinstance(record.get("doc"), dict)
            or "_id" not in record["doc"]
            or not isinstance(record.get("collection"), str)
            or not isinstance(record.get("database"), str)
            or not _known_op(record)
        ):
            raise ValueError(f"{path}:{number}: not a distcrawl spill record")
        yield number, record


def _known_op(record: Mapping[str, Any]) -> bool:
    op = record.get("op", "replace")
    if record["v"] == SPILL_FORMAT:
        return "op" not in record
    if op == "replace":
        return True
    return (
        op == "update"
        and isinstance(record.get("update"), dict)
        and isinstance(record.get("update", {}).get("$set", {}), dict)
        and isinstance(record.get("filter", {}), dict)
    )
