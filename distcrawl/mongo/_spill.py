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

from distcrawl.mongo._documents import JSON_OPTIONS

SPILL_FORMAT = 1


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
    return {
        "v": SPILL_FORMAT,
        "database": database,
        "collection": collection,
        "reason": reason,
        "doc": doc,
    }


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
            or record.get("v") != SPILL_FORMAT
            or not isinstance(record.get("doc"), dict)
            or "_id" not in record["doc"]
            or not isinstance(record.get("collection"), str)
            or not isinstance(record.get("database"), str)
        ):
            raise ValueError(f"{path}:{number}: not a distcrawl spill record")
        yield number, record
