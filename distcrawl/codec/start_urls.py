"""Turning producer entries of ``<spider>:start_urls`` into requests, or into reasons.

Producers are people and scripts (``redis-cli lpush site:start_urls URL``), so every entry
is untrusted input: it is either a request or a reason that goes to the dead letters with
the raw entry. Nothing here raises for bad input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request

#: keys a JSON entry may carry, with the type each must have
JSON_FIELDS: dict[str, type | tuple[type, ...]] = {
    "url": str,
    "priority": int,
    "meta": dict,
    "method": str,
    "headers": dict,
    "body": str,
    "dont_filter": bool,
}


#: Request meta keys that Scrapy 2.19 or distcrawl act on. A producer setting one would steer
#: the workers (skip robots.txt, pick a proxy, escape the per-domain limits, ...), so an entry
#: may carry one only when DISTCRAWL_START_META_KEYS names it; any other key (the spider's
#: own, a third-party plugin's) passes. Each line says who reads the key.
RESERVED_META_KEYS: frozenset[str] = frozenset(
    {
        # where and how the request goes out
        "proxy",  # HttpProxyMiddleware, download handlers: the proxy to go through
        "_auth_proxy",  # HttpProxyMiddleware: which proxy Proxy-Authorization belongs to
        "_scheme_proxy",  # HttpProxyMiddleware: the proxy came from the environment
        "bindaddress",  # HTTP download handlers: local address to connect from
        "download_slot",  # Downloader, AutoThrottle, distcrawl.codec.politeness: per-domain limits
        "autothrottle_dont_adjust_delay",  # AutoThrottle: leave the slot delay alone
        "dont_obey_robotstxt",  # RobotsTxtMiddleware (Scrapy's and distcrawl.robots)
        "allow_offsite",  # OffsiteMiddleware: skip the allowed_domains check
        "site_scope",  # distcrawl.spiders.site: the domain whose links are followed
        "verbatim_url",  # Request, fingerprinting, download handlers: URL sent unescaped
        "http_user",  # HttpAuthMiddleware: Basic auth user
        "http_pass",  # HttpAuthMiddleware: Basic auth password
        "http_auth_domain",  # HttpAuthMiddleware: the domain the credentials go to
        "ftp_user",  # FTP download handler: login
        "ftp_password",  # FTP download handler: password
        "ftp_passive",  # FTP download handler: passive mode
        "ftp_local_filename",  # FTP download handler: writes the file to this local path
        "is_secure",  # S3 download handler: plain HTTP when False
        # what the downloader accepts
        "download_timeout",  # download handlers, DownloadTimeoutMiddleware
        "download_maxsize",  # download handlers: largest body
        "download_warnsize",  # download handlers: body size that is logged
        "download_fail_on_dataloss",  # download handlers: broken responses accepted
        "download_latency",  # set by the downloader; AutoThrottle, distcrawl.codec.politeness
        # retries
        "dont_retry",  # RetryMiddleware, distcrawl.retry
        "max_retry_times",  # RetryMiddleware, distcrawl.retry
        "retry_times",  # RetryMiddleware, distcrawl.retry, codec.deadletter: attempts so far
        "priority_adjust",  # RetryMiddleware, distcrawl.retry: priority of the retry
        "give_up_log_level",  # RetryMiddleware: log level when giving up
        "distcrawl_errors",  # distcrawl.retry, distcrawl.codec.deadletter: failure history
        "distcrawl_callback_failures",  # distcrawl.retry, codec.deadletter: callback errors
        "distcrawl_retry_delay",  # distcrawl.scheduler: when the retry becomes due
        # responses, redirects, cookies, cache
        "handle_httpstatus_all",  # HttpErrorMiddleware, RedirectMiddleware
        "handle_httpstatus_list",  # HttpErrorMiddleware, RedirectMiddleware
        "dont_redirect",  # RedirectMiddleware, MetaRefreshMiddleware
        "redirect_urls",  # RedirectMiddleware: chain so far
        "redirect_times",  # RedirectMiddleware: hops so far (REDIRECT_MAX_TIMES)
        "redirect_ttl",  # RedirectMiddleware: hops left
        "redirect_reasons",  # RedirectMiddleware: status of each hop
        "cookiejar",  # CookiesMiddleware: which jar
        "dont_merge_cookies",  # CookiesMiddleware
        "dont_cache",  # HttpCacheMiddleware
        "_dont_cache",  # HttpCacheMiddleware: response flagged uncacheable
        "cache_timestamp",  # HttpCacheMiddleware, cache storages
        "cached_response",  # HttpCacheMiddleware
        # the crawl graph
        "depth",  # DepthMiddleware (DEPTH_LIMIT, DEPTH_PRIORITY), depth stats
        "depth_reset",  # DepthMiddleware: start counting depth again
        "referrer_policy",  # RefererMiddleware: which Referer header is sent
        "is_start_request",  # StartSpiderMiddleware, Scrapy's scheduler priority
        "rule",  # CrawlSpider: which rule's callback handles the response
    }
)

#: keys beginning with this are distcrawl's, including ones added after this list
RESERVED_META_PREFIX = "distcrawl_"


def reserved_keys(data: dict[str, Any], allowed: Collection[str]) -> list[str]:
    """The fields of ``data`` that only DISTCRAWL_START_META_KEYS may let a producer set:
    reserved meta keys (as ``meta.KEY``) and a true ``dont_filter`` (as ``dont_filter``)."""
    meta = data.get("meta") or {}
    refused = [
        # a prefixed key is the producer's text: shown short and escaped (it goes into logs)
        f"meta.{key[:64].encode('unicode_escape').decode('ascii')}"
        for key in sorted(meta)
        if (key in RESERVED_META_KEYS or key.startswith(RESERVED_META_PREFIX))
        and key not in allowed
    ]
    if data.get("dont_filter") and "dont_filter" not in allowed:
        refused.insert(0, "dont_filter")
    return refused


#: a character for which ``str.isspace()`` is true: ``\s`` matches exactly those (checked over
#: every code point in tests/test_start_urls.py), in C rather than a generator per character
_SPACE = re.compile(r"\s")


class InvalidEntry(ValueError):
    """The entry cannot become a request; the message is the dead-letter reason."""


@dataclass(frozen=True)
class StartEntry:
    raw: bytes
    data: dict[str, Any]


def parse_entry(
    raw: bytes,
    *,
    max_bytes: int,
    schemes: tuple[str, ...],
    start_meta_keys: Collection[str] = (),
) -> StartEntry:
    """The entry as a dict of Request arguments (``url`` always present).

    Every way an entry becomes a request (the scheduler, ``distcrawl push``, whatever a
    spider's ``make_request_from_data`` does with ``data``) starts here, so the reserved meta
    keys are refused here, once; ``start_meta_keys`` is DISTCRAWL_START_META_KEYS.
    """
    if len(raw) > max_bytes:
        raise InvalidEntry(f"entry too large: {len(raw)} bytes (limit {max_bytes})")
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InvalidEntry("entry is not UTF-8 text") from None
    if not text:
        raise InvalidEntry("empty entry")
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidEntry(f"invalid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidEntry("JSON entry must be an object")
        unknown = sorted(set(data) - set(JSON_FIELDS))
        if unknown:
            raise InvalidEntry(f"unknown field(s) in JSON entry: {', '.join(unknown)}")
        if "url" not in data:
            raise InvalidEntry("JSON entry has no 'url'")
        for key, kind in JSON_FIELDS.items():
            value = data.get(key)
            if value is None:
                continue
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise InvalidEntry(f"JSON field {key!r} must be {getattr(kind, '__name__', kind)}")
        data = {k: v for k, v in data.items() if v is not None}
        refused = reserved_keys(data, start_meta_keys)
        if refused:
            raise InvalidEntry(
                f"reserved key(s) in JSON entry: {', '.join(refused)} (Scrapy or distcrawl act "
                "on them; a producer may set them only when DISTCRAWL_START_META_KEYS names them)"
            )
    else:
        data = {"url": text}
    data["url"] = validate_url(data["url"], schemes)
    return StartEntry(raw, data)


def validate_url(url: str, schemes: tuple[str, ...]) -> str:
    url = url.strip()
    if not url or _SPACE.search(url) is not None:
        raise InvalidEntry(f"not a URL: {url[:200]!r}")
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a bad port
    except ValueError as exc:
        raise InvalidEntry(f"malformed URL {url[:200]!r}: {exc}") from None
    if not parts.scheme:
        raise InvalidEntry(f"not a URL (no scheme): {url[:200]!r}")
    if parts.scheme.lower() not in schemes:
        raise InvalidEntry(f"unsupported scheme {parts.scheme!r} in {url[:200]!r}")
    if not parts.hostname:
        raise InvalidEntry(f"URL has no host: {url[:200]!r}")
    return url


def request_from_entry(data: dict[str, Any]) -> Request:
    """The default way an entry becomes a request (spiders may override
    ``make_request_from_data``)."""
    kwargs = dict(data)
    if "body" in kwargs:
        kwargs["body"] = kwargs["body"].encode("utf-8")
    try:
        return Request(**kwargs)
    except (TypeError, ValueError) as exc:
        raise InvalidEntry(f"cannot build a request: {exc}") from None
