"""``scrapy crawl site``: a generic crawler for whatever sites are pushed to its queue.

Each start URL defines its own scope (its host and subdomains), carried in the meta of every
request that descends from it, so one cluster can crawl many sites at once without any
shared allow-list. ``-a allowed_domains=a.com,b.org`` replaces that scope with a fixed list.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.http import Response, TextResponse
from scrapy.linkextractors import LinkExtractor

from distcrawl.items import PageItem
from distcrawl.spiders import RedisSpider

SCOPE_META = "site_scope"
TEXT_LIMIT = 20_000


def in_scope(url: str, domains: list[str]) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return any(host == d or host.endswith("." + d) for d in domains)


class SiteSpider(RedisSpider):
    name = "site"
    # polite by default, whatever the project says; `-s ROBOTSTXT_OBEY=False` still wins
    custom_settings = {
        "ROBOTSTXT_OBEY": True,
        # its only callback: a request read from Redis cannot name page_item (or anything
        # else public) to make items of its choosing
        "DISTCRAWL_ALLOWED_CALLBACKS": ["parse"],
    }

    def __init__(
        self, *args: Any, allowed_domains: str | list[str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(allowed_domains, str):
            allowed_domains = [d.strip().lower() for d in allowed_domains.split(",") if d.strip()]
        if allowed_domains:
            self.allowed_domains = list(allowed_domains)
        self.link_extractor = LinkExtractor()

    def make_request_from_data(self, data: dict[str, Any]) -> Request:
        request = super().make_request_from_data(data)
        if not getattr(self, "allowed_domains", None) and SCOPE_META not in request.meta:
            host = (urlsplit(request.url).hostname or "").lower()
            request.meta[SCOPE_META] = host
        return request

    def _scope(self, response: Response) -> list[str]:
        fixed = getattr(self, "allowed_domains", None)
        if fixed:
            return list(fixed)
        scope = response.meta.get(SCOPE_META) or urlsplit(response.url).hostname or ""
        return [scope]

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        content_type = (response.headers.get(b"Content-Type") or b"").decode("latin-1").lower()
        if not isinstance(response, TextResponse) or "html" not in content_type:
            if self.crawler.stats is not None:
                self.crawler.stats.inc_value("site/non_html")
            return
        scope = self._scope(response)
        links = [
            link.url
            for link in self.link_extractor.extract_links(response)
            if in_scope(link.url, scope)
        ]
        yield self.page_item(response, links)
        meta = {SCOPE_META: scope[0]} if SCOPE_META in response.meta else {}
        for url in dict.fromkeys(links):
            yield Request(url, callback=self.parse, meta=dict(meta))

    def page_item(self, response: TextResponse, links: list[str]) -> PageItem:
        text = " ".join(
            t.strip()
            for t in response.xpath(
                "//body//text()[not(ancestor::script) and not(ancestor::style)]"
            ).getall()
            if t.strip()
        )
        return PageItem(
            url=response.url,
            status=response.status,
            title=(response.xpath("//title/text()").get() or "").strip() or None,
            description=response.xpath("//meta[@name='description']/@content").get(),
            text=text[:TEXT_LIMIT],
            links=links,
            depth=int(response.meta.get("depth", 0)),
            fetched_at=time.time(),
            download_latency=response.meta.get("download_latency"),
        )
