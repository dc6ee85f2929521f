"""Real ``scrapy crawl site`` worker processes sharing one Redis frontier.

Every count comes from the demo site's own request log (each worker has its own
User-Agent), not from the crawler under test.
"""

from __future__ import annotations

import json
import pickle
import time
from collections import Counter

import pytest

from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import make_entry
from distcrawl.testing.workers import worker_agent
from tests.support import (
    assert_only_the_victims_leases_refetched,
    leases_held_by,
    page_fetches,
    push_to_first_fetch,
    wait_until,
)


def assert_frontier_drained(redis_client) -> None:
    assert redis_client.zcard("site:queue") == 0
    assert redis_client.zcard("site:leases") == 0
    assert redis_client.hlen("site:requests") == 0


def test_two_workers_fetch_every_page_exactly_once(demo_site, workers, redis_client):
    site = demo_site(pages=2000)
    redis_client.lpush("site:start_urls", site.url + "/")
    pool = [workers(i, DISTCRAWL_IDLE_TIMEOUT=3) for i in (1, 2)]
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]

    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages()  # none missing
    assert max(fetched.values()) == 1  # none fetched twice
    assert len(fetched) == 2001
    by_worker = Counter(
        line.user_agent for line in site.read_log() if line.path in site.expected_pages()
    )
    for i in (1, 2):
        assert by_worker[worker_agent(i)] > 2001 * 0.2, by_worker  # the work was shared
    assert_frontier_drained(redis_client)
    assert redis_client.llen("site:dead") == 0
    for w in pool:
        assert "ERROR" not in w.log()
        assert "Deprecat" not in w.log() + w.log_path.with_suffix(".stderr").read_text()


@pytest.mark.valkey
def test_push_to_idle_workers_starts_the_crawl_at_once(
    demo_site, workers, redis_server, redis_client
):
    site = demo_site(pages=30)
    pool = [workers(i) for i in (1, 2)]
    for w in pool:
        assert w.wait_for_log("Frontier: 0 queued"), w.log()
    time.sleep(2.0)  # both workers are idle, polling at their slowest
    delay = push_to_first_fetch(redis_server.port, "site:start_urls", site)
    print(f"push to first fetch: {delay:.3f}s")
    # the wake-up, not Scrapy's 5 s idle heartbeat, starts them: well under 5 s. How soon
    # (0.59 s on average with one idle worker) is measured by benchmarks.idle, not here
    assert delay < 3.0, delay
    assert wait_until(lambda: len(page_fetches(site)) == 31, timeout=60)
    for w in pool:
        assert w.alive()  # an idle worker waits for more work by default
        w.stop()
        assert w.proc.returncode == 0
        assert "Spider closed (shutdown)" in w.log()


@pytest.mark.serial
def test_sigkill_of_a_worker_loses_no_page(demo_site, workers, redis_client):
    site = demo_site(pages=600, delay=0.25)  # slow pages: the kill lands mid-crawl
    settings = {
        "DISTCRAWL_LEASE_TIMEOUT": 3,
        "DISTCRAWL_RECLAIM_INTERVAL": 0.5,
        "DISTCRAWL_IDLE_TIMEOUT": 8,
    }
    redis_client.lpush("site:start_urls", site.url + "/")
    victim, survivor = workers(1, **settings), workers(2, **settings)
    assert wait_until(lambda: len(page_fetches(site)) >= 150, timeout=60)
    victim.kill()
    killed_at = time.time()
    held = leases_held_by(redis_client, FrontierKeys("site"), victim.log())
    assert held > 0  # the victim really held leases when it died
    replacement = workers(3, **settings)

    for w in (survivor, replacement):
        assert w.wait(180) == 0, w.log()[-3000:]
    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages(), "pages missing after SIGKILL"
    assert_only_the_victims_leases_refetched(site, held, worker_agent(1))
    after = [line for line in site.read_log() if line.time > killed_at]
    assert any(line.user_agent == worker_agent(3) for line in after)  # the crawl continued
    assert_frontier_drained(redis_client)


def test_bad_input_is_dead_lettered_and_workers_keep_going(demo_site, workers, redis_client):
    site = demo_site(pages=5)
    pool = [workers(i) for i in (1, 2)]
    for w in pool:
        assert w.wait_for_log("Frontier: "), w.log()
    bad = [
        b"not a url",
        b'{"url": "http://127.0.0.1/", ',
        b"ftp://127.0.0.1/file.txt",
        b"http://127.0.0.1/" + b"x" * 10_000,
        b'{"url": "' + site.url.encode() + b'/page/1", "colour": "red"}',
    ]
    for raw in bad:
        redis_client.lpush("site:start_urls", raw)
    # entries written straight into the queue by someone else: garbage, and a pickle
    evil = b"p" + pickle.dumps({"u": site.url + "/page/2"})
    for seq, payload in ((10**9, b"m\xc1\xc1not msgpack"), (10**9 + 1, evil)):
        redis_client.zadd("site:queue", {make_entry("127.0.0.1", 0, seq, payload): 0})
    redis_client.zadd("site:ready", {"127.0.0.1": 0})
    redis_client.lpush("site:start_urls", site.url + "/")

    assert wait_until(lambda: redis_client.llen("site:dead") == 7, timeout=20)
    records = [json.loads(r) for r in redis_client.lrange("site:dead", 0, -1)]
    reasons = {r["raw"][:40]: r["reason"] for r in records}
    assert "not a URL" in reasons["not a url"]
    assert "invalid JSON" in reasons['{"url": "http://127.0.0.1/", ']
    assert "unsupported scheme" in reasons["ftp://127.0.0.1/file.txt"]
    assert any("too large" in r["reason"] for r in records)
    assert any("unknown field" in r["reason"] and "colour" in r["reason"] for r in records)
    assert any(r["source"] == "queue" and "undecodable" in r["reason"] for r in records)
    assert any(r["source"] == "queue" and "pickled payload refused" in r["reason"] for r in records)
    # the good entry pushed last was crawled, and the workers are still up
    assert wait_until(lambda: len(page_fetches(site)) == 6, timeout=30)
    for w in pool:
        assert w.alive()
    assert redis_client.llen("site:start_urls") == 0
    assert wait_until(lambda: redis_client.hlen("site:requests") == 0, timeout=5)
