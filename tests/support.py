"""Helpers shared by the worker-process tests (fixtures live in conftest.py)."""

from __future__ import annotations

import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from scrapy.crawler import AsyncCrawlerRunner
from scrapy.utils.defer import deferred_from_coro

from distcrawl.demo.site import DemoSite


def server_ms(client: Any) -> int:
    """Redis' own clock in ms, the one the scripts read (lib.lua's TIME)."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


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


_WORKER_TAG = re.compile(r"\(worker ([0-9a-f]{8}),")


def push_to_first_fetch(port: int, key: str, site: DemoSite, path: str = "/") -> float:
    """LPUSH ``site``'s ``path`` to ``key`` with redis-cli (as an operator would, from a
    process of its own), then wait for the site to serve it: seconds from the push to
    that first fetch (inf when it never came within 10 s)."""
    pushed_at = time.time()
    subprocess.run(
        ["redis-cli", "-p", str(port), "lpush", key, site.url + path],
        check=True,
        capture_output=True,
        timeout=10,
    )
    if not wait_until(lambda: path in page_fetches(site), timeout=10):
        return float("inf")
    return min(line.time for line in site.read_log() if line.path == path) - pushed_at


def leases_held_by(client: Any, keys: Any, log: str) -> int:
    """How many requests the worker whose log this is holds leased right now: a lease token
    starts with the holder's tag, which the worker logs at open. A worker killed with
    SIGKILL can have fetched at most these without its commit landing, so they bound the
    pages fetched twice after the kill (in flight, or fetched and not yet acknowledged)."""
    found = _WORKER_TAG.search(log)
    assert found, "the worker did not log its tag"
    tag = bytes.fromhex(found.group(1))
    ids = client.zrange(keys.leases, 0, -1)
    records = client.hmget(keys.requests, ids) if ids else []
    return sum(1 for r in records if r is not None and r[:4] == tag)


def assert_only_the_victims_leases_refetched(site: DemoSite, held: int, victim_agent: str) -> None:
    """After a SIGKILL only what the victim held leased may be fetched twice (a fetch cut
    off by the kill, logged 499, counts), and each such page is one the victim fetched."""
    lines = site.read_log()
    expected = site.expected_pages()
    fetches = Counter(line.path for line in lines if line.path in expected)
    extra = {path: n - 1 for path, n in fetches.items() if n > 1}
    by_victim = {line.path for line in lines if line.user_agent == victim_agent}
    print(f"crash test: {held} leases held by the victim, {sum(extra.values())} extra fetches")
    assert sum(extra.values()) <= held, (held, extra)
    assert set(extra) <= by_victim, sorted(set(extra) - by_victim)


def stat(worker: Any, name: str) -> int:
    """A stat from the worker's final stats dump (0 when absent)."""
    found = re.findall(rf"'{re.escape(name)}': (\d+)", worker.log())
    return int(found[-1]) if found else 0


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


class Heard:
    """A HoldListener (distcrawl/engine/holds.py) started on ``url`` for ``channel``, and the
    holds it delivered; ``stop`` it."""

    def __init__(self, url: str, channel: str, *, cluster: bool | None = False) -> None:
        import threading

        from distcrawl.engine.holds import HoldListener

        self.holds: list[Any] = []
        self.got = threading.Event()
        self.listener = HoldListener(
            url, channel, socket_timeout=5, cluster=cluster, max_ms=60_000, deliver=self._deliver
        )
        self.listener.start()

    def _deliver(self, hold: Any) -> None:
        self.holds.append(hold)
        self.got.set()

    def stop(self) -> None:
        self.listener.stop()
