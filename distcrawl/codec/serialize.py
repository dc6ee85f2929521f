"""Requests as data, never as code.

A payload is one format byte followed by the encoded request: ``m`` msgpack (default),
``j`` JSON, ``p`` pickle. The format byte lets a worker refuse a pickled payload it was not
told to trust: anyone who can write to Redis could otherwise run code in every worker.
Defaults are left out of the payload (a plain GET costs its URL and a few bytes).

A callback or errback is stored by name, and a name read back must be a callback of the
spider (:func:`callback_refusal`): anyone who can write to Redis could otherwise call any
method of the spider, ``__init__`` included, with arguments of their choosing.
"""

from __future__ import annotations

import base64
import inspect
import json
import logging
import pickle
import sys
from typing import Any

import msgpack
from scrapy import Request, Spider
from scrapy.spiders import CrawlSpider
from scrapy.utils.misc import load_object

logger = logging.getLogger(__name__)

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
#: short key of the other ``Request.attributes`` of a Request subclass (``{name: value}``),
#: e.g. JsonRequest's ``dumps_kwargs``
_EXTRA = "a"

#: Methods that Scrapy's own spiders name as a request's callback or errback, so they are
#: callbacks although Scrapy defines them: ``parse`` (the default callback, which a spider
#: overrides), CrawlSpider's ``_callback`` and ``_errback`` (every request a Rule follows: they
#: hand the response to the rule's own callback), ``parse_start_url`` (CrawlSpider's documented
#: callback for start responses) and SitemapSpider's ``_parse_sitemap``. Every other method
#: of Scrapy's spider classes and of distcrawl's RedisMixin is API that Scrapy or distcrawl
#: calls with other arguments (``start``, ``from_crawler``, ``parse_with_rules``,
#: ``process_results``, ``make_request_from_data``...), never a callback.
SCRAPY_CALLBACKS = frozenset(
    {"parse", "parse_start_url", "_callback", "_errback", "_parse_sitemap"}
)
#: Lifecycle names refused even where no Scrapy class defines them: ``closed`` is looked up
#: by name when the spider closes, the others are (or were, in older Scrapy) API.
LIFECYCLE = frozenset(
    {
        "start",
        "start_requests",
        "closed",
        "close",
        "from_crawler",
        "from_settings",
        "update_settings",
        "handles_request",
        "log",
        "logger",
        "set_crawler",
        "_set_crawler",
        "make_requests_from_url",
        "make_request_from_data",
    }
)


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


_MISSING = object()


def _framework_class(cls: type) -> bool:
    """Scrapy's spider classes and distcrawl's spider bases: what they define is API."""
    module = cls.__module__
    return module in ("builtins", "distcrawl.spiders") or module.split(".")[0] == "scrapy"


def callback_refusal(
    spider_cls: type, name: Any, allowed: tuple[str, ...] | None = None
) -> str | None:
    """Why ``name`` cannot be a callback of ``spider_cls``, or None if it can.

    A callback is a plain function (``def`` or ``async def``) on the spider class: the
    spider's own public methods, and the few that Scrapy's spiders use as callbacks
    (:data:`SCRAPY_CALLBACKS`). ``allowed`` (DISTCRAWL_ALLOWED_CALLBACKS) narrows that further.
    """
    if not isinstance(name, str) or not name.isidentifier():
        return f"{_shown(name)} is not a method name"
    if name.startswith("__"):
        return f"{name!r} is a special method, never a callback"
    if name in LIFECYCLE:
        return f"{name!r} is part of the spider's lifecycle, not a callback"
    func = inspect.getattr_static(spider_cls, name, _MISSING)
    if func is _MISSING:
        return f"the spider has no method {name!r}"
    if not inspect.isfunction(func):
        return f"{name!r} is not a method defined on the spider class"
    defined_by_scrapy = any(_framework_class(c) and name in vars(c) for c in spider_cls.__mro__)
    if name not in SCRAPY_CALLBACKS or not defined_by_scrapy:
        if name.startswith("_"):
            return f"{name!r} is a private method, never a callback"
        if defined_by_scrapy:
            return f"{name!r} is part of Scrapy's spider API, not a callback"
    if allowed is not None and name not in allowed:
        return f"{name!r} is not in DISTCRAWL_ALLOWED_CALLBACKS"
    return None


def _shown(value: Any) -> str:
    """A value read from Redis, quoted and cut short for a log line or a dead letter."""
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


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
    """Encodes requests for the shared queue and decodes them for this spider.

    ``allowed_callbacks`` (DISTCRAWL_ALLOWED_CALLBACKS) narrows the callbacks a request may
    name; None leaves every callback of the spider (see :func:`callback_refusal`).
    """

    def __init__(
        self,
        serializer: str = "msgpack",
        spider: Spider | None = None,
        allowed_callbacks: tuple[str, ...] | None = None,
    ) -> None:
        if serializer not in _FORMATS:
            raise ValueError(f"unknown serializer {serializer!r}")
        self.format = _FORMATS[serializer]
        self.allow_pickle = serializer == "pickle"
        self.spider = spider
        self.allowed_callbacks = allowed_callbacks
        # name -> function of the spider class, computed once: a decode is a dict lookup
        self._callbacks: dict[str, Any] = {}
        self._signatures: dict[str, inspect.Signature | None] = {}
        self._defaults: dict[type, dict[str, Any]] = {}
        if spider is not None:
            cls = type(spider)
            for name in dir(cls):
                if callback_refusal(cls, name, allowed_callbacks) is None:
                    self._callbacks[name] = inspect.getattr_static(cls, name)
            self._check_allowed(cls)

    def _check_allowed(self, cls: type) -> None:
        """Warn once about a DISTCRAWL_ALLOWED_CALLBACKS that refuses the spider's own work."""
        if self.allowed_callbacks is None:
            return
        for name in self.allowed_callbacks:
            why = callback_refusal(cls, name)
            if why is not None:
                logger.warning(
                    "DISTCRAWL_ALLOWED_CALLBACKS lists %r, which is refused: %s", name, why
                )
        if issubclass(cls, CrawlSpider) and cls.rules:
            missing = [n for n in ("_callback", "_errback") if n not in self.allowed_callbacks]
            if missing:
                logger.warning(
                    "DISTCRAWL_ALLOWED_CALLBACKS lacks %s: the requests that the rules of %s "
                    "follow name CrawlSpider's _callback and _errback, and will be refused",
                    ", ".join(missing),
                    cls.__name__,
                )

    def _stored_name(self, func: Any, what: str) -> str | None:
        name = _method_name(self.spider, func, what)
        if name is not None and self.spider is not None and name not in self._callbacks:
            why = callback_refusal(type(self.spider), name, self.allowed_callbacks)
            raise SerializationError(f"{what} refused ({why}): workers would not call it")
        return name

    def to_dict(self, request: Request) -> dict[str, Any]:
        out: dict[str, Any] = {}
        value: Any
        for attr, (short, default) in _FIELDS.items():
            if attr == "callback":
                value = self._stored_name(request.callback, "callback")
            elif attr == "errback":
                value = self._stored_name(request.errback, "errback")
            elif attr == "headers":
                # pairs, not a dict: JSON has no bytes keys; Headers.items() costs ~4 us
                # even when empty, as most requests' headers are
                headers = request.headers
                value = [[k, list(v)] for k, v in headers.items()] if headers else []
            else:
                value = getattr(request, attr)
            if value != default:
                out[short] = value
        cls = type(request)
        if cls is not Request:
            out["cls"] = f"{cls.__module__}.{cls.__qualname__}"
            extra = self._extra_attributes(request)
            if extra:
                out[_EXTRA] = extra
        return out

    def _extra_attributes(self, request: Request) -> dict[str, Any]:
        """The class's other ``Request.attributes`` (as Scrapy's ``Request.to_dict`` keeps
        them), those that differ from what the class sets by default."""
        cls = type(request)
        names = [a for a in cls.attributes if a not in _FIELDS]
        if not names:
            return {}
        if cls not in self._defaults:
            try:
                probe = cls("http://default.invalid/")
                self._defaults[cls] = {a: getattr(probe, a) for a in names}
            except Exception:  # a class that needs more arguments: keep every value
                self._defaults[cls] = {}
        defaults = self._defaults[cls]
        out: dict[str, Any] = {}
        for attr in names:
            value = getattr(request, attr)
            if attr not in defaults or value != defaults[attr]:
                out[attr] = value
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
                packed: bytes = msgpack.packb(data, use_bin_type=True)  # msgpack has no types
                return MSGPACK + packed
            if self.format == JSON:
                text = json.dumps(data, default=_json_default, separators=(",", ":"))
                return JSON + text.encode()
            return PICKLE + pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
        except (TypeError, ValueError, OverflowError, pickle.PicklingError) as exc:
            raise SerializationError(
                f"{exc} (meta, cb_kwargs, cookies and the attributes of a Request subclass "
                "must hold plain data: str, bytes, numbers, bools, None, lists and dicts)"
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
                data = pickle.loads(body)  # noqa: S301  # opted in by DISTCRAWL_SERIALIZER='pickle'
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
            cls = self._request_class(data.get("cls"))
            if _EXTRA in data:
                kwargs.update(self._decode_extra(cls, data[_EXTRA]))
            callback = kwargs.get("callback")
            if callback is not None:
                kwargs["callback"] = self._resolve(callback, "callback")
            if kwargs.get("errback") is not None:
                kwargs["errback"] = self._resolve(kwargs["errback"], "errback")
            if kwargs.get("cb_kwargs"):
                self._check_cb_kwargs(callback, kwargs["cb_kwargs"])
            return cls(**kwargs)
        except DecodeError:
            raise
        except Exception as exc:
            raise DecodeError(f"invalid request: {type(exc).__name__}: {exc}") from None

    def from_scrapy_dict(self, data: Any) -> Request:
        """A request from a dict of Scrapy's ``Request.to_dict`` (what scrapy-redis queues),
        rebuilt by :meth:`decode`'s rules, so exactly as a worker would rebuild it.

        Not ``scrapy.utils.request.request_from_dict``: that imports whatever module the
        dict's ``_class`` names and calls any method of the spider named as a callback, and
        the dict comes from Redis. Here the callback and errback must pass
        :func:`callback_refusal` (DISTCRAWL_ALLOWED_CALLBACKS included), the class must be a
        loaded Request class, and the cb_kwargs must fit the callback; else
        :class:`DecodeError` with the reason."""
        if not isinstance(data, dict) or not isinstance(data.get("url"), str):
            raise DecodeError(f"not a request dict (no url): {_shown(data)}")
        short: dict[str, Any] = {}
        for attr, (key, _) in _FIELDS.items():
            if data.get(attr) is None:
                continue
            value = data[attr]
            if attr == "headers":
                if not isinstance(value, dict):
                    raise DecodeError(f"headers are not a map: {_shown(value)}")
                value = [[k, v if isinstance(v, list) else [v]] for k, v in value.items()]
            short[key] = value
        name = data.get("_class")
        if name is not None:
            cls = self._request_class(name)
            short["cls"] = name
            extra = {a: data[a] for a in cls.attributes if a not in _FIELDS and a in data}
            if extra:
                short[_EXTRA] = extra
        try:
            payload = self.encode_dict(short)
        except SerializationError as exc:
            raise DecodeError(str(exc)) from None
        return self.decode(payload)

    @staticmethod
    def _request_class(name: Any) -> type[Request]:
        if name is None:
            return Request
        # only a class whose module is already imported: importing a module named by a
        # Redis writer could run its code
        if str(name).rpartition(".")[0] not in sys.modules:
            raise DecodeError(f"request class {_shown(name)} is not loaded")
        cls = load_object(str(name))
        if not (isinstance(cls, type) and issubclass(cls, Request)):
            raise DecodeError(f"{_shown(name)} is not a Request class")
        return cls

    @staticmethod
    def _decode_extra(request_class: type[Request], extra: Any) -> dict[str, Any]:
        """Only the attributes the class declares beyond the fields stored under their own
        keys: a callback cannot come in this way."""
        if not isinstance(extra, dict):
            raise DecodeError(f"request attributes are not a map: {_shown(extra)}")
        for attr in extra:
            if attr in _FIELDS or attr not in request_class.attributes:
                name = request_class.__name__
                raise DecodeError(f"{name} has no attribute {_shown(attr)} to set")
        return extra

    def _resolve(self, name: Any, what: str) -> Any:
        """The bound method for a callback name read from Redis, if it is a callback."""
        if self.spider is None:
            raise DecodeError(f"{what} {_shown(name)} cannot be resolved without a spider")
        func = self._callbacks.get(name) if isinstance(name, str) else None
        if func is None:
            why = callback_refusal(type(self.spider), name, self.allowed_callbacks)
            raise DecodeError(f"{what} refused: {why or 'not a callback'}")
        bound = getattr(self.spider, name, None)
        # an attribute of the instance hides the method of the class
        if getattr(bound, "__self__", None) is not self.spider or (
            getattr(bound, "__func__", None) is not func
        ):
            raise DecodeError(f"{what} refused: the spider's {name!r} is no longer its method")
        return bound

    def _check_cb_kwargs(self, callback: Any, cb_kwargs: Any) -> None:
        """cb_kwargs become keyword arguments of the callback: a set the callback cannot take
        would fail on every attempt, so it is refused here, with the reason."""
        if not isinstance(cb_kwargs, dict) or not all(isinstance(k, str) for k in cb_kwargs):
            raise DecodeError(f"cb_kwargs are not a map of names: {_shown(cb_kwargs)}")
        if not isinstance(callback, str):
            return  # the default callback (parse, or parse_start_url) takes **kwargs
        if callback not in self._signatures:
            try:
                # the wrapper's own parameters: a decorator may take arguments of its own
                method = getattr(self.spider, callback)
                self._signatures[callback] = inspect.signature(method, follow_wrapped=False)
            except (TypeError, ValueError):
                self._signatures[callback] = None
        signature = self._signatures[callback]
        if signature is None:
            return
        try:
            signature.bind(None, **cb_kwargs)  # None stands for the response
        except TypeError as exc:
            raise DecodeError(f"cb_kwargs do not fit callback {callback!r}: {exc}") from None


def shrink_payload(payload: bytes, limit: int) -> tuple[bytes, list[str]] | None:
    """The same request in at most ``limit`` bytes, for a dead-letter record that cannot
    hold it whole, and the names of what it leaves out: the largest of its body, headers,
    cookies, cb_kwargs, extra attributes and single meta values go first, until it fits.
    Its URL, method, priority, callback and small meta (the site spider's ``site_scope``)
    stay, so that re-driving it makes the request the spider would have made, not a bare
    GET of the URL. None for a pickle (not decoded here) or what does not fit even so."""
    fmt = payload[:1]
    if fmt not in (MSGPACK, JSON):
        return None
    codec = RequestCodec("msgpack" if fmt == MSGPACK else "json")
    try:
        data = codec.decode_dict(payload)
        # (size, field, meta key or None), what can go
        parts = [(len(codec.encode_dict({f: data[f]})), f, None) for f in "bhcka" if f in data]
        meta = data.get("M") or {}
        parts += [(len(codec.encode_dict({"M": {k: v}})), "M", k) for k, v in meta.items()]
        out = codec.encode_dict(data)
    except (DecodeError, SerializationError):
        return None
    dropped: list[str] = []
    for _, name, key in sorted(parts, key=lambda part: -part[0]):
        if len(out) <= limit:
            break
        if key is None:
            del data[name]
            dropped.append(_SHORT.get(name, "attributes"))
        else:
            del meta[key]
            dropped.append(f"meta.{key}")
            if not meta:
                del data["M"]
        out = codec.encode_dict(data)
    return (out, dropped) if len(out) <= limit else None
