"""Revisits, the worker's side (DISTCRAWL_RECRAWL_*): conditional requests, judging what a
fetch found, and storing the page's next revisit.

Two middlewares, one per chain, both off unless ``DISTCRAWL_RECRAWL_INTERVAL`` is set:

- :class:`RecrawlMiddleware` (DOWNLOADER_MIDDLEWARES, on the engine side of the retry and
  redirect middlewares, so that it judges the answer a fetch ended with): it sends the
  validators a page answered with last time (``If-None-Match``, ``If-Modified-Since``),
  judges the answer (changed, unchanged, gone, error) by its status and a signature of the
  page's text, and has the scheduler store the page's next revisit, with its adapted interval
  and validators in the revisit request's meta. The revisit is committed no later than the
  acknowledgement of the fetch, so a worker killed in between loses neither.
- :class:`RecrawlSpiderMiddleware` (SPIDER_MIDDLEWARES): a 304 skips the callback, the items of
  a page whose text did not change are not emitted again (its links still are), and, when the
  MongoDB pipeline is on, each fetch yields one :class:`~distcrawl.items.PageFetch` for the
  page document's change-tracking fields.

The state a page carries from fetch to fetch travels in its revisit request, so the frontier
holds nothing more than the request; it comes back from Redis, so it is checked here
(:meth:`RevisitState.from_meta`) before anything uses it.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from itemadapter import ItemAdapter
from lxml import etree
from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse, Response
from scrapy.spidermiddlewares.httperror import HttpError
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object

from distcrawl.config import DistcrawlConfig
from distcrawl.config.recrawl import Outcome, RecrawlSettings, next_fetch
from distcrawl.items import PageFetch
from distcrawl.retry import CALLBACK_FAILURES_META, ERRORS_META
from distcrawl.scheduler import scheduler_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: meta key of the state a page's revisit request carries (RevisitState)
STATE_META = "distcrawl_recrawl"
#: meta key of what this fetch found, for the spider middleware (a plain dict: a callback
#: that copies its response's meta into new requests must still be able to store them)
FETCH_META = "distcrawl_fetch"
#: meta key set to the validator headers this middleware added, taken off the next revisit
CONDITIONAL_META = "distcrawl_conditional"
#: a request's own first interval (seconds), and the key that keeps it from revisits
RECRAWL_AFTER_META = "recrawl_after"
DONT_RECRAWL_META = "dont_recrawl"
#: meta a revisit does not inherit from the fetch before it: its retries, redirects, errors
TRANSIENT_META = frozenset(
    {
        "retry_times",
        "redirect_times",
        "redirect_ttl",
        "redirect_urls",
        "redirect_reasons",
        "download_latency",
        ERRORS_META,
        CALLBACK_FAILURES_META,
        FETCH_META,
        CONDITIONAL_META,
    }
)
#: the text a signature is made of: scripts and styles never count
TEXT_XPATH = "//body//text()[not(ancestor::script) and not(ancestor::style)]"
#: validators longer than this are not kept (a header is not a payload)
MAX_VALIDATOR = 512
SIGNATURE_HEX = 32


@dataclass(frozen=True)
class RevisitState:
    """What a page carries from one fetch to the next, in its revisit request."""

    #: the URL it is the state of: a callback copying its response's meta into the requests
    #: it makes must not hand them this page's validators
    url: str
    interval: float
    etag: str | None = None
    last_modified: str | None = None
    signature: str | None = None

    def to_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"url": self.url, "interval": self.interval}
        for name in ("etag", "last_modified", "signature"):
            value = getattr(self, name)
            if value is not None:
                meta[name] = value
        return meta

    @classmethod
    def from_meta(cls, value: Any) -> RevisitState:
        """The state in a request read from Redis; ValueError says what is wrong with it."""
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping, got {type(value).__name__}")
        unknown = set(value) - {"url", "interval", "etag", "last_modified", "signature"}
        if unknown:
            raise ValueError(f"unknown fields {sorted(map(str, unknown))}")
        url, interval = value.get("url"), value.get("interval")
        if not isinstance(url, str):
            raise ValueError("no url")
        if isinstance(interval, bool) or not isinstance(interval, int | float):
            raise ValueError("no interval")
        if not (interval > 0 and math.isfinite(interval)):
            raise ValueError(f"interval {interval!r} is not a positive number")
        texts = {}
        for name in ("etag", "last_modified", "signature"):
            text = value.get(name)
            if text is not None and not (
                isinstance(text, str) and 0 < len(text) <= MAX_VALIDATOR and text.isprintable()
            ):
                raise ValueError(f"{name} is not a short printable string")
            texts[name] = text
        signature = texts["signature"]
        if signature is not None and (
            len(signature) != SIGNATURE_HEX or any(c not in "0123456789abcdef" for c in signature)
        ):
            raise ValueError("signature is not 32 hex digits")
        return cls(url, float(interval), texts["etag"], texts["last_modified"], signature)


def _drop(node: Any) -> None:
    """Take an element out of its tree, keeping the text that follows it."""
    parent = node.getparent()
    if parent is None:
        return
    if node.tail:
        before = node.getprevious()
        if before is not None:
            before.tail = (before.tail or "") + node.tail
        else:
            parent.text = (parent.text or "") + node.tail
    parent.remove(node)


def content_signature(response: Response, exclude: tuple[str, ...] = ()) -> str:
    """A signature of what a page says: its visible text (HTML), or its body. ``exclude``:
    XPath expressions whose text does not count (an advert, a clock)."""
    data = response.body
    if isinstance(response, HtmlResponse):
        root = response.selector.root
        if exclude:
            # a copy: the callback parses the page as it came
            root = copy.deepcopy(root)
            for expression in exclude:
                for node in root.xpath(expression):
                    if isinstance(node, etree._Element):
                        _drop(node)
        texts = [str(t).strip() for t in root.xpath(TEXT_XPATH)]
        data = " ".join(t for t in texts if t).encode("utf-8")
    return _digest(data)


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=SIGNATURE_HEX // 2).hexdigest()


def judge(status: int, state: RevisitState | None, signature: str | None) -> Outcome:
    """What a fetch found, by its status and (for a 2xx) its signature against the last."""
    if status == 304:
        return Outcome.UNCHANGED if state is not None else Outcome.ERROR
    if status in (404, 410):
        return Outcome.GONE
    if 200 <= status < 300:
        if state is not None and state.signature is not None and state.signature == signature:
            return Outcome.UNCHANGED
        return Outcome.CHANGED
    return Outcome.ERROR


def _header(response: Response, name: bytes) -> str | None:
    raw = response.headers.get(name)
    if not raw:
        return None
    text = raw.decode("latin-1").strip()
    return text if 0 < len(text) <= MAX_VALIDATOR and text.isprintable() else None


class RecrawlMiddleware:
    """Sends a page's validators on its revisits, judges what each fetch found and stores
    the page's next revisit (see the module docstring)."""

    def __init__(self, crawler: Crawler, settings: RecrawlSettings) -> None:
        self.crawler = crawler
        self.settings = settings
        self.stats = crawler.stats

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RecrawlMiddleware:
        recrawl = DistcrawlConfig.from_settings(crawler.settings).recrawl
        if recrawl is None:
            raise NotConfigured("DISTCRAWL_RECRAWL_INTERVAL is not set")
        return cls(crawler, recrawl)

    def process_request(self, request: Request) -> None:
        if request.meta.get(DONT_RECRAWL_META):
            return
        state = self._state(request)
        if state is None:
            return
        added = []
        validators = ((b"If-None-Match", state.etag), (b"If-Modified-Since", state.last_modified))
        for header, value in validators:
            if value is not None and header not in request.headers:
                request.headers[header] = value
                added.append(header.decode())
        if added:
            request.meta[CONDITIONAL_META] = added

    def process_response(self, request: Request, response: Response) -> Response:
        scheduler = scheduler_of(self.crawler)
        if request.meta.get(DONT_RECRAWL_META) or scheduler is None:
            return response
        if not scheduler.leased(request):
            return response  # robots.txt, or a download some component made itself
        state = self._state(request)
        signature = None
        if 200 <= response.status < 300:
            signature = self._signature(response)
        outcome = judge(response.status, state, signature)
        self._inc(f"distcrawl/recrawl/{outcome.value}")
        if response.status == 304 and state is not None:
            self._inc("distcrawl/recrawl/not_modified")
        request.meta[FETCH_META] = {
            "url": request.url,
            "outcome": outcome.value,
            "first": state is None,
            "signature": signature,
            "status": response.status,
        }
        if state is None:
            interval = self._first_interval(request)
            if interval is None:
                return response  # never revisited: nothing to store
            delay: float | None = interval
            if outcome is Outcome.GONE:
                delay = self.settings.policy.gone_interval
            elif outcome is Outcome.ERROR:
                delay = self.settings.policy.error_interval
        else:
            step = next_fetch(self.settings.policy, state.interval, outcome)
            interval, delay = step.interval, step.delay
        unchanged = response.status == 304 and state is not None
        new_state = RevisitState(
            request.url,
            interval,
            etag=_header(response, b"ETag") or (state.etag if unchanged and state else None),
            last_modified=_header(response, b"Last-Modified")
            or (state.last_modified if unchanged and state else None),
            signature=signature or (state.signature if state is not None else None),
        )
        scheduler.revisit(self._revisit_request(request, new_state), delay)
        return response

    def _signature(self, response: Response) -> str:
        try:
            return content_signature(response, self.settings.signature_exclude)
        except Exception as exc:  # a page lxml cannot take: its bytes still tell a change
            logger.warning(
                "%s: content signature of its text failed (%s: %s); its body's is used",
                response,
                type(exc).__name__,
                exc,
            )
            self._inc("distcrawl/recrawl/signature_failed")
            return _digest(response.body)

    def process_exception(self, request: Request, exception: Exception) -> None:
        """A fetch that failed (after its retries): tried again after the error interval,
        its own interval kept."""
        scheduler = scheduler_of(self.crawler)
        if request.meta.get(DONT_RECRAWL_META) or scheduler is None:
            return
        if not scheduler.leased(request):
            return
        state = self._state(request)
        interval = state.interval if state is not None else self._first_interval(request)
        if interval is None:
            return
        self._inc("distcrawl/recrawl/error")
        kept = state or RevisitState(request.url, interval)
        scheduler.revisit(self._revisit_request(request, kept), self.settings.policy.error_interval)

    def _first_interval(self, request: Request) -> float | None:
        """A page's first interval: its ``recrawl_after``, else its domain's, else the
        crawl's; None: never revisited."""
        own = request.meta.get(RECRAWL_AFTER_META)
        if own is not None:
            if isinstance(own, int | float) and not isinstance(own, bool) and own > 0:
                policy = self.settings.policy
                return min(max(float(own), policy.min_interval), policy.max_interval)
            logger.warning(
                "%s: meta[%r]=%r is not a positive number of seconds; the crawl's interval applies",
                request,
                RECRAWL_AFTER_META,
                own,
            )
        return self.settings.first_interval(urlsplit(request.url).hostname or "")

    def _state(self, request: Request) -> RevisitState | None:
        raw = request.meta.get(STATE_META)
        if raw is None:
            return None
        try:
            state = RevisitState.from_meta(raw)
        except ValueError as exc:
            logger.warning(
                "%s: invalid meta[%r] (%s); fetched as a first visit", request, STATE_META, exc
            )
            self._inc("distcrawl/recrawl/bad_state")
            del request.meta[STATE_META]  # said once, and not stored again
            return None
        # the state of another page, copied by a callback into a request it made
        return state if state.url == request.url else None

    def _revisit_request(self, request: Request, state: RevisitState) -> Request:
        """The request that fetches the page again: its own meta and headers, not what this
        fetch added to them (retries, redirects, the validators sent)."""
        meta = {k: v for k, v in request.meta.items() if k not in TRANSIENT_META}
        meta[STATE_META] = state.to_meta()
        headers = request.headers.copy()
        for name in request.meta.get(CONDITIONAL_META) or ():
            headers.pop(name.encode(), None)
        # dont_filter: the page, and where it redirects to, were seen; fetched anyway
        return request.replace(meta=meta, headers=headers, dont_filter=True)

    def _inc(self, key: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(key)


def _finding(response: Response) -> dict[str, Any] | None:
    finding = response.meta.get(FETCH_META) if response.request is not None else None
    if isinstance(finding, dict) and finding.get("url") == response.url:
        return finding
    return None


class RecrawlSpiderMiddleware:
    """A 304 skips the callback; an unchanged page's items are not emitted again; with the
    MongoDB pipeline on, each fetch gives one PageFetch (see the module docstring)."""

    def __init__(self, crawler: Crawler, track: bool) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        #: whether to yield PageFetch items: only for the MongoDB pipeline, which reads them
        self.track = track

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RecrawlSpiderMiddleware:
        if DistcrawlConfig.from_settings(crawler.settings).recrawl is None:
            raise NotConfigured("DISTCRAWL_RECRAWL_INTERVAL is not set")
        pipelines = build_component_list(crawler.settings.getwithbase("ITEM_PIPELINES"))
        from distcrawl.pipelines import MongoPipeline  # pymongo: only when recrawl is on

        mongo = MongoPipeline
        track = any(load_object(p) is mongo for p in pipelines)
        return cls(crawler, track)

    def _fetch(self, response: Response, finding: dict[str, Any]) -> PageFetch:
        return PageFetch(
            url=response.url,
            fetched_at=time.time(),
            status=int(finding["status"]),
            changed=finding["outcome"] == Outcome.CHANGED.value,
            first=bool(finding["first"]),
            signature=finding.get("signature"),
        )

    def _keep(self, finding: dict[str, Any] | None, thing: Any) -> bool:
        """Whether the callback's output ``thing`` goes on: not an unchanged page's item."""
        if finding is None or finding["outcome"] != Outcome.UNCHANGED.value:
            return True
        if isinstance(thing, Request) or not ItemAdapter.is_item(thing):
            return True
        if self.stats is not None:
            self.stats.inc_value("distcrawl/recrawl/items_unchanged")
        return False

    def _tail(self, response: Response, finding: dict[str, Any] | None) -> list[PageFetch]:
        if (
            finding is None
            or not self.track
            or finding["outcome"]
            not in (
                Outcome.CHANGED.value,
                Outcome.UNCHANGED.value,
            )
        ):
            return []
        return [self._fetch(response, finding)]

    def process_spider_output(self, response: Response, result: Iterable[Any]) -> Iterator[Any]:
        finding = _finding(response)
        for thing in result:
            if self._keep(finding, thing):
                yield thing
        yield from self._tail(response, finding)

    async def process_spider_output_async(
        self, response: Response, result: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        finding = _finding(response)
        async for thing in result:
            if self._keep(finding, thing):
                yield thing
        for fetch in self._tail(response, finding):
            yield fetch

    def process_spider_exception(
        self, response: Response, exception: Exception
    ) -> Iterable[Any] | None:
        """A 304 to a revisit: nothing to parse, the page is unchanged (handled here, before
        HttpErrorMiddleware would log it as an ignored response)."""
        finding = _finding(response)
        if not isinstance(exception, HttpError) or response.status != 304 or finding is None:
            return None
        return self._tail(response, finding)
