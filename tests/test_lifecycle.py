"""A crawl's life around its workers: workers that outlive a reset of the frontier they
joined, and workers started before the first start URL is pushed.

Real ``scrapy crawl site`` processes on a real Redis; every count comes from the demo
site's own request log.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from distcrawl.model.keys import FrontierKeys
from tests.support import page_fetches, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SITE = FrontierKeys("site")


def distcrawl_cli(redis_url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distcrawl.cli", "--redis-url", redis_url, *argv],
        capture_output=True,
        text=True,
        timeout=30,
    )


def crawl_once(site, redis_client, times: int) -> None:
    """Push the site's home page and wait until every page was fetched ``times`` times."""
    redis_client.lpush(SITE.start_urls, site.url + "/")
    expected = site.expected_pages()

    def done() -> bool:
        fetched = page_fetches(site)
        return all(fetched[page] >= times for page in expected)

    if not wait_until(done, timeout=60):
        fetched = page_fetches(site)
        reached = sum(1 for page in expected if fetched[page] >= times)
        raise AssertionError(f"{reached} of {len(expected)} pages fetched {times} times")


def settled(redis_client) -> bool:
    """The crawl is over in Redis: nothing queued, leased or waiting to be claimed."""
    return not (
        redis_client.zcard(SITE.queue)
        or redis_client.zcard(SITE.leases)
        or redis_client.llen(SITE.start_urls)
    )


# ---------------------------------------------------------------------- a frontier reset


@pytest.mark.parametrize(
    ("how", "shards"),
    [("reset", 1), ("flushdb", 1), ("reset", 2)],
    ids=["reset", "flushdb", "sharded"],
)
def test_a_live_worker_crawls_every_page_of_the_next_crawl(
    how, shards, demo_site, workers, redis_url, redis_client
):
    site = demo_site(pages=30)
    worker = workers(1, DISTCRAWL_SHARDS=shards)  # no idle timeout: it stays up between crawls
    assert worker.wait_for_log("Frontier: 0 queued"), worker.log()
    crawl_once(site, redis_client, times=1)
    assert wait_until(lambda: settled(redis_client), timeout=30)
    time.sleep(1.0)  # the worker's last acknowledgements are in

    if how == "reset":
        done = distcrawl_cli(redis_url, "reset", "site", "--yes", "--force")
        assert done.returncode == 0, done.stderr
    else:
        redis_client.flushdb()
    crawl_once(site, redis_client, times=2)

    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages()
    assert all(count == 2 for count in fetched.values()), fetched
    # robots.txt read again for the new crawl, its Crawl-delay recorded in it again
    robots = [line for line in site.read_log() if line.path == "/robots.txt"]
    assert len(robots) == 2, robots
    parts = [SITE.sharded(shards).of_shard(i) for i in range(shards)]
    assert any(redis_client.hexists(keys.robots, "127.0.0.1") for keys in parts)
    log = worker.log()
    assert log.count("WARNING: The frontier 'site' this worker joined is gone") == 1, log[-3000:]
    assert worker.alive()
    worker.stop()
    assert worker.proc.returncode == 0


def test_a_live_worker_stops_when_the_crawl_is_set_up_anew_with_other_settings(
    workers, redis_client
):
    worker = workers(1)
    assert worker.wait_for_log("Frontier: 0 queued"), worker.log()
    meta = redis_client.hgetall(SITE.meta)
    # emptied and set up again by a worker with another serializer, in one step
    pipe = redis_client.pipeline(transaction=True)
    pipe.flushdb()
    pipe.hset(SITE.meta, mapping={**meta, b"serializer": b"json", b"generation": b"0" * 16})
    pipe.execute()
    # parked (idle), it reads the generation with its look for dead workers' work, at most
    # IDLE_REAP_INTERVAL (30 s) after it parked
    assert worker.wait(60) is not None, worker.log()[-3000:]
    log = worker.log()
    assert (
        "ERROR: The frontier 'site' this worker joined was reset, and this worker's settings "
        "disagree with the frontier 'site' in Redis: DISTCRAWL_SERIALIZER: this worker "
        "'msgpack', the frontier 'json'"
    ) in log
    assert "(frontier_layout_mismatch)" in log
    assert redis_client.hget(SITE.meta, "serializer") == b"json"  # its record stands


# ---------------------------------------------------------------------- workers before the push


def test_a_worker_started_before_the_first_push_waits_for_it(demo_site, workers, redis_client):
    site = demo_site(pages=5)
    early = workers(1, DISTCRAWL_IDLE_TIMEOUT=1)
    assert early.wait_for_log("Frontier: 0 queued"), early.log()
    time.sleep(7.0)  # past Scrapy's idle signal (every 5 s) and the idle timeout
    assert early.alive(), early.log()[-3000:]
    assert "No work yet: waiting for the first start URL in site:start_urls" in early.log()

    redis_client.lpush(SITE.start_urls, site.url + "/")
    # the crawl had work: the idle clock runs, and the worker closes once it is done
    assert early.wait(60) == 0, early.log()[-3000:]
    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages()
    assert "closing" in early.log()

    # a worker joining the finished crawl closes on idle as before: the crawl had work
    late = workers(2, DISTCRAWL_IDLE_TIMEOUT=1)
    assert late.wait(60) == 0, late.log()[-3000:]
    assert "No work yet" not in late.log()
    assert page_fetches(site) == fetched  # nothing fetched again


def test_a_worker_that_never_sees_work_waits_and_says_so_once(workers, redis_client):
    worker = workers(1, DISTCRAWL_IDLE_TIMEOUT=0)
    assert worker.wait_for_log("No work yet"), worker.log()[-3000:]
    time.sleep(6.0)  # past Scrapy's idle signal of every 5 s: the frontier looked at again
    assert worker.alive(), worker.log()[-3000:]
    assert worker.log().count("No work yet") == 1
    worker.stop()
    assert worker.proc.returncode == 0
