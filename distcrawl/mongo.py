"""The MongoDB side of item storage: settings and the blocking writer.

:class:`MongoWriter` is plain synchronous pymongo code; :class:`distcrawl.pipelines.MongoPipeline`
runs it on one dedicated thread (:class:`MongoIO`) so that no MongoDB call ever blocks the
reactor, and the ``distcrawl mongo replay`` command runs it directly.

Every write is an upsert by ``_id`` (a stable key of the item), so writing a batch twice,
after a retry, a redelivered request or a re-crawl, leaves exactly one document per item.
That is what makes "retry the whole batch" the one answer to every failure of a batch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote_plus

import bson
import pymongo
from bson import json_util
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions
from bson.errors import InvalidDocument
from bson.raw_bson import RawBSONDocument
from pymongo import ReplaceOne
from pymongo.errors import (
    BulkWriteError,
    ConnectionFailure,
    OperationFailure,
    PyMongoError,
    WTimeoutError,
)
from scrapy.settings import BaseSettings
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from distcrawl.config import ConfigError, _get, _positive
from distcrawl.redact import redact_text, redact_url, url_secrets

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_DATABASE = "distcrawl"
#: MongoDB's document size limit (``maxBsonObjectSize``), the same on every server since 1.8
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
DEAD_SUFFIX = "_dead"
#: how much of a refused item a dead-letter record keeps (as JSON text)
DEAD_ITEM_MAX_CHARS = 1_000_000
SPILL_FORMAT = 1
#: how documents are turned into BSON (UUIDs in the standard representation)
CODEC_OPTIONS: CodecOptions[Any] = CodecOptions(uuid_representation=UuidRepresentation.STANDARD)
JSON_OPTIONS = json_util.JSONOptions(
    json_mode=json_util.JSONMode.RELAXED,
    uuid_representation=UuidRepresentation.STANDARD,
    tz_aware=True,
)
#: server error codes that say "try again", not "this document is bad"
TRANSIENT_CODES = frozenset(
    {6, 7, 50, 89, 91, 112, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436}
)
DUPLICATE_KEY = 11000
_BAD_DATABASE_CHARS = re.compile(r"[/\\. \"$*<>:|?\x00]")


# ---------------------------------------------------------------------- URIs


def _split_uri(uri: str) -> tuple[str, str, str] | None:
    """(scheme, part before the first ``?``, query) the way pymongo splits a URI."""
    match = re.match(r"(mongodb(?:\+srv)?://)(.*)\Z", uri, re.IGNORECASE | re.DOTALL)
    if match is None:
        return None
    head, _, query = match.group(2).partition("?")
    return match.group(1), head, query


def uri_database(uri: str) -> str | None:
    """The database named in the URI's path (``mongodb://host/NAME?...``), if any."""
    parts = _split_uri(uri)
    if parts is None:
        return None
    path = parts[1].partition("/")[2]
    name = unquote_plus(path).partition(".")[0]
    return name or None


def _uri_option_names(uri: str) -> set[str]:
    parts = _split_uri(uri)
    if parts is None:
        return set()
    return {o.partition("=")[0].lower() for o in re.split(r"[&;]", parts[2]) if o}


# ---------------------------------------------------------------------- settings


def _database_name(raw: Any) -> str:
    name = str(raw)
    if not name or len(name) > 63 or _BAD_DATABASE_CHARS.search(name):
        raise ValueError("not a valid MongoDB database name")
    return name


def _collection_name(raw: Any) -> str:
    name = str(raw)
    if not name or "$" in name or "\x00" in name or name.startswith("system."):
        raise ValueError("not a valid MongoDB collection name")
    return name


def _field_names(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = [f.strip() for f in raw.split(",")]
    names = tuple(str(f) for f in raw if str(f))
    if any(n.startswith("$") for n in names):
        raise ValueError("field names must not start with '$'")
    return names


def _non_negative(kind: Callable[[Any], T]) -> Callable[[Any], T]:
    def convert(raw: Any) -> T:
        value = kind(raw)
        if value < 0:  # type: ignore[operator]
            raise ValueError("must be >= 0")
        return value

    return convert


@dataclass(frozen=True)
class MongoConfig:
    """The parsed MongoDB settings; see the README for what each one does."""

    uri: str | None = None
    database: str = DEFAULT_DATABASE
    collection: str | None = None
    collections: tuple[tuple[str, str], ...] = ()
    key_fields: tuple[str, ...] = ()
    url_field: str = "url"
    batch_size: int = 500
    flush_interval: float = 0.1
    max_buffer: int = 5000
    close_timeout: float = 30.0
    spill_dir: str = "mongo-spill"
    timeout: float = 5.0

    @property
    def enabled(self) -> bool:
        return bool(self.uri)

    @property
    def shown_uri(self) -> str:
        return redact_url(self.uri or "")

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> MongoConfig:
        uri = settings.get("MONGO_URI") or None
        if uri is not None and (not isinstance(uri, str) or _split_uri(uri) is None):
            shown = redact_url(uri) if isinstance(uri, str) else type(uri).__name__
            raise ConfigError(f"MONGO_URI={shown!r}: expected mongodb://... or mongodb+srv://...")
        if settings.get("MONGO_DATABASE"):
            database = _get(settings, "MONGO_DATABASE", DEFAULT_DATABASE, _database_name)
        else:
            database = (uri and uri_database(uri)) or DEFAULT_DATABASE
        collection = None
        if settings.get("DISTCRAWL_MONGO_COLLECTION"):
            collection = _get(settings, "DISTCRAWL_MONGO_COLLECTION", None, _collection_name)
        collections = settings.getdict("DISTCRAWL_MONGO_COLLECTIONS")
        batch_size = _get(settings, "DISTCRAWL_MONGO_BATCH_SIZE", 500, _positive(int))
        max_buffer = _get(settings, "DISTCRAWL_MONGO_MAX_BUFFER", 5000, _positive(int))
        if max_buffer < batch_size:
            raise ConfigError(
                f"DISTCRAWL_MONGO_MAX_BUFFER={max_buffer}: must be >= "
                f"DISTCRAWL_MONGO_BATCH_SIZE ({batch_size})"
            )
        for type_name, name in collections.items():
            try:
                _collection_name(name)
            except ValueError as exc:
                raise ConfigError(
                    f"DISTCRAWL_MONGO_COLLECTIONS[{type_name!r}]={name!r}: {exc}"
                ) from None
        return cls(
            uri=uri,
            database=database,
            collection=collection,
            collections=tuple((str(k), str(v)) for k, v in collections.items()),
            key_fields=_get(settings, "DISTCRAWL_MONGO_KEY_FIELDS", (), _field_names),
            url_field=_get(settings, "DISTCRAWL_MONGO_URL_FIELD", "url", str) or "url",
            batch_size=batch_size,
            flush_interval=_get(
                settings, "DISTCRAWL_MONGO_FLUSH_INTERVAL", 0.1, _non_negative(float)
            ),
            max_buffer=max_buffer,
            close_timeout=_get(
                settings, "DISTCRAWL_MONGO_CLOSE_TIMEOUT", 30.0, _non_negative(float)
            ),
            spill_dir=_get(settings, "DISTCRAWL_MONGO_SPILL_DIR", "mongo-spill", str),
            timeout=_get(settings, "DISTCRAWL_MONGO_TIMEOUT", 5.0, _positive(float)),
        )

    def collection_for(self, item_type: type, default: str) -> str:
        """The collection of items of ``item_type``: DISTCRAWL_MONGO_COLLECTIONS (by dotted
        path or class name), else DISTCRAWL_MONGO_COLLECTION, else ``default``."""
        names = (f"{item_type.__module__}.{item_type.__qualname__}", item_type.__qualname__)
        mapping = dict(self.collections)
        for name in names:
            if name in mapping:
                return mapping[name]
        return self.collection or default


def client_options(uri: str, timeout: float) -> dict[str, Any]:
    """Keyword arguments for MongoClient: timeouts and a journaled write concern, each only
    where the URI does not set it (pymongo lets keyword arguments override the URI)."""
    given = _uri_option_names(uri)
    millis = int(timeout * 1000)
    options: dict[str, Any] = {"appname": "distcrawl"} if "appname" not in given else {}
    for name in ("serverSelectionTimeoutMS", "connectTimeoutMS"):
        if name.lower() not in given:
            options[name] = millis
    if "sockettimeoutms" not in given:
        options["socketTimeoutMS"] = max(millis * 6, 30_000)
    if not given & {"w", "journal", "j", "wtimeoutms"}:
        # acknowledged only once in the journal: an item is durable before its request is
        # acknowledged in Redis (on a replica set the server's default w still applies)
        options["journal"] = True
    return options


# ---------------------------------------------------------------------- keys


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


# ---------------------------------------------------------------------- documents


@dataclass
class Doc:
    """One item on its way to MongoDB: the document (with ``_id`` first) and its target."""

    collection: str
    doc: dict[str, Any]
    #: the item's key, or None if it has none (then ``error`` says why)
    key: Any = None
    item_type: str = "dict"
    #: set when the item was refused before any write (no key)
    error: str | None = None


@dataclass
class FlushResult:
    """What became of each Doc of a batch: "upserted", "updated", "dead" or "spilled"."""

    outcomes: list[str] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return self.outcomes.count(outcome)


def check_document(doc: Mapping[str, Any]) -> bytes | str:
    """The BSON of ``doc``, or the reason MongoDB would refuse it."""
    for name in doc:
        if isinstance(name, str) and name.startswith("$"):
            return (
                f"field name {name!r} starts with '$' (MongoDB refuses it at the top level "
                "of a replacement document, error 52)"
            )
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


# ---------------------------------------------------------------------- errors


def is_transient(exc: BaseException) -> bool:
    """Whether a failure of a whole batch is the kind that goes away (outage, failover)."""
    if isinstance(exc, ConnectionFailure | WTimeoutError):
        return True
    if isinstance(exc, PyMongoError) and exc.has_error_label("RetryableWriteError"):
        return True
    return isinstance(exc, OperationFailure) and exc.code in TRANSIENT_CODES


#: OperationFailure codes of a refused login (AuthenticationFailed) and a refused action
#: (Unauthorized): retrying will not help, and "unreachable" would point at the network
AUTH_FAILED, UNAUTHORIZED = 18, 13
AUTH_REFUSALS = {
    AUTH_FAILED: "MongoDB refused the credentials",
    UNAUTHORIZED: "MongoDB refused the user's permissions",
}


def auth_refusal(exc: BaseException) -> str | None:
    """What MongoDB refused, when ``exc`` is a failed login or a missing permission."""
    if isinstance(exc, OperationFailure):
        return AUTH_REFUSALS.get(exc.code or 0)
    return None


class WriteConcernFailed(PyMongoError):
    """The writes were applied but not acknowledged as durable: the batch is retried."""


# ---------------------------------------------------------------------- spill file


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


def read_spill(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of a spill file; a line that is not a record raises ValueError."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json_util.loads(line, json_options=JSON_OPTIONS)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
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


# ---------------------------------------------------------------------- writer


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
        groups: dict[str, list[tuple[int, Any, bytes]]] = {}
        for i, doc in enumerate(docs):
            if doc.error is not None:
                refused[i] = (doc.error, None)
                continue
            checked = check_document(doc.doc)
            if isinstance(checked, str):
                refused[i] = (checked, None)
            else:
                groups.setdefault(doc.collection, []).append((i, doc.doc["_id"], checked))
        for name, members in groups.items():
            self.prepare(name)
            self._upsert(name, members, result, refused)
        if refused:
            self._dead_letter(docs, refused, result)
        return result

    def _upsert(
        self,
        name: str,
        members: list[tuple[int, Any, bytes]],
        result: FlushResult,
        refused: dict[int, tuple[str, int | None]],
    ) -> None:
        pending = members
        for attempt in (1, 2):
            ops: list[ReplaceOne[Any]] = [
                ReplaceOne({"_id": key}, RawBSONDocument(data), upsert=True)
                for _, key, data in pending
            ]
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
            retry: list[tuple[int, Any, bytes]] = []
            for j, member in enumerate(pending):
                i = member[0]
                error = errors.get(j)
                if error is None:
                    result.outcomes[i] = "upserted" if j in upserted else "updated"
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
            checked = check_document(doc.doc) if doc.error is None else doc.error
            if isinstance(checked, bytes):
                records.append(spill_record(self.database_name, doc.collection, doc.doc, reason))
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


def _retryable_write_error(error: Mapping[str, Any]) -> bool:
    code = error.get("code")
    if code == DUPLICATE_KEY:
        # a duplicate _id on an upsert by _id is a race with another writer, not a conflict
        return (error.get("keyPattern") or {}).keys() == {"_id"}
    return code in TRANSIENT_CODES


# ---------------------------------------------------------------------- replay


@dataclass
class ReplayResult:
    documents: int = 0
    upserted: int = 0
    updated: int = 0
    dead: int = 0
    spilled: int = 0
    files: list[str] = field(default_factory=list)


def replay(
    paths: Iterable[str | os.PathLike[str]],
    uri: str,
    *,
    database: str | None = None,
    batch_size: int = 500,
    timeout: float = 5.0,
) -> ReplayResult:
    """Write the documents of spill files into MongoDB (upserts by ``_id``: replaying a
    file twice changes nothing). Documents MongoDB refuses are dead-lettered again; what
    cannot even be dead-lettered goes to ``<file>.rejected.jsonl``. Raises on a failure
    of a whole batch (MongoDB unreachable): nothing is lost, run it again."""
    result = ReplayResult()
    writers: dict[str, MongoWriter] = {}
    try:
        for path in paths:
            spill = SpillFile(f"{path}.rejected.jsonl")
            batches: dict[str, list[Doc]] = {}
            for _number, record in read_spill(path):
                name = database or record["database"]
                doc = record["doc"]
                batch = batches.setdefault(name, [])
                batch.append(Doc(record["collection"], doc, key=doc["_id"], item_type="replay"))
                if len(batch) >= batch_size:
                    _replay_batch(writers, uri, name, batch, spill, timeout, result)
                    batches[name] = []
            for name, batch in batches.items():
                if batch:
                    _replay_batch(writers, uri, name, batch, spill, timeout, result)
            result.files.append(str(path))
    finally:
        for writer in writers.values():
            writer.close()
    return result


def _replay_batch(
    writers: dict[str, MongoWriter],
    uri: str,
    database: str,
    batch: list[Doc],
    spill: SpillFile,
    timeout: float,
    result: ReplayResult,
) -> None:
    writer = writers.get(database)
    if writer is None:
        writer = writers[database] = MongoWriter(
            uri, database, spill=spill, source="replay", timeout=timeout
        )
    writer.spill_file = spill
    outcome = writer.write(batch)
    result.documents += len(batch)
    result.upserted += outcome.count("upserted")
    result.updated += outcome.count("updated")
    result.dead += outcome.count("dead")
    result.spilled += outcome.count("spilled")


# ---------------------------------------------------------------------- thread


def _daemon_thread(*args: Any, **kwargs: Any) -> threading.Thread:
    # a worker whose MongoDB hangs must still be able to exit
    return threading.Thread(*args, daemon=True, **kwargs)


class _DaemonThreadPool(ThreadPool):
    threadFactory = staticmethod(_daemon_thread)  # type: ignore[assignment]


class MongoIO:
    """The one thread every pymongo call of a pipeline runs on, in the order issued."""

    def __init__(self) -> None:
        self._pool: ThreadPool | None = None

    def start(self) -> None:
        if self._pool is None:
            self._pool = _DaemonThreadPool(minthreads=1, maxthreads=1, name="distcrawl-mongo")
            self._pool.start()

    def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        if self._pool is None:
            raise RuntimeError("MongoIO.run() before start()")
        from twisted.internet import reactor

        return deferToThreadPool(reactor, self._pool, func, *args, **kwargs)

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
