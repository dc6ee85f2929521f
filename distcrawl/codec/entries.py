"""A producer's entries checked exactly as a worker checks a ``start_urls`` entry.

The worker's boundary is ``Intake.start_entry`` (distcrawl/engine/intake.py):
:func:`parse_entry` with the crawl's settings, then the spider's ``make_request_from_data``,
the scheme check, the fingerprint, the politeness slot and the codec. :class:`EntryMaker`
runs the same steps with the same settings in the producer's process, so that an entry a
worker would dead-letter is refused at the producer with the reason the dead letter would
carry, and one it would store is stored by the producer as the worker would have stored it.
Nothing here touches Redis.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from scrapy import Request, Spider
from scrapy.crawler import Crawler
from scrapy.dupefilters import BaseDupeFilter
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler, load_object

from distcrawl.codec.politeness import slot_for
from distcrawl.codec.serialize import (
    DecodeError,
    RequestCodec,
    SerializationError,
    callback_refusal,
)
from distcrawl.codec.start_urls import InvalidEntry, parse_entry, request_from_entry
from distcrawl.config import DistcrawlConfig
from distcrawl.dupefilter import FINGERPRINT_BYTES, get_fingerprint, url_only
from distcrawl.engine.batch import refused_scheme
from distcrawl.model.layout import Layout, class_path
from distcrawl.model.queue_entry import bad_slot
from distcrawl.model.records import Entry, EntryKind

if TYPE_CHECKING:
    from scrapy.utils.request import RequestFingerprinterProtocol
    from typing_extensions import Unpack

#: what push_many accepts per entry: the text of a start_urls entry (a URL or a JSON
#: object), its bytes, or its fields as a mapping (``callback`` included)
EntryLike = str | bytes | Mapping[str, Any]


class Refused(ValueError):
    """The entry cannot become a request; the message is the reason a worker's dead letter
    would give (or, for what only a producer can ask, such as a callback, its own)."""


class Made(NamedTuple):
    """An entry turned into what a commit stores (``entry``), and the URL it fetches (a
    tuple: one is made per pushed URL, at half a frozen dataclass's cost)."""

    url: str
    entry: Entry


def entry_bytes(item: EntryLike) -> tuple[bytes, str | None]:
    """The raw start_urls entry for ``item`` and the callback name it asks for.

    A mapping becomes the JSON object a producer would LPUSH; ``callback`` is taken out first,
    since an entry in ``start_urls`` cannot name one (it is a producer-only field)."""
    if isinstance(item, bytes):
        return item, None
    if isinstance(item, str):
        return item.encode("utf-8", "surrogatepass"), None
    if not isinstance(item, Mapping):
        raise Refused(f"an entry must be a str, bytes or a mapping, not {type(item).__name__}")
    fields = dict(item)
    callback = fields.pop("callback", None)
    if callback is not None and not isinstance(callback, str):
        raise Refused("'callback' must be the name of a spider method (str)")
    try:
        text = json.dumps(fields, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise Refused(f"entry is not JSON data: {exc}") from None
    return text.encode("utf-8", "surrogatepass"), callback


class EntryOptions(TypedDict, total=False):
    """The keyword-only fields of a pushed entry, declared once for :func:`fields_of` and
    ``Producer.push`` (which passes them through): a request's method, headers, body and
    ``dont_filter``."""

    method: str | None
    headers: Mapping[str, Any] | None
    body: str | None
    dont_filter: bool


def fields_of(
    url: Any,
    *,
    priority: int = 0,
    meta: Mapping[str, Any] | None = None,
    callback: str | None = None,
    **options: Unpack[EntryOptions],
) -> EntryLike:
    """``push()``'s arguments as an entry: a plain URL when only the URL is given (exactly
    what ``redis-cli lpush`` would send), else the JSON object's fields."""
    for name in options.keys() - EntryOptions.__optional_keys__:
        # what Python says of an unknown keyword, for callers not checked by mypy
        raise TypeError(f"unexpected keyword argument {name!r}")
    extra: dict[str, Any] = {
        "priority": priority or None,
        "meta": meta,
        "method": options.get("method"),
        "headers": options.get("headers"),
        "body": options.get("body"),
        "dont_filter": options.get("dont_filter") or None,
        "callback": callback,
    }
    extra = {k: v for k, v in extra.items() if v is not None}
    if not extra and isinstance(url, str) and not url.lstrip().startswith("{"):
        return url
    return {"url": url, **extra}


class EntryMaker:
    """Turns entries into commit entries with the spider's own hook, fingerprinter and codec.

    ``settings`` are the crawler's settings (the spider's ``custom_settings`` applied), so
    the spider is made as ``scrapy crawl`` makes it, without starting a crawl: its
    ``make_request_from_data`` may add meta or a callback, as it would on a worker."""

    def __init__(
        self,
        spidercls: type[Spider],
        settings: Settings,
        config: DistcrawlConfig,
        spider_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.crawler = Crawler(spidercls, settings)
        self.spider = spidercls.from_crawler(self.crawler, **dict(spider_kwargs or {}))
        cls = load_object(self.crawler.settings["REQUEST_FINGERPRINTER_CLASS"])
        self.fingerprinter: RequestFingerprinterProtocol = build_from_crawler(cls, self.crawler)
        #: a plain GET's fingerprint is get_fingerprint(url): Scrapy's fingerprinter as is
        self.url_only = url_only(self.fingerprinter)
        # as the scheduler's dupefilter_for (_scheduler/opening.py): only BaseDupeFilter turns
        # filtering off
        dupefilter = load_object(self.crawler.settings["DUPEFILTER_CLASS"])
        self.filtering = dupefilter is not BaseDupeFilter
        self.codec = RequestCodec(
            config.serializer, self.spider, allowed_callbacks=config.allowed_callbacks
        )

    def layout(self) -> Layout:
        """The layout this producer writes in (layout.py): a worker's, field for field; its
        DISTCRAWL_SHARDS tells which shard each request goes to, so a producer whose count
        is not the crawl's is refused."""
        return Layout(
            shards=self.config.shards,
            seen=self.config.seen,
            serializer=self.config.serializer,
            fingerprinter=class_path(self.fingerprinter),
        )

    def make(self, raw: bytes, callback: str | None = None, once: bytes | None = None) -> Made:
        """The commit entry for one raw entry; :class:`Refused` with the reason otherwise.

        Kind ``r`` with the fingerprint: Redis queues it only if it was never seen, so a
        push sent again (a retried task) stores nothing twice. Start URLs are not held at
        the per-slot cap (the producer's commits carry none), only at the pending cap.

        A request that has no fingerprint (``dont_filter``, or a crawl without a duplicate
        filter) is fetched each time it is pushed, as in Scrapy; ``once`` (push_key's)
        stands in for its fingerprint, so that the same push sent again (a retried task, a
        push_many re-run after an error) is not a second request while another push is."""
        config = self.config
        try:
            request = self.request_of(entry_data(raw, config))
            if callback is not None:
                request = request.replace(callback=self._callback(callback))
        except InvalidEntry as exc:
            raise Refused(str(exc)) from None
        except Refused:
            raise
        except Exception as exc:  # the spider's hook failing on one entry, as in the worker
            raise Refused(f"{type(exc).__name__}: {exc}") from None
        return self.made(request, once)

    def made(self, request: Request, once: bytes | None = None) -> Made:
        """The commit entry of a request: its fingerprint (unless it is not filtered), its
        download slot and its payload, as a worker computes them; :class:`Refused` if the
        slot or the payload cannot be stored."""
        try:
            fp = b""
            if self.filtering and not request.dont_filter:
                fp = self._fingerprint(request)[:FINGERPRINT_BYTES]
            elif once is not None:
                fp = once
            # slot_of's hostname, from urlsplit's cache (the hook most likely split this URL)
            # instead of a urlparse_cached entry that nothing in this process reads again
            slot = slot_for(request.url, request.meta, by_ip=self.config.slots_by_ip)
            why = bad_slot(slot)
            if why is not None:
                raise InvalidEntry(f"invalid download slot: {why}")
            payload = self.codec.encode(request)
        except (InvalidEntry, SerializationError) as exc:
            raise Refused(str(exc)) from None
        except Exception as exc:  # a fingerprinter of the project failing on one request
            raise Refused(f"{type(exc).__name__}: {exc}") from None
        return Made(request.url, Entry(EntryKind.REQUEST, fp, request.priority, payload, b"", slot))

    def make_from_dict(self, data: Any, once: bytes | None = None) -> Made:
        """The commit entry of a request dict of Scrapy's ``Request.to_dict`` (a scrapy-redis
        queue's): rebuilt by the worker's rules (:meth:`RequestCodec.from_scrapy_dict`),
        then :meth:`made`; :class:`Refused` with the reason otherwise."""
        try:
            request = self.codec.from_scrapy_dict(data)
        except DecodeError as exc:
            raise Refused(str(exc)) from None
        return self.made(request, once)

    def request_of(self, data: dict[str, Any]) -> Request:
        """The spider's request for an entry's validated ``data``, as a worker makes it of a
        start URL (its ``make_request_from_data``); InvalidEntry when it cannot be one."""
        return spider_request(self.spider, data, self.config.allowed_schemes)

    def _fingerprint(self, request: Request) -> bytes:
        """The fingerprinter's fingerprint; most entries are plain GETs, whose fingerprint
        get_fingerprint computes at half the cost when the fingerprinter is Scrapy's own."""
        if (
            self.url_only
            and request.method == "GET"
            and not request.body
            and not request.meta.get("verbatim_url")
        ):
            return get_fingerprint(request.url)
        return self.fingerprinter.fingerprint(request)

    def _callback(self, name: str) -> Any:
        """The spider's bound method ``name``, if a request read from Redis may name it."""
        why = callback_refusal(type(self.spider), name, self.config.allowed_callbacks)
        if why is not None:
            raise Refused(f"callback refused: {why}")
        return getattr(self.spider, name)


def entry_data(raw: bytes, config: DistcrawlConfig) -> dict[str, Any]:
    """The data of a ``start_urls`` entry, parsed with the crawl's settings (the worker's
    Intake and the producer alike); InvalidEntry when it is not a valid entry."""
    return parse_entry(
        raw,
        max_bytes=config.start_url_max_bytes,
        schemes=config.allowed_schemes,
        start_meta_keys=config.start_meta_keys,
    ).data


def spider_request(
    spider: Spider | None, data: dict[str, Any], schemes: tuple[str, ...]
) -> Request:
    """The spider's request for an entry's ``data`` (its ``make_request_from_data``, else a
    plain request), its scheme checked again: what the worker's Intake and the producer both
    make of a start URL; InvalidEntry when it cannot be one."""
    make = getattr(spider, "make_request_from_data", None)
    request = make(data) if callable(make) else request_from_entry(data)
    if not isinstance(request, Request):
        raise InvalidEntry(f"make_request_from_data returned {type(request).__name__}")
    why = refused_scheme(request.url, schemes)
    if why is not None:  # the spider's hook may have made another URL of the entry
        raise InvalidEntry(why)
    return request


def push_key(push_id: str, index: int, raw: bytes, callback: str | None) -> bytes:
    """The seen-set member that makes push ``push_id``'s ``index``-th entry idempotent when
    it has no fingerprint: a hash of all three (and the callback), in the fingerprints'
    size, so that the commit script's seen check drops the same push sent again (and only
    that: another push id, entry or position gives another member)."""
    digest = hashlib.sha1(b"distcrawl-push\0")  # SHA1 as the fingerprints: not for secrecy
    for part in (push_id.encode("utf-8", "surrogatepass"), str(index).encode(), raw):
        digest.update(len(part).to_bytes(8, "big") + part)
    digest.update((callback or "").encode("utf-8", "surrogatepass"))
    return digest.digest()[:FINGERPRINT_BYTES]


def check_raw(raw: bytes, config: DistcrawlConfig) -> str:
    """The URL of an entry valid for ``start_urls`` (parse_entry with the crawl's settings);
    :class:`Refused` otherwise. The spider's hook runs later, on the worker."""
    try:
        data = entry_data(raw, config)
        # what request_from_entry would refuse (a bad method, say) would be a dead letter too
        request_from_entry(data)
    except InvalidEntry as exc:
        raise Refused(str(exc)) from None
    return str(data["url"])
