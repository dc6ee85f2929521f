"""Real ``scrapy crawl site`` workers storing their items in a real MongoDB (secantusd-py).

Which pages exist and which were fetched comes from the demo site, not from the crawler;
what was stored comes from MongoDB itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter

import pytest

from distcrawl.demo.site import DemoSite
from distcrawl.model.keys import FrontierKeys
from tests.support import leases_held_by, wait_until

pytestmark = pytest.mark.timeout(240)


def mongo_stats(log: str) -> Counter[str]:
    """The distcrawl/mongo/* stats of a worker, from Scrapy's stats dump in its log."""
    return Counter(
        {name: int(value) for name, value in re.findall(r"'distcrawl/mongo/(\w+)': (\d+)", log)}
    )


def fetched_ok(site: DemoSite) -> set[str]:
    expected = site.expected_pages()
    return {ln.path for ln in site.read_log() if ln.path in expected and ln.status == 200}


def test_two_workers_store_every_page_once_and_a_recrawl_updates_them(
    demo_site, mongo_workers, redis_client, mongo_client
):
    site = demo_site(pages=2000)
    pages = mongo_client.distcrawl["site"]
    settings = {"DISTCRAWL_IDLE_TIMEOUT": 3}

    redis_client.lpush("site:start_urls", site.url + "/")
    first = [mongo_workers(i, **settings) for i in (1, 2)]
    for w in first:
        assert w.wait(180) == 0, w.log()[-3000:]
    docs = list(pages.find({}, {"url": 1, "fetched_at": 1, "title": 1}))
    assert len(docs) == 2001  # exactly one document per page
    assert {d["url"] for d in docs} == site.expected_urls()
    assert all(d["title"] for d in docs)
    stats = sum((mongo_stats(w.log()) for w in first), Counter())
    assert stats["upserted"] == stats["written"] == 2001, stats
    assert stats["updated"] == stats["failed"] == stats["spilled"] == 0
    for w in first:
        assert mongo_stats(w.log())["written"] > 2001 * 0.2  # both workers wrote
    last_first_run = max(d["fetched_at"] for d in docs)

    # the same crawl again over the same collection: a fresh frontier, the same MongoDB
    redis_client.delete(*redis_client.keys("site:*"))
    redis_client.lpush("site:start_urls", site.url + "/")
    second = [mongo_workers(i, **settings) for i in (3, 4)]
    for w in second:
        assert w.wait(180) == 0, w.log()[-3000:]
    docs = list(pages.find({}, {"url": 1, "fetched_at": 1}))
    assert len(docs) == 2001
    assert {d["url"] for d in docs} == site.expected_urls()
    assert min(d["fetched_at"] for d in docs) > last_first_run  # every one replaced
    stats = sum((mongo_stats(w.log()) for w in second), Counter())
    assert stats["updated"] == stats["written"] == 2001, stats
    assert stats["upserted"] == 0
    assert mongo_client.distcrawl["site_dead"].count_documents({}) == 0
    for w in first + second:
        assert "ERROR" not in w.log()


def test_mongodb_restart_mid_crawl_loses_no_item(
    demo_site, mongo_workers, redis_client, mongo_server, mongo_client
):
    site = demo_site(pages=2000, delay=0.01)
    pages = mongo_client.distcrawl["site"]
    settings = {
        "DISTCRAWL_IDLE_TIMEOUT": 3,
        "DISTCRAWL_MONGO_MAX_BUFFER": 200,  # the bound is reached during the outage
        "DISTCRAWL_MONGO_BATCH_SIZE": 100,
    }
    redis_client.lpush("site:start_urls", site.url + "/")
    pool = [mongo_workers(i, **settings) for i in (1, 2)]
    assert wait_until(lambda: pages.estimated_document_count() >= 300, timeout=60)
    mongo_server.pause()
    stopped_at = time.monotonic()
    at_stop = len(fetched_ok(site))
    time.sleep(10)
    during_outage = len(fetched_ok(site))
    mongo_server.resume()
    outage = time.monotonic() - stopped_at
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]

    docs = list(pages.find({}, {"url": 1}))
    assert len(docs) == 2001, f"{len(docs)} documents after a {outage:.0f}s outage"
    assert {d["url"] for d in docs} == site.expected_urls()
    logs = [w.log() for w in pool]
    assert any("write failed" in log for log in logs)
    assert any("is back after" in log for log in logs)
    stats = sum((mongo_stats(log) for log in logs), Counter())
    assert stats["retries"] >= 1 and stats["spilled"] == 0, stats
    assert stats["buffer_max"] <= 2 * 200
    assert at_stop < 2001  # the crawl really was going on when MongoDB went down
    print(f"restart test: {outage:.1f}s outage, {during_outage} pages fetched by its end")


def test_a_mongodb_outage_holds_leasing_back(
    demo_site, mongo_workers, redis_client, mongo_server, mongo_client
):
    """Items waiting for MongoDB keep their requests' leases (acknowledged once stored), and
    the pipeline's backlog counts against what a worker may lease: through the outage each
    worker holds at most in flight plus twice prefetched (DistcrawlConfig.max_held), the bound
    of a dead worker's duplicates (docs/internals.md), instead of leasing on while nothing is
    stored."""
    concurrency = 8
    site = demo_site(pages=1000)
    pages = mongo_client.distcrawl["site"]
    settings = {"DISTCRAWL_IDLE_TIMEOUT": 3, "CONCURRENT_REQUESTS": concurrency}
    redis_client.lpush("site:start_urls", site.url + "/")
    pool = [mongo_workers(i, **settings) for i in (1, 2)]
    assert wait_until(lambda: pages.estimated_document_count() >= 50, timeout=60)
    mongo_server.pause()
    paused_at = time.time()
    at_stop = len(fetched_ok(site))
    logs = [w.log() for w in pool]  # each names its worker tag, the start of its lease tokens
    most = [0, 0]
    try:
        for _ in range(100):  # 5 s of outage
            for i, log in enumerate(logs):
                most[i] = max(most[i], leases_held_by(redis_client, FrontierKeys("site"), log))
            time.sleep(0.05)
        during_outage = len(fetched_ok(site))
    finally:
        mongo_server.resume()
    resumed_at = time.time()
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]

    arrived = sorted(line.arrived for line in site.read_log())
    before = sum(1 for t in arrived if t < paused_at) / (paused_at - arrived[0])
    after = sum(1 for t in arrived if t > resumed_at) / max(0.001, arrived[-1] - resumed_at)
    print(f"outage: {before:.0f} pages/s before it, {after:.0f} pages/s after it")
    docs = list(pages.find({}, {"url": 1}))
    assert len(docs) == 1001  # one document per page
    assert {d["url"] for d in docs} == site.expected_urls()
    assert at_stop < 1001  # the crawl really was going on when MongoDB went down
    print(f"outage: {most} leases held at most, {during_outage - at_stop} pages fetched in it")
    # DistcrawlConfig.max_held: 2 x DISTCRAWL_PREFETCH (2 x CONCURRENT_REQUESTS) + the engine
    assert max(most) <= 5 * concurrency, most


def test_spill_file_when_mongodb_stays_down_past_close_then_replay(
    demo_site, mongo_workers, redis_client, mongo_server, mongo_client, tmp_path
):
    site = demo_site(pages=400, delay=0.2)  # slow pages: the crawl is still going at the stop
    pages = mongo_client.distcrawl["site"]
    spill_dir = tmp_path / "spill"
    redis_client.lpush("site:start_urls", site.url + "/")
    worker = mongo_workers(
        1,
        DISTCRAWL_MONGO_CLOSE_TIMEOUT=2,
        DISTCRAWL_MONGO_TIMEOUT=1,
        DISTCRAWL_MONGO_SPILL_DIR=str(spill_dir),
    )
    assert wait_until(lambda: pages.estimated_document_count() >= 30, timeout=60)
    mongo_server.pause()
    try:
        time.sleep(1.5)
        worker.stop(timeout=60)  # SIGTERM: close while MongoDB is down
        assert worker.proc is not None and worker.proc.returncode == 0, worker.log()[-3000:]
    finally:
        mongo_server.resume()
    log = worker.log()
    assert "was unreachable at close" in log and "distcrawl mongo replay" in log
    (spill,) = spill_dir.glob("*.jsonl")
    stats = mongo_stats(log)
    assert stats["spilled"] > 0 and stats["written"] >= 30, stats
    # a batch MongoDB applied just as it went away, without acknowledging it, is spilled
    # too: it is then in MongoDB and in the spill file, and the replay rewrites it
    stored_before = pages.count_documents({})
    assert stats["written"] <= stored_before <= stats["written"] + stats["spilled"], stats

    replayed = subprocess.run(
        [sys.executable, "-m", "distcrawl.cli", "mongo", "replay", str(spill)],
        env={**os.environ, "MONGO_URI": mongo_server.uri},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replayed.returncode == 0, replayed.stderr
    assert f"replayed {stats['spilled']} documents" in replayed.stdout
    stored = {d["url"] for d in pages.find({}, {"url": 1})}
    # every page the site served to the worker is in MongoDB, and nothing else
    assert stored == {site.url + p for p in fetched_ok(site)}
    assert len(stored) == stats["written"] + stats["spilled"]  # each item counted once
