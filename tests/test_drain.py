"""A clean drain on SIGTERM (distcrawl/engine/drain.py), with real worker processes: the
worker gives what it has not started to the others at once, lets what is in progress finish
within DISTCRAWL_DRAIN_TIMEOUT, commits, and exits 0; the timeout, or a second SIGTERM,
gives back what is still in progress and ends it, losing nothing."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from scrapy.settings import Settings

from distcrawl.config import ConfigError, DistcrawlConfig
from distcrawl.engine.drain import Drain
from distcrawl.model.keys import FrontierKeys
from distcrawl.testing.workers import worker_agent
from tests.support import _WORKER_TAG, page_fetches, stat, wait_until

KEYS = FrontierKeys("site")


def held_ids(client: Any, log: str) -> set[bytes]:
    """The request ids the worker whose log this is holds leased now (its tag starts each
    lease token; none before it logged its tag)."""
    found = _WORKER_TAG.search(log)
    if found is None:
        return set()
    tag = bytes.fromhex(found.group(1))
    ids = client.zrange(KEYS.leases, 0, -1)
    records = client.hmget(KEYS.requests, ids) if ids else []
    return {i for i, r in zip(ids, records, strict=True) if r is not None and r[:4] == tag}


def arrivals_after(site: Any, agent: str, since: float) -> list[str]:
    """Pages the worker with this User-Agent asked for after ``since`` (the site's clock)."""
    return [x.path for x in site.read_log() if x.user_agent == agent and x.arrived > since]


def test_drain_timeout_is_a_parsed_setting():
    def parse(**values: Any) -> float:
        return DistcrawlConfig.from_settings(Settings(values)).drain_timeout

    assert parse() == 20.0
    assert parse(DISTCRAWL_DRAIN_TIMEOUT="0") == 0.0  # 0 is a value: give back at once
    with pytest.raises(ConfigError, match="DISTCRAWL_DRAIN_TIMEOUT"):
        parse(DISTCRAWL_DRAIN_TIMEOUT=-1)


def test_no_handler_is_installed_where_scrapy_installed_none():
    """Under CrawlerRunner (a program with its own signal handling) the drain leaves the
    process's handlers alone: only Scrapy's own are wrapped."""
    from distcrawl.engine import drain as module

    before = signal.getsignal(signal.SIGTERM)
    handlers = module._Handlers()

    class Crawler:
        class signals:
            @staticmethod
            def connect(*_: Any, **__: Any) -> None:
                return None

    class Scheduler:
        def drain(self) -> int:
            return 0

    handlers.add(Drain(Crawler(), Scheduler(), 1.0))  # type: ignore[arg-type]
    assert signal.getsignal(signal.SIGTERM) is before
    assert handlers.drains == []


def test_sigterm_gives_back_at_once_finishes_in_progress_and_exits_0(
    demo_site, workers, redis_client
):
    """Worker A holds more leases than it downloads; B runs beside it. SIGTERM to A: within
    a second every request A had not started is leased by B or done, A starts nothing more,
    its downloads finish, and it exits 0; the whole site is fetched once, none cut off."""
    site = demo_site(pages=40, delay=1.0)
    slow = {"CONCURRENT_REQUESTS": 2, "DISTCRAWL_PREFETCH": 16, "DISTCRAWL_DRAIN_TIMEOUT": 60}
    a = workers(1, DISTCRAWL_IDLE_TIMEOUT=60, **slow)
    redis_client.lpush("site:start_urls", site.url + "/")
    assert wait_until(lambda: len(held_ids(redis_client, a.log())) >= 6, timeout=60), a.log()[
        -2000:
    ]
    b = workers(2, DISTCRAWL_IDLE_TIMEOUT=3)
    assert b.wait_for_log("(worker ", timeout=60), b.log()[-2000:]

    before = held_ids(redis_client, a.log())
    sent = time.time()
    a.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    # within a second, all but the (at most 2) requests A downloads left A's hands
    moved = wait_until(lambda: len(before & held_ids(redis_client, a.log())) <= 2, timeout=1.0)
    late = len(before & held_ids(redis_client, a.log()))
    assert moved, f"{late} of {len(before)} leases still A's a second after SIGTERM"
    # and B, the survivor, has leased some of them within that second
    picked = wait_until(lambda: before & held_ids(redis_client, b.log()), timeout=1.0)
    print(f"drain: {len(before)} held, B leased some {time.time() - sent:.2f}s after SIGTERM")
    assert picked, "B did not take what A gave back within a second"

    assert a.wait(30) == 0, a.log()[-3000:]
    log = a.log()
    assert "SIGTERM: draining" in log, log[-3000:]
    assert "still in progress are given back" not in log  # they finished in time
    assert "ERROR" not in log, log[-3000:]
    # what A downloaded was stored: acknowledged, none left leased under its tag
    assert _WORKER_TAG.search(log) and held_ids(redis_client, log) == set()
    # given back, not acknowledged: those that finished before the signal reached A were
    assert stat(a, "distcrawl/released") >= 1
    # A asked for nothing after the signal (the site's clock is this machine's)
    assert arrivals_after(site, worker_agent(1), sent + 0.2) == []

    assert b.wait(120) == 0, b.log()[-3000:]
    fetched = page_fetches(site, ok_only=False)
    assert set(fetched) == site.expected_pages(), "pages missing after the drain"
    assert max(fetched.values()) == 1, [p for p, n in fetched.items() if n > 1]


def test_drain_timeout_gives_back_what_is_still_in_progress(demo_site, workers, redis_client):
    """Downloads longer than DISTCRAWL_DRAIN_TIMEOUT: the worker stops waiting for them,
    gives their leases back at once and exits 0 well before they would end; another worker
    fetches every page (those cut off again: nothing lost)."""
    site = demo_site(pages=12, delay=8.0)
    a = workers(1, CONCURRENT_REQUESTS=4, DISTCRAWL_DRAIN_TIMEOUT=1, DISTCRAWL_IDLE_TIMEOUT=60)
    redis_client.lpush("site:start_urls", site.url + "/")
    assert wait_until(lambda: len(page_fetches(site)) >= 1, timeout=60)  # home, then 4 more
    assert wait_until(lambda: len(held_ids(redis_client, a.log())) >= 4, timeout=30)
    time.sleep(0.5)  # the downloads are under way
    sent = time.monotonic()
    a.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert a.wait(15) == 0, a.log()[-3000:]
    took = time.monotonic() - sent
    assert took < 7, f"exited {took:.1f}s after SIGTERM: it waited for the downloads"
    log = a.log()
    assert "ERROR" not in log, log[-3000:]
    assert "Drain ended by DISTCRAWL_DRAIN_TIMEOUT" in log, log[-3000:]
    assert (
        _WORKER_TAG.search(log) and held_ids(redis_client, log) == set()
    )  # given back, not left to expire

    b = workers(2, DISTCRAWL_IDLE_TIMEOUT=3)
    assert b.wait(180) == 0, b.log()[-3000:]
    assert set(page_fetches(site)) == site.expected_pages(), "pages lost in the drain"


def test_a_second_sigterm_ends_the_drain_at_once(demo_site, workers, redis_client):
    """With a long DISTCRAWL_DRAIN_TIMEOUT, a second SIGTERM is what ends the wait."""
    site = demo_site(pages=12, delay=8.0)
    a = workers(1, CONCURRENT_REQUESTS=4, DISTCRAWL_DRAIN_TIMEOUT=600, DISTCRAWL_IDLE_TIMEOUT=60)
    redis_client.lpush("site:start_urls", site.url + "/")
    assert wait_until(lambda: len(held_ids(redis_client, a.log())) >= 4, timeout=60)
    # the downloads are under way (leased is not yet downloading: on a loaded machine a
    # SIGTERM that came first gave them back and the worker had nothing to wait for; the
    # site logs a request only once answered, 8 s later)
    time.sleep(0.5)
    a.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert a.wait_for_log("SIGTERM: draining", timeout=10), a.log()[-3000:]
    assert a.wait(1) is None  # draining: waiting for the downloads
    sent = time.monotonic()
    a.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert a.wait(15) == 0, a.log()[-3000:]
    assert time.monotonic() - sent < 7
    assert "Drain ended by a second SIGTERM" in a.log(), a.log()[-3000:]
    assert held_ids(redis_client, a.log()) == set()
