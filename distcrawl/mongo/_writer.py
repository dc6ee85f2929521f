"""The blocking writer: plain synchronous pymongo code that writes a batch of documents as
upserts by ``_id`` (replacements, or updates for a Doc with ``update``), sorts what failed into
what to retry, what goes to the dead letters and what to spill, and never raises for one bad
document."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pymongo
from bson.raw_bson import RawBSONDocument
from pymongo import ReplaceOne, UpdateOne
from pymongo.errors import (
    BulkWriteError,
    OperationFailure,
)

from distcrawl.model.redact import redact_text, url_secrets
from distcrawl.mongo._config import client_options
from distcrawl.mongo._documents import (
    CODEC_OPTIONS,
    Doc,
    FlushResult,
    _short,
    check_document,
    check_update,
    dead_record,
)
from distcrawl.mongo._errors import AUTH_FAILED, TRANSIENT_CODES, WriteConcernFailed, is_transient
from distcrawl.mongo._spill import SpillFile, doc_record, spill_record

#: the package's logger: these records were always "distcrawl.mongo"
logger = logging.getLogger("distcrawl.mongo")


DEAD_SUFFIX = "_dead"


DUPLICATE_KEY = 11000


class MongoWriter:
    """Blocking writes of batches of :class:`Doc` to one database. Not thread-safe: used
    from one thread at a time (MongoIO's, or the command's main thread)."""

    def __init__(
        self,
        uri: str,
        database: str,
        *,
        spill: SpillFile,
        source: str = "",
        key_fields: tuple[str, ...] = (),
        timeout: float = 5.0,
    ) -> None:
        self.uri = uri
        self.database_name = database
        self.spill_file = spill
        self.source = source
        self.key_fields = key_fields
        self.timeout = timeout
        self._client: pymongo.MongoClient[dict[str, Any]] | None = None
        self._prepared: set[str] = set()

    @property
    def client(self) -> pymongo.MongoClient[dict[str, Any]]:
        # made on first use, on the writer's thread: even constructing it may resolve DNS
        if self._client is None:
            self._client = pymongo.MongoClient(self.uri, **client_options(self.uri, self.timeout))
        return self._client

    def collection(self, name: str) -> Any:
        return self.client[self.database_name].get_collection(name, codec_options=CODEC_OPTIONS)

    def ping(self) -> None:
        self.client.admin.command("ping")

    def prepare(self, name: str) -> None:
        """Once per collection: the unique index on DISTCRAWL_MONGO_KEY_FIELDS, if set
        (``_id``, the default key, is unique anyway); for a dead-letter collection, an index
        on ``time``. Connects, so the first call also tells whether MongoDB is reachable."""
        if name in self._prepared:
            return
        if not name.endswith(DEAD_SUFFIX) and not self.key_fields:
            self.ping()  # nothing to create
            self._prepared.add(name)
            return
        try:
            if name.endswith(DEAD_SUFFIX):
                self.collection(name).create_index("time", name="distcrawl_time")
            else:
                self.collection(name).create_index(
                    [(f, 1) for f in self.key_fields], unique=True, name="distcrawl_key"
                )
        except OperationFailure as exc:
            if is_transient(exc) or exc.code == AUTH_FAILED:
                raise  # a refused login refuses the writes too: they wait for a fix
            # e.g. existing documents already break uniqueness: writes by _id stay
            # idempotent, so the crawl goes on, loudly
            logger.error(
                "MongoDB: cannot create the indexes of %s.%s: %s",
                self.database_name,
                name,
                redact_text(str(exc), url_secrets(self.uri)),
            )
        self._prepared.add(name)

    def write(self, docs: list[Doc]) -> FlushResult:
        """Upsert every Doc by ``_id``; refused ones go to ``<collection>_dead`` (or the spill
        file). Raises on a failure of the whole batch: the caller retries all of it."""
        result = FlushResult(outcomes=[""] * len(docs))
        refused: dict[int, tuple[str, int | None]] = {}
        groups: dict[str, list[tuple[int, Doc, bytes]]] = {}
        for i, doc in enumerate(docs):
            if doc.error is not None:
                refused[i] = (doc.error, None)
                continue
            checked = check_document(doc.doc) if doc.update is None else check_update(doc.update)
            if isinstance(checked, str):
                refused[i] = (checked, None)
            else:
                groups.setdefault(doc.collection, []).append((i, doc, checked))
        for name, members in groups.items():
            self.prepare(name)
            self._upsert(name, members, result, refused)
        if refused:
            self._dead_letter(docs, refused, result)
        return result

    def _upsert(
        self,
        name: str,
        members: list[tuple[int, Doc, bytes]],
        result: FlushResult,
        refused: dict[int, tuple[str, int | None]],
    ) -> None:
        pending = members
        for attempt in (1, 2):
            ops = [_operation(doc, data) for _, doc, data in pending]
            try:
                details = self.collection(name).bulk_write(ops, ordered=False).bulk_api_result
            except BulkWriteError as exc:
                details = exc.details
            if details.get("writeConcernErrors"):
                raise WriteConcernFailed(
                    f"write concern not satisfied: {details['writeConcernErrors'][0].get('errmsg')}"
                )
            upserted = {u["index"] for u in details.get("upserted", ())}
            errors = {e["index"]: e for e in details.get("writeErrors", ())}
            retry: list[tuple[int, Doc, bytes]] = []
            for j, member in enumerate(pending):
                i = member[0]
                error = errors.get(j)
                if error is None:
                    result.outcomes[i] = "upserted" if j in upserted else "updated"
                elif attempt == 2 and member[1].filter is not None and _duplicate_id(error):
                    # a guarded update that still finds its _id but not its guard: this
                    # fetch (or a later one) is recorded already (see _tracking)
                    result.outcomes[i] = "skipped"
                elif attempt == 1 and _retryable_write_error(error):
                    retry.append(member)  # e.g. two workers upserting one new key at once
                else:
                    code = error.get("code")
                    refused[i] = (f"refused by MongoDB: {_short(str(error.get('errmsg')))}", code)
            if not retry:
                return
            pending = retry  # a second failure is final: the else branch above

    def _dead_letter(
        self,
        docs: list[Doc],
        refused: dict[int, tuple[str, int | None]],
        result: FlushResult,
    ) -> None:
        records: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for i, (reason, code) in sorted(refused.items()):
            record = dead_record(
                docs[i], reason, code, database=self.database_name, source=self.source
            )
            records.setdefault(docs[i].collection + DEAD_SUFFIX, []).append((i, record))
            result.outcomes[i] = "dead"
            result.reasons[i] = reason
        for name, members in records.items():
            self.prepare(name)
            ops: list[ReplaceOne[Any]] = [
                ReplaceOne({"_id": r["_id"]}, r, upsert=True) for _, r in members
            ]
            try:
                details = self.collection(name).bulk_write(ops, ordered=False).bulk_api_result
            except BulkWriteError as exc:
                details = exc.details
            if details.get("writeConcernErrors"):
                raise WriteConcernFailed("write concern not satisfied for dead letters")
            failed = {e["index"] for e in details.get("writeErrors", ())}
            if failed:
                self.spill_file.append(
                    spill_record(self.database_name, name, members[j][1], "dead letter refused")
                    for j in sorted(failed)
                )
                for j in failed:
                    result.outcomes[members[j][0]] = "spilled"

    def spill(self, docs: list[Doc], reason: str) -> FlushResult:
        """Append every Doc to the spill file (refused ones as dead-letter records)."""
        result = FlushResult(outcomes=["spilled"] * len(docs))
        records = []
        for i, doc in enumerate(docs):
            if doc.error is not None:
                checked: bytes | str = doc.error
            elif doc.update is None:
                checked = check_document(doc.doc)
            else:
                checked = check_update(doc.update)
            if isinstance(checked, bytes):
                records.append(doc_record(self.database_name, doc, reason))
            else:
                dead = dead_record(
                    doc, checked, None, database=self.database_name, source=self.source
                )
                records.append(
                    spill_record(self.database_name, doc.collection + DEAD_SUFFIX, dead, checked)
                )
                result.reasons[i] = checked
        self.spill_file.append(records)
        return result

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _operation(doc: Doc, data: bytes) -> ReplaceOne[Any] | UpdateOne:
    """The upsert of a checked Doc (``data`` is the BSON of its document or its update)."""
    key = doc.doc["_id"]
    if doc.update is None:
        return ReplaceOne({"_id": key}, RawBSONDocument(data), upsert=True)
    return UpdateOne(doc.filter or {"_id": key}, RawBSONDocument(data), upsert=True)


def _duplicate_id(error: Mapping[str, Any]) -> bool:
    return error.get("code") == DUPLICATE_KEY and (error.get("keyPattern") or {}).keys() == {"_id"}


def _retryable_write_error(error: Mapping[str, Any]) -> bool:
    if error.get("code") == DUPLICATE_KEY:
        # a duplicate _id on an upsert by _id is a race with another writer, not a conflict
        return _duplicate_id(error)
    return error.get("code") in TRANSIENT_CODES
