"""Helpers shared by the worker-process tests (fixtures live in conftest.py)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from scrapy.crawler import AsyncCrawlerRunner
from scrapy.utils.defer import deferred_from_coro

from distcrawl.demo.site import DemoSite


def wait_until(predicate: Callable[[], object], timeout: float, step: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds have passed (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def page_fetches(site: DemoSite, *, ok_only: bool = True) -> Counter[str]:
    """Fetches per page from the site's own log; with ok_only=False also those whose client
    went away (status 499)."""
    expected = site.expected_pages()
    return Counter(
        line.path
        for line in site.read_log()
        if line.path in expected and (line.status == 200 or not ok_only)
    )


# ------------------------------------------------------------ in-process crawls


def crawl_settings(redis_url: str, **extra: Any) -> dict[str, Any]:
    """Settings of an in-process crawl through the add-on on the test Redis."""
    return {
        "ADDONS": {"distcrawl.Addon": 0},
        "REDIS_URL": redis_url,
        "DISTCRAWL_IDLE_TIMEOUT": 1,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        **extra,
    }


def run(coro: Any) -> Any:
    """Scrapy's coroutines await asyncio futures: run them as asyncio tasks."""
    return deferred_from_coro(coro)


async def crawl(spider_cls: type, redis_url: str, **extra: Any) -> Any:
    """Run one crawl in this process until it closes; returns its crawler."""
    crawler = AsyncCrawlerRunner(crawl_settings(redis_url, **extra)).create_crawler(spider_cls)
    await run(crawler.crawl_async())
    return crawler


def fetched(site: DemoSite) -> list[str]:
    """Paths the site served (200 or a redirect), robots.txt left out."""
    return [
        line.path
        for line in site.read_log()
        if line.status in (200, 302) and line.path != "/robots.txt"
    ]
