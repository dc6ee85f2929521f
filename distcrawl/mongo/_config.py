"""The MongoDB settings (``MONGO_URI``, ``DISTCRAWL_MONGO_*``), read once and checked, and the
client options every MongoDB client of distcrawl is made with.

A bad setting fails the crawl at start with the setting's name, not at the first write.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote_plus

from scrapy.settings import BaseSettings

from distcrawl.config._convert import ConfigError, _get, _positive
from distcrawl.model.redact import redact_url

T = TypeVar("T")


DEFAULT_DATABASE = "distcrawl"


_BAD_DATABASE_CHARS = re.compile(r"[/\\. \"$*<>:|?\x00]")


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
class Buffering:
    """How the pipeline holds items between two writes, and where it keeps them when MongoDB
    cannot take them (``DISTCRAWL_MONGO_BATCH_SIZE`` ... ``DISTCRAWL_MONGO_SPILL_DIR``)."""

    batch_size: int = 500
    flush_interval: float = 0.1
    #: items held at most; ``process_item`` waits for room above it
    max_buffer: int = 5000
    #: seconds the closing spider waits for MongoDB before it spills what is left
    close_timeout: float = 30.0
    spill_dir: str = "mongo-spill"


@dataclass(frozen=True)
class MongoConfig:
    """The parsed MongoDB settings; see the README for what each one does."""

    uri: str | None = None
    database: str = DEFAULT_DATABASE
    collection: str | None = None
    collections: tuple[tuple[str, str], ...] = ()
    key_fields: tuple[str, ...] = ()
    url_field: str = "url"
    buffering: Buffering = Buffering()
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
            buffering=Buffering(
                batch_size=batch_size,
                flush_interval=_get(
                    settings, "DISTCRAWL_MONGO_FLUSH_INTERVAL", 0.1, _non_negative(float)
                ),
                max_buffer=max_buffer,
                close_timeout=_get(
                    settings, "DISTCRAWL_MONGO_CLOSE_TIMEOUT", 30.0, _non_negative(float)
                ),
                spill_dir=_get(settings, "DISTCRAWL_MONGO_SPILL_DIR", "mongo-spill", str),
            ),
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
