"""robots.txt must hold for every request that waited for it, not only the first two.

Scrapy 2.19's RobotsTxtMiddleware.robot_parser() makes the requests that arrive while a
netloc's robots.txt is being downloaded await ``maybe_deferred_to_future(<shared Deferred>)``;
``Deferred.asFuture()`` consumes the result, so only the first of them got the parser and every
later one got None, i.e. "no robots.txt, allow everything". distcrawl's RobotsTxtMiddleware
gives each waiter its own Deferred.
"""

from __future__ import annotations

import pytest_twisted
from scrapy import Request
from scrapy.crawler import AsyncCrawlerRunner
from scrapy.utils.defer import deferred_from_coro

from distcrawl.robots import RobotsTxtMiddleware
from distcrawl.spiders import RedisSpider
from distcrawl.spiders.site import SiteSpider
from tests.support import crawl_settings

#: all disallowed by the demo site's robots.txt (``Disallow: /private/``)
PRIVATE = [f"/private/{n}" for n in (7, 57, 107, 157, 7 + 50 * 4, 7 + 50 * 5)]


def fetched_private(site) -> list[str]:
    return [ln.path for ln in site.read_log() if ln.path.startswith("/private/")]


class PrivateSpider(RedisSpider):
    """Plain-Scrapy style start requests, all to a netloc whose robots.txt is still unknown."""

    name = "private"
    base = ""

    async def start(self):
        for path in PRIVATE:
            yield Request(self.base + path, dont_filter=True)


@pytest_twisted.ensureDeferred
async def test_disallowed_requests_waiting_for_robots_txt_are_all_forbidden(
    redis_url, redis_client, demo_site
):
    """The scrapyd-test symptom: a worker's first lease batch holds several requests to a
    netloc it has no robots.txt for yet, and one of them is a /private/ page."""
    site = demo_site(pages=400)
    for path in PRIVATE:
        redis_client.lpush("site:start_urls", site.url + path)
    runner = AsyncCrawlerRunner(crawl_settings(redis_url))
    crawler = runner.create_crawler(SiteSpider)
    await deferred_from_coro(crawler.crawl_async())
    stats = crawler.stats.get_stats()
    assert stats["distcrawl/leased"] == len(PRIVATE)  # all handed to the engine
    assert stats["robotstxt/request_count"] == 1
    assert fetched_private(site) == []
    assert stats["robotstxt/forbidden"] == len(PRIVATE)


@pytest_twisted.ensureDeferred
async def test_middleware_alone_without_the_frontier(demo_site):
    """The same with Scrapy's own scheduler: the bug and the fix are in the middleware only."""
    site = demo_site(pages=400)
    runner = AsyncCrawlerRunner(
        {
            "ROBOTSTXT_OBEY": True,
            "DOWNLOADER_MIDDLEWARES": {
                "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
                RobotsTxtMiddleware: 100,
            },
            "TELNETCONSOLE_ENABLED": False,
            "LOG_LEVEL": "INFO",
        }
    )
    crawler = runner.create_crawler(PrivateSpider)
    await deferred_from_coro(crawler.crawl_async(base=site.url))
    stats = crawler.stats.get_stats()
    assert fetched_private(site) == []
    assert stats["robotstxt/forbidden"] == len(PRIVATE)


def test_addon_swaps_in_the_fixed_robots_middleware():
    from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware as ScrapyRobots
    from scrapy.settings import Settings

    from distcrawl import Addon

    s = Settings()
    Addon().update_settings(s)
    downloader = s.getdict("DOWNLOADER_MIDDLEWARES")
    assert downloader[ScrapyRobots] is None
    assert downloader[RobotsTxtMiddleware] == 100
