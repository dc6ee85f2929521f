"""Operating a running crawl: status, pause/resume, stale heartbeats, metrics; real workers."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from typing import Any

import pytest

from distcrawl import cli
from distcrawl.testing.redis_server import find_free_port
from distcrawl.testing.workers import worker_agent
from tests.support import page_fetches, server_ms, wait_until

FAST = {"DISTCRAWL_HEARTBEAT_INTERVAL": 0.5}


def status(capsys, redis_url: str, *extra: str) -> dict:
    capsys.readouterr()
    assert cli.main(["--redis-url", redis_url, "--json", "status", "site", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_status_numbers_match_the_site_and_the_queue(
    demo_site, workers, redis_client, redis_url, capsys
):
    site = demo_site(pages=300)
    redis_client.lpush("site:start_urls", site.url + "/")
    pool = [workers(i, DISTCRAWL_IDLE_TIMEOUT=2, **FAST) for i in (1, 2)]
    for w in pool:
        assert w.wait(120) == 0, w.log()[-2000:]
    snap = status(capsys, redis_url)
    answered = [line for line in site.read_log() if line.status not in (0, 499)]
    assert snap["totals"]["pages"] == len(answered)  # every response, robots.txt included
    assert snap["totals"]["items"] == len(page_fetches(site)) == 301
    assert snap["queue"] == snap["leased"] == snap["delayed"] == 0
    assert snap["seen"] == redis_client.scard("site:seen")
    assert {w["pid"] for w in snap["workers"]} == {w.pid for w in pool}
    assert all(w["status"] == "exited" for w in snap["workers"])
    per_worker = {w["pid"]: w["pages"] for w in snap["workers"]}
    by_agent = {
        w.pid: sum(1 for line in answered if line.user_agent == worker_agent(w.index)) for w in pool
    }
    assert per_worker == by_agent
    ((domain, count),) = snap["domains"]
    assert domain == "127.0.0.1" and count == len(answered)
    assert cli.main(["--redis-url", redis_url, "status", "site"]) == 0
    assert "workers: 0 alive of 2" in capsys.readouterr().out


def test_pause_stops_fetches_and_resume_finishes_the_crawl(
    demo_site, workers, redis_client, redis_url, capsys
):
    site = demo_site(pages=400, delay=0.2)
    redis_client.lpush("site:start_urls", site.url + "/")
    pool = [workers(i, DISTCRAWL_IDLE_TIMEOUT=3, **FAST) for i in (1, 2)]
    assert wait_until(lambda: len(page_fetches(site)) >= 60, timeout=60)
    assert cli.main(["--redis-url", redis_url, "pause", "site"]) == 0
    paused_at = time.time()
    time.sleep(4)
    late = [line for line in site.read_log() if line.time > paused_at + 2.0]
    assert late == []  # no new fetch 2 s after the pause
    snap = status(capsys, redis_url)
    assert snap["paused"] and {w["state"] for w in snap["workers"]} == {"paused"}
    assert snap["leased"] == 0  # unstarted requests went back to the queue
    for w in pool:
        assert w.alive()  # a paused worker waits, it does not close
    assert cli.main(["--redis-url", redis_url, "resume", "site"]) == 0
    for w in pool:
        assert w.wait(120) == 0
    assert set(page_fetches(site)) == site.expected_pages()


def test_a_killed_worker_goes_stale(demo_site, workers, redis_client, redis_url, capsys):
    site = demo_site(pages=300, delay=0.1)
    redis_client.lpush("site:start_urls", site.url + "/")
    victim, survivor = workers(1, **FAST), workers(2, **FAST)
    assert wait_until(lambda: len(page_fetches(site)) >= 30, timeout=60)
    assert wait_until(lambda: len(status(capsys, redis_url)["workers"]) == 2, timeout=10)
    if not all(w.get("tag") for w in status(capsys, redis_url)["workers"]):
        # status judges a worker by its liveness beats, which need the scheduler's tag
        # (Scheduler.tag and its Liveness thread land separately); test_clock.py covers the
        # status logic without workers meanwhile
        pytest.skip("workers publish no liveness tag yet")
    assert wait_until(
        lambda: sum(w["status"] == "alive" for w in status(capsys, redis_url)["workers"]) == 2,
        timeout=10,
    )
    victim.kill()
    assert wait_until(
        lambda: (
            {
                w["pid"]: w["status"]
                for w in status(capsys, redis_url, "--stale-after", "2")["workers"]
            }.get(victim.pid)
            == "stale"
        ),
        timeout=10,
    )
    snap = status(capsys, redis_url, "--stale-after", "2")
    assert {w["pid"]: w["status"] for w in snap["workers"]}[survivor.pid] == "alive"


def test_metrics_endpoint_serves_the_counters(demo_site, workers, redis_client):
    site = demo_site(pages=50)
    port = find_free_port()
    redis_client.lpush("site:start_urls", site.url + "/")
    worker = workers(1, DISTCRAWL_METRICS_PORT=port, **FAST)
    assert wait_until(lambda: len(page_fetches(site)) == 51, timeout=60)

    def pages_metric() -> int:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        metrics = dict(
            line.split() for line in body.decode().splitlines() if not line.startswith("#")
        )
        return int(metrics["distcrawl_pages_total"])

    assert wait_until(lambda: pages_metric() >= 51, timeout=10)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for name in (
        "distcrawl_items_total",
        "distcrawl_queue",
        "distcrawl_leased",
        "distcrawl_retries_total",
        "distcrawl_lease_expired_total",
        "distcrawl_paused",
        # the revisit gauges, read with the beat riding the scheduler's batch
        "distcrawl_revisits",
        "distcrawl_revisits_due",
        "distcrawl_revisits_overdue_seconds",
    ):
        assert f"\n{name} " in "\n" + body
    worker.stop()


def test_watch_reports_rates_between_snapshots(redis_client, redis_url, capsys):
    from distcrawl.model.dashboard import Watch, sparkline

    redis_client.hset("site:stats", mapping={"pages": 10, "items": 5})
    capsys.readouterr()
    assert (
        cli.main(
            [
                "--redis-url",
                redis_url,
                "--json",
                "watch",
                "site",
                "--duration",
                "1.2",
                "--interval",
                "0.5",
            ]
        )
        == 0
    )
    frames = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(frames) >= 2 and frames[0]["totals"] == {"pages": 10, "items": 5}

    watch = Watch(width=10)
    watch.add({"time": 100.0, "totals": {"pages": 0, "items": 0}})
    snap = {
        "time": 102.0,
        "totals": {"pages": 50, "items": 20},
        "namespace": "site",
        "paused": False,
        "queue": 0,
        "queue_slots": 0,
        "leased": 0,
        "delayed": 0,
        "dead": 0,
        "seen": 0,
        "start_urls": 0,
        "workers": [],
        "domains": [],
    }
    watch.add(snap)
    assert list(watch.rates["pages"]) == [25.0] and list(watch.rates["items"]) == [10.0]
    assert "pages/s      25.0" in watch.render(snap)
    assert sparkline([0, 5, 10], 10) == "▁▄█"


def test_start_urls_held_at_the_pending_cap_go_back_on_pause(
    demo_site, workers, redis_client, redis_url
):
    """Past DISTCRAWL_MAX_PENDING a worker's claimed start URLs stay claimed (not dropped);
    a pause gives them back to start_urls, and after the resume every one is crawled."""
    site = demo_site(pages=60, links=1, delay=0.2)
    urls = [site.url + path for path in sorted(site.expected_pages())]
    redis_client.lpush("site:start_urls", *urls)
    settings = {
        "DISTCRAWL_MAX_PENDING": 5,
        "DISTCRAWL_DOMAIN_CONCURRENCY": 2,
        "DISTCRAWL_START_URLS_BATCH": 20,
        "DISTCRAWL_IDLE_TIMEOUT": 3,
        "ROBOTSTXT_OBEY": False,
    }
    worker = workers(1, **settings, **FAST)
    claim_lists = lambda: redis_client.keys("site:claims:*")  # noqa: E731
    assert wait_until(lambda: any(redis_client.llen(k) for k in claim_lists()), timeout=60)
    assert cli.main(["--redis-url", redis_url, "pause", "site"]) == 0
    assert wait_until(lambda: not claim_lists(), timeout=20), worker.log()[-3000:]
    assert redis_client.exists("site:claimants") == 0
    assert redis_client.llen("site:start_urls") > 0
    assert cli.main(["--redis-url", redis_url, "resume", "site"]) == 0
    assert worker.wait(120) == 0, worker.log()[-3000:]
    assert set(page_fetches(site)) == site.expected_pages()
    assert redis_client.llen("site:start_urls") == 0
    log = worker.log()
    assert "'distcrawl/start_urls/given_back'" in log
    assert "'distcrawl/backpressure/start_urls_held'" in log


def test_the_domains_statistic_keeps_the_busiest_domains_only(demo_site, workers, redis_client):
    from distcrawl.extensions import DOMAINS_KEPT

    # a broad crawl's long tail, already there
    redis_client.zadd("site:domains", {f"d{n}.test": n for n in range(1, DOMAINS_KEPT + 6)})
    site = demo_site(pages=30)
    redis_client.lpush("site:start_urls", site.url + "/")
    w = workers(1, DISTCRAWL_IDLE_TIMEOUT=2, **FAST)
    assert w.wait(60) == 0, w.log()[-2000:]
    assert redis_client.zcard("site:domains") == DOMAINS_KEPT
    assert redis_client.zscore("site:domains", "127.0.0.1") >= 31  # this crawl's host
    assert redis_client.zscore("site:domains", f"d{DOMAINS_KEPT + 5}.test") is not None
    assert redis_client.zscore("site:domains", "d1.test") is None  # the quietest went


def monitor_of(redis_url: str, shards: int, cluster: bool = False) -> tuple[Any, Any]:
    """A WorkerMonitor of the crawl ``site`` on the test Redis, not attached to a crawl, and
    its RedisIO (to stop)."""
    from scrapy.utils.test import get_crawler

    from distcrawl.config import DistcrawlConfig
    from distcrawl.extensions import WorkerMonitor
    from distcrawl.model.connection import RedisIO
    from distcrawl.model.keys import FrontierKeys

    crawler = get_crawler(settings_dict={"REDIS_URL": redis_url, "DISTCRAWL_SHARDS": shards})
    io = RedisIO(redis_url, cluster=cluster)
    monitor = WorkerMonitor(crawler, DistcrawlConfig.from_settings(crawler.settings), io)
    monitor.keys = FrontierKeys("site")
    return monitor, io


@pytest.mark.parametrize("shards", [1, 3])
def test_revisit_gauges_count_the_backlog_and_its_age(redis_client, redis_url, shards):
    """distcrawl_revisits, distcrawl_revisits_due, distcrawl_revisits_overdue_seconds: read
    in the beat's round trip, per shard, on the server's clock."""
    from distcrawl.extensions import Beat
    from distcrawl.model.frontier import Frontier
    from distcrawl.model.keys import FrontierKeys
    from distcrawl.model.queue_entry import make_entry
    from distcrawl.model.records import Entry, EntryKind

    crawl = FrontierKeys("site").sharded(shards)
    parts = [crawl.of_shard(i) for i in range(shards)]

    def revisit(n: int, delay_ms: int) -> Entry:
        return Entry(EntryKind.REVISIT, b"fp%d" % n, 0, b"p", str(delay_ms).encode(), "h.test")

    for part in parts:  # in each shard: 2 due, 3 in an hour, 1 queued
        Frontier(redis_client, part).commit(
            [], [revisit(n, 0) for n in range(2)] + [revisit(n, 3_600_000) for n in range(2, 5)]
        )
        redis_client.zadd(part.revisit_queue, {make_entry("h.test", 0, 99, b"q"): 0})
    late_id = redis_client.zrange(parts[-1].revisits, 0, 0)[0]
    redis_client.zadd(parts[-1].revisits, {late_id: server_ms(redis_client) - 42_000})

    monitor, io = monitor_of(redis_url, shards)
    try:
        for _ in range(2):  # the first beat asks the server's time before it counts
            paused, monitor.sizes = monitor._publish(Beat({}, {}, {"state": "running"}))
            assert not paused
    finally:
        io.stop()
    sizes = monitor.sizes
    assert (sizes["revisits"], sizes["revisits_due"]) == (6 * shards, 3 * shards)
    metrics = dict(
        line.split() for line in monitor.metrics().splitlines() if not line.startswith("#")
    )
    assert metrics["distcrawl_revisits"] == str(6 * shards)
    assert metrics["distcrawl_revisits_due"] == str(3 * shards)
    assert 42 <= float(metrics["distcrawl_revisits_overdue_seconds"]) < 60
    assert "# TYPE distcrawl_revisits_overdue_seconds gauge" in monitor.metrics()


@pytest.mark.parametrize("cluster", [False, True], ids=["server", "cluster"])
@pytest.mark.parametrize("shards", [1, 4])
def test_frontier_gauges_add_up_every_shard(request, redis_client, redis_url, shards, cluster):
    """distcrawl_queue, distcrawl_leased, distcrawl_delayed are the crawl's totals: with
    DISTCRAWL_SHARDS above 1 the requests are in the shards' keys, none in the crawl's (on
    a cluster in other slots than the beat's, read in a pipeline of their own).
    distcrawl_dead counts as ``distcrawl status`` counts: the crawl's dead letters and those
    waiting in the shards' quarantines."""
    from redis.cluster import RedisCluster

    from distcrawl.extensions import Beat
    from distcrawl.model.frontier import Frontier
    from distcrawl.model.keys import FrontierKeys
    from distcrawl.model.records import Entry, EntryKind
    from distcrawl.model.sizes import read_frontier_sizes

    client = redis_client
    if cluster:
        nodes = request.getfixturevalue("redis_cluster")
        nodes.flush()
        redis_url = nodes.url_away_from("site:start_urls")
        client = RedisCluster.from_url(redis_url)
    crawl = FrontierKeys("site", cluster=cluster).sharded(shards)
    parts = [crawl.of_shard(i) for i in range(shards)]

    def request_(shard: int, n: int) -> Entry:
        slot = f"h{shard}-{n}.test"  # a slot each: a lease takes one of each
        return Entry(EntryKind.REQUEST, b"fp%d-%d" % (shard, n), 0, b"p", b"", slot)

    def retry(shard: int, n: int) -> Entry:
        return Entry(EntryKind.RETRY, b"rt%d-%d" % (shard, n), 0, b"p", b"3600000", "r.test")

    # shard i (of the last three): i + 2 requests, i of them leased, 4 - i retries waiting
    busy = parts[-3:] if shards > 1 else parts
    for i, part in enumerate(busy, start=1):
        frontier = Frontier(client, part)
        frontier.commit(
            [], [request_(i, n) for n in range(i + 2)] + [retry(i, n) for n in range(4 - i)]
        )
        assert len(frontier.lease(i, 600_000).items) == i
    queue, leased, delayed = (
        sum(client.zcard(getattr(p, name)) for p in parts)
        for name in ("queue", "leases", "delayed")
    )
    expected = (2, 1, 3) if shards == 1 else (6, 6, 6)
    assert (queue, leased, delayed) == expected
    if shards > 1:
        assert client.zcard(crawl.queue) == client.zcard(crawl.leases) == 0
    client.lpush(crawl.dead, b'{"reason":"a"}', b'{"reason":"b"}')
    for n, part in enumerate(busy[1:], start=1):  # quarantined, not moved yet
        client.lpush(part.dead, *[b'{"reason":"q"}'] * n)
    dead = 2 if shards == 1 else 2 + 1 + 2
    assert read_frontier_sizes(client, crawl, shards).dead == dead

    monitor, io = monitor_of(redis_url, shards, cluster=cluster)
    try:
        paused, monitor.sizes = monitor._publish(Beat({}, {}, {"state": "running"}))
    finally:
        io.stop()
        if cluster:
            client.close()
    assert not paused
    sizes = monitor.sizes
    assert (sizes["queue"], sizes["leased"], sizes["delayed"]) == expected
    metrics = dict(
        line.split() for line in monitor.metrics().splitlines() if not line.startswith("#")
    )
    assert (
        metrics["distcrawl_queue"],
        metrics["distcrawl_leased"],
        metrics["distcrawl_delayed"],
    ) == tuple(str(n) for n in expected)
    assert sizes["dead"] == dead
    assert metrics["distcrawl_dead"] == str(dead)
    assert metrics["distcrawl_revisits"] == "0"


def test_two_workers_on_one_metrics_port_say_so_in_one_line(demo_site, workers, redis_client):
    """Before: the second worker logged "Error caught on signal handler" with a traceback
    (CannotListenError) from spider_opened, and DISTCRAWL_METRICS_PORT took no range."""
    site = demo_site(pages=20)
    port = find_free_port()
    redis_client.lpush("site:start_urls", site.url + "/")
    first = workers(1, DISTCRAWL_METRICS_PORT=port, **FAST)
    assert first.wait_for_log("Prometheus metrics on"), first.log()
    second = workers(2, DISTCRAWL_METRICS_PORT=port, **FAST)
    assert second.wait_for_log("Prometheus metrics not served"), second.log()
    assert wait_until(lambda: len(page_fetches(site)) == 21, timeout=60)
    log = second.log()
    errors = [line for line in log.splitlines() if "] ERROR:" in line]
    assert len(errors) == 1 and f"DISTCRAWL_METRICS_PORT={port}" in errors[0], errors
    assert "Traceback" not in log and "signal handler" not in log
    assert second.alive()  # the crawl goes on without the endpoint

    # a range, as Scrapy's TELNETCONSOLE_PORT takes: the third worker finds a free port past
    # the first worker's (ten of them: other tests' servers may hold the next one)
    third = workers(3, DISTCRAWL_METRICS_PORT=f"[{port}, {port + 10}]", **FAST)
    assert third.wait_for_log("Prometheus metrics on"), third.log()
    found = re.search(r"Prometheus metrics on http://127\.0\.0\.1:(\d+)/metrics", third.log())
    assert found is not None and port < int(found[1]) <= port + 10, third.log()
    body = urllib.request.urlopen(f"http://127.0.0.1:{found[1]}/metrics", timeout=5).read()
    assert b"distcrawl_pages_total" in body
