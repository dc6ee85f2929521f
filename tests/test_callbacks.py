"""Callbacks and request attributes through Redis: a name read from the queue selects a
callback of the spider and nothing else, and what the spider's own requests carry survives.

Queue entries are written straight into Redis, as any writer with access could.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest_twisted
from scrapy import Request, signals
from scrapy.crawler import AsyncCrawlerRunner
from scrapy.http import JsonRequest
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule

from distcrawl.model.queue_entry import make_entry
from distcrawl.spiders import RedisCrawlSpider, RedisSpider
from tests.support import crawl, crawl_settings, fetched, page_fetches, run, wait_until


def write_queue(redis_client: Any, namespace: str, payloads: list[dict[str, Any]]) -> None:
    """Entries in the codec's format (``m`` + msgpack of the short-key dict)."""
    for seq, data in enumerate(payloads, start=10**9):
        entry = make_entry("127.0.0.1", 0, seq, b"m" + msgpack.packb(data))
        redis_client.zadd(f"{namespace}:queue", {entry: 0})
    redis_client.zadd(f"{namespace}:ready", {"127.0.0.1": 0})
    # as commit.lua does (lib.lua wake_idle): a parked worker hears of the new entries now,
    # not at its next look at the whole frontier
    redis_client.lpush(f"{namespace}:wake", "1")


def dead_letters(redis_client: Any, namespace: str) -> list[dict[str, Any]]:
    return [json.loads(r) for r in redis_client.lrange(f"{namespace}:dead", 0, -1)]


def test_hostile_callbacks_are_dead_lettered_and_the_worker_keeps_crawling(
    demo_site, workers, redis_client
):
    site = demo_site(pages=20)
    worker = workers(1)
    assert worker.wait_for_log("Frontier: "), worker.log()
    url = site.url + "/page/1?case="
    cases = {
        # the finding: Spider.__init__(response, parse="x") replaced spider.parse
        "init": ({"cb": "__init__", "k": {"parse": "x"}}, "'__init__' is a special method"),
        "errback": ({"eb": "__init__"}, "errback refused: '__init__' is a special method"),
        "private": ({"cb": "_scope"}, "'_scope' is a private method"),
        "start": ({"cb": "start"}, "'start' is part of the spider's lifecycle"),
        "closed": ({"cb": "closed"}, "'closed' is part of the spider's lifecycle"),
        "from_crawler": ({"cb": "from_crawler"}, "'from_crawler' is part of the spider's"),
        "attribute": ({"cb": "name"}, "'name' is not a method defined on the spider class"),
        "kwargs": ({"cb": "parse", "k": {"response": "x"}}, "do not fit callback 'parse'"),
        "extra": ({"a": {"callback": "__init__"}}, "Request has no attribute 'callback'"),
    }
    write_queue(
        redis_client, "site", [{"u": url + case, **data} for case, (data, _) in cases.items()]
    )

    assert wait_until(lambda: redis_client.llen("site:dead") == len(cases), timeout=20)
    records = dead_letters(redis_client, "site")
    for case, (_, why) in cases.items():
        [record] = [r for r in records if f"case={case}" in r["raw"]]
        assert record["source"] == "queue"
        assert why in record["reason"], (case, record["reason"])
        assert f"cannot be crawled: {record['reason']}" in worker.log()
    assert not any("case=" in line.path for line in site.read_log())  # none was fetched

    # the same worker then crawls the whole site: its parse is intact
    redis_client.lpush("site:start_urls", site.url + "/")
    assert wait_until(lambda: set(page_fetches(site)) == site.expected_pages(), timeout=60)
    assert wait_until(lambda: redis_client.hlen("site:requests") == 0, timeout=10)
    assert worker.alive()
    assert "Spider error" not in worker.log()
    assert redis_client.llen("site:dead") == len(cases)


class RuleSpider(RedisCrawlSpider):
    name = "rules"
    rules = (Rule(LinkExtractor(allow=r"/page/\d+$"), callback="parse_page", follow=True),)

    def parse_page(self, response: Any) -> Any:
        yield {"url": response.url, "rule": response.meta["rule"]}


@pytest_twisted.ensureDeferred
async def test_redis_crawl_spider_rules_work_through_redis(redis_url, redis_client, demo_site):
    site = demo_site(pages=30)
    redis_client.lpush("rules:start_urls", site.url + "/")
    crawler = await crawl(RuleSpider, redis_url)
    assert sorted(set(fetched(site))) == sorted(site.expected_pages())
    stats = crawler.stats.get_stats()
    assert stats["item_scraped_count"] == 30  # every /page/N, through the rule's callback
    # each request leased once; a reserve given back unsent (it came after the requests it
    # could replace had left) is leased again
    returned = stats.get("distcrawl/places/reserves_returned", 0)
    assert stats["distcrawl/leased"] - returned == 31
    assert redis_client.llen("rules:dead") == 0


@pytest_twisted.ensureDeferred
async def test_allowed_callbacks_with_the_rule_callbacks(redis_url, redis_client, demo_site):
    site = demo_site(pages=10)
    redis_client.lpush("rules:start_urls", site.url + "/")
    allowed = ["parse_page", "_callback", "_errback"]
    crawler = await crawl(RuleSpider, redis_url, DISTCRAWL_ALLOWED_CALLBACKS=allowed)
    assert sorted(set(fetched(site))) == sorted(site.expected_pages())
    assert crawler.stats.get_value("item_scraped_count") == 10


class JsonSpider(RedisSpider):
    """Yields a JsonRequest, and a request whose callback DISTCRAWL_ALLOWED_CALLBACKS leaves
    out."""

    name = "jsonspider"
    url = ""

    async def start(self) -> Any:
        yield JsonRequest(
            self.url + "/page/1", dumps_kwargs={"indent": 2}, callback=self.parse_json
        )
        yield Request(self.url + "/page/2", callback=self.parse_other)

    def parse_json(self, response: Any) -> Any:
        request = response.request
        yield {"class": type(request).__name__, "dumps_kwargs": request.dumps_kwargs}

    def parse_other(self, response: Any) -> Any:
        yield {"other": response.url}


@pytest_twisted.ensureDeferred
async def test_allowed_callbacks_narrow_and_attributes_survive(redis_url, redis_client, demo_site):
    site = demo_site(pages=10)
    JsonSpider.url = site.url
    write_queue(redis_client, "jsonspider", [{"u": site.url + "/page/3", "cb": "parse_other"}])
    items: list[dict[str, Any]] = []
    runner = AsyncCrawlerRunner(
        crawl_settings(redis_url, DISTCRAWL_ALLOWED_CALLBACKS=["parse_json"])
    )
    crawler = runner.create_crawler(JsonSpider)

    def collect(item: Any) -> None:  # held here: signals keep only a weak reference
        items.append(dict(item))

    crawler.signals.connect(collect, signals.item_scraped)
    await run(crawler.crawl_async())
    assert items == [{"class": "JsonRequest", "dumps_kwargs": {"indent": 2, "sort_keys": True}}]
    assert fetched(site) == ["/page/1"]
    reasons = {(r["source"], r["reason"]) for r in dead_letters(redis_client, "jsonspider")}
    refused = "'parse_other' is not in DISTCRAWL_ALLOWED_CALLBACKS"
    assert any(s == "enqueue" and refused in why for s, why in reasons), reasons  # its own
    assert any(s == "queue" and refused in why for s, why in reasons), reasons  # a writer's
    assert crawler.stats.get_value("distcrawl/unserializable") == 1
