"""Requests as data, never as code.

A payload is one format byte followed by the encoded request: ``m`` msgpack (default),
``j`` JSON, ``p`` pickle. The format byte lets a worker refuse a pickled payload it was not
told to trust: anyone who can write to Redis could otherwise run code in every worker.
Defaults are left out of the payload (a plain GET costs its URL and a few bytes).
"""

from __future__ import annotations

import base64
import json
import pickle
import sys
from typing import Any

import msgpack
from scrapy import Request, Spider
from scrapy.utils.misc import load_object
from scrapy.utils.request import request_from_dict

MSGPACK, JSON, PICKLE = b"m", b"j", b"p"
_FORMATS = {"msgpack": MSGPACK, "json": JSON, "pickle": PICKLE}

# attribute -> (short key, default); defaults are not stored
_FIELDS: dict[str, tuple[str, Any]] = {
    "url": ("u", None),
    "method": ("m", "GET"),
    "headers": ("h", []),
    "body": ("b", b""),
    "cookies": ("c", {}),
    "meta": ("M", {}),
    "encoding": ("e", "utf-8"),
    "priority": ("p", 0),
    "dont_filter": ("d", False),
    "flags": ("f", []),
    "cb_kwargs": ("k", {}),
    "callback": ("cb", None),
    "errback": ("eb", None),
}
_SHORT = {short: attr for attr, (short, _) in _FIELDS.items()}


class SerializationError(ValueError):
    """A request cannot be stored in Redis; the message names the request and the cause."""


class DecodeError(ValueError):
    """A payload read from Redis cannot be turned back into a request."""


def _method_name(spider: Spider | None, func: Any, what: str) -> str | None:
    if func is None or isinstance(func, str):
        return func
    name = getattr(func, "__name__", None)
    owner = getattr(func, "__self__", None)
    if spider is not None and owner is spider and name:
        bound = getattr(spider, name, None)
        if getattr(bound, "__func__", None) is getattr(func, "__func__", object()):
            return str(name)
    raise SerializationError(
        f"{what} {func!r} is not a method of the spider, so it cannot be stored in Redis"
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$b": base64.b64encode(value).decode("ascii")}
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json_hook(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and "$b" in obj:
        return base64.b64decode(obj["$b"])
    return obj


class RequestCodec:
    """Encodes requests for the shared queue and decodes them for this spider."""

    def __init__(self, serializer: str = "msgpack", spider: Spider | None = None) -> None:
        if serializer not in _FORMATS:
            raise ValueError(f"unknown serializer {serializer!r}")
        self.format = _FORMATS[serializer]
        self.allow_pickle = serializer == "pickle"
        self.spider = spider

    def to_dict(self, request: Request) -> dict[str, Any]:
        out: dict[str, Any] = {}
        value: Any
        for attr, (short, default) in _FIELDS.items():
            if attr == "callback":
                value = _method_name(self.spider, request.callback, "callback")
            elif attr == "errback":
                value = _method_name(self.spider, request.errback, "errback")
            elif attr == "headers":
                # pairs, not a dict: JSON has no bytes keys
                value = [[k, list(v)] for k, v in request.headers.items()]
            else:
                value = getattr(request, attr)
            if value != default:
                out[short] = value
        if type(request) is not Request:
            cls = type(request)
            out["cls"] = f"{cls.__module__}.{cls.__qualname__}"
        return out

    def encode(self, request: Request) -> bytes:
        try:
            return self.encode_dict(self.to_dict(request))
        except SerializationError as exc:
            raise SerializationError(f"cannot serialize {request}: {exc}") from None

    def encode_dict(self, data: dict[str, Any]) -> bytes:
        """Encode the short-key dict of :meth:`to_dict` (or of :meth:`decode_dict`)."""
        try:
            if self.format == MSGPACK:
                return MSGPACK + msgpack.packb(data, use_bin_type=True)
            if self.format == JSON:
                text = json.dumps(data, default=_json_default, separators=(",", ":"))
                return JSON + text.encode()
            return PICKLE + pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
        except (TypeError, ValueError, OverflowError, pickle.PicklingError) as exc:
            raise SerializationError(
                f"{exc} (meta, cb_kwargs and cookies must hold plain data: str, bytes, "
                "numbers, bools, None, lists and dicts)"
            ) from None

    def decode_dict(self, payload: bytes) -> dict[str, Any]:
        if not payload:
            raise DecodeError("empty payload")
        fmt, body = payload[:1], payload[1:]
        try:
            if fmt == MSGPACK:
                data = msgpack.unpackb(body, raw=False, strict_map_key=False)
            elif fmt == JSON:
                data = json.loads(body, object_hook=_json_hook)
            elif fmt == PICKLE:
                if not self.allow_pickle:
                    raise DecodeError(
                        "pickled payload refused: set DISTCRAWL_SERIALIZER='pickle' to trust "
                        "pickles written to Redis"
                    )
                data = pickle.loads(body)  # opted in by DISTCRAWL_SERIALIZER='pickle'
            else:
                raise DecodeError(f"unknown payload format {fmt!r}")
        except DecodeError:
            raise
        except Exception as exc:
            raise DecodeError(f"undecodable payload: {type(exc).__name__}: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("u"), str):
            raise DecodeError("payload is not a request (no url)")
        return data

    def decode(self, payload: bytes) -> Request:
        data = self.decode_dict(payload)
        try:
            kwargs = {_SHORT[k]: v for k, v in data.items() if k in _SHORT}
            if "cls" in data:
                # only a class whose module is already imported: importing a module named
                # by a Redis writer could run its code
                if str(data["cls"]).rpartition(".")[0] not in sys.modules:
                    raise DecodeError(f"request class {data['cls']!r} is not loaded")
                cls = load_object(data["cls"])
                if not (isinstance(cls, type) and issubclass(cls, Request)):
                    raise DecodeError(f"{data['cls']!r} is not a Request class")
                kwargs["_class"] = data["cls"]
            return request_from_dict(kwargs, spider=self.spider)
        except DecodeError:
            raise
        except Exception as exc:
            raise DecodeError(f"invalid request: {type(exc).__name__}: {exc}") from None
