"""Nothing lost, whatever happens to a worker or to Redis: real worker processes killed,
stopped, exited between two commits, cut off from a reply, and Redis emptied under them.

Counts come from the demo site's own request log and from Redis, not from the workers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from distcrawl.codec.serialize import RequestCodec
from distcrawl.model.lua import script_source
from distcrawl.model.queue_entry import parse_entry
from distcrawl.testing.workers import worker_agent
from tests.hooks import EXIT_STATUS
from tests.support import page_fetches, stat, wait_until

FAST_DEATH = {"DISTCRAWL_WORKER_TIMEOUT": 3, "DISTCRAWL_HEARTBEAT_INTERVAL": 0.5}


def held_urls(redis_client, ns: str) -> set[str]:
    """URLs of the requests that have a record (leased, or retries waiting)."""
    codec = RequestCodec()
    out = set()
    for record in redis_client.hvals(f"{ns}:requests"):
        out.add(codec.decode_dict(parse_entry(record[8:]).payload)["u"])
    return out


def worker_tag(worker) -> str:
    assert worker.wait_for_log("distcrawl frontier"), worker.log()
    match = re.search(r"\(worker ([0-9a-f]{8}),", worker.log())
    assert match, worker.log()
    return match.group(1)


def test_a_parent_is_acknowledged_only_with_its_last_child(demo_site, workers, redis_client):
    """A page with 5,000 new links stored 500 at a time; the worker exits right after the
    k-th of those commits: either every child is in Redis, or the page is still leased."""
    site = demo_site(pages=1, leaves=5000)
    children = len(site.expected_pages()) - 1
    outcomes = []
    for k in range(1, 11):
        ns = f"fan{k}"
        redis_client.lpush(f"{ns}:start_urls", site.url + "/")
        worker = workers(
            k,
            SCHEDULER="tests.hooks.ExitAfterCommit",
            TEST_EXIT_AFTER_COMMIT=k,
            DISTCRAWL_NAMESPACE=ns,
            DISTCRAWL_PUSH_BATCH_SIZE=500,
            DISTCRAWL_LEASE_TIMEOUT=600,
            ROBOTSTXT_OBEY=False,
        )
        assert worker.wait(60) == EXIT_STATUS, worker.log()[-3000:]
        stored = redis_client.scard(f"{ns}:seen") - 1  # the seen-set holds "/" and children
        root_leased = site.url + "/" in held_urls(redis_client, ns)
        outcomes.append((k, stored, root_leased))
        assert root_leased or stored == children, (k, stored)
    print("exit after commit k -> (children stored, parent still leased):", outcomes)
    # the early exits really fell between the children's commits
    assert any(leased and stored < children for _, stored, leased in outcomes)


@pytest.mark.parametrize("kill_after", [1, 400])
def test_sigkill_with_thousands_of_children_in_flight_loses_none(
    demo_site, workers, redis_client, kill_after
):
    """SIGKILL mid-crawl of a page with 2,000 children; the per-domain limit as shipped, so
    the survivors can only go on once the dead worker's places are given back, long before
    its 600 s leases would expire."""
    site = demo_site(pages=1, leaves=2000)
    settings = {
        **FAST_DEATH,
        "DISTCRAWL_PUSH_BATCH_SIZE": 200,
        "DISTCRAWL_LEASE_TIMEOUT": 600,
        "DISTCRAWL_DOMAIN_CONCURRENCY": None,  # CONCURRENT_REQUESTS_PER_DOMAIN: 8
        "DISTCRAWL_IDLE_TIMEOUT": 3,
        "ROBOTSTXT_OBEY": False,
    }
    redis_client.lpush("site:start_urls", site.url + "/")
    victim = workers(1, **settings)
    assert wait_until(lambda: len(page_fetches(site)) >= kill_after, timeout=60)
    victim.kill()
    assert redis_client.zcard("site:leases") > 0  # it died holding leases
    pool = [workers(i, **settings) for i in (2, 3)]
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]
    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages()
    logs = "".join(w.log() for w in pool)
    assert "stopped sending liveness beats" in logs
    assert sum(stat(w, "distcrawl/dead_worker_released") for w in pool) > 0
    assert redis_client.zcard("site:queue") == redis_client.zcard("site:leases") == 0
    assert redis_client.hlen("site:requests") == 0 and redis_client.hlen("site:inflight") == 0


def test_a_dead_workers_domain_resumes_long_before_its_leases_expire(
    demo_site, workers, redis_client
):
    site = demo_site(pages=400, delay=0.15)
    settings = {
        "DISTCRAWL_LEASE_TIMEOUT": 60,
        "DISTCRAWL_DOMAIN_CONCURRENCY": None,
        "DISTCRAWL_IDLE_TIMEOUT": 3,
        "ROBOTSTXT_OBEY": False,
    }
    redis_client.lpush("site:start_urls", site.url + "/")
    victim = workers(1, **settings)
    assert wait_until(lambda: len(page_fetches(site)) >= 40, timeout=60)

    def stopped_holding_every_place() -> bool:
        # stopped first, so that no report of a freed place lands between the look and the
        # kill: a worker's count dips below the domain's concurrency from the report of a
        # place freed to the lease that takes it again
        os.kill(victim.pid, signal.SIGSTOP)
        if int(redis_client.hget("site:inflight", "127.0.0.1") or 0) >= 8:
            return True
        os.kill(victim.pid, signal.SIGCONT)
        return False

    # it dies holding every place of the domain
    assert wait_until(stopped_holding_every_place, timeout=30)
    victim.kill()
    killed = time.time()
    assert int(redis_client.hget("site:inflight", "127.0.0.1") or 0) >= 8
    survivor = workers(2, **settings)
    # the default worker timeout is 10 s, the lease 60 s: the dead-worker path frees the
    # domain's places
    assert survivor.wait_for_log("stopped sending liveness beats", timeout=40), survivor.log()
    assert survivor.wait(120) == 0, survivor.log()[-3000:]
    assert set(page_fetches(site)) == site.expected_pages()
    assert stat(survivor, "distcrawl/dead_worker_released") > 0
    # the survivor had no place on the domain until the dead worker's were given back:
    # about the worker timeout plus a reclaim interval, not the lease time
    resumed = min(
        line.time
        for line in site.read_log()
        if line.user_agent == worker_agent(2) and line.time > killed + 1
    )
    print(f"survivor's first fetch after the kill: {resumed - killed:.1f}s (lease: 60 s)")
    assert resumed - killed < 60


def test_a_stalled_workers_late_ack_is_a_no_op(demo_site, workers, redis_client):
    """SIGSTOP a worker while it holds the first page; its lease expires and another
    worker takes it; SIGCONT: the stalled worker's acknowledgement changes nothing."""
    site = demo_site(pages=20, links=3, delay=2.0)
    settings = {
        "DISTCRAWL_LEASE_TIMEOUT": 3,
        "DISTCRAWL_RECLAIM_INTERVAL": 0.5,
        "DISTCRAWL_WORKER_TIMEOUT": 120,  # only the lease's expiry takes it over
        "DISTCRAWL_IDLE_TIMEOUT": 6,
        "ROBOTSTXT_OBEY": False,
    }
    stalled = workers(1, **settings)
    worker_tag(stalled)
    redis_client.lpush("site:start_urls", site.url + "/")
    root = site.url + "/"
    assert wait_until(lambda: root in held_urls(redis_client, "site"), timeout=30)
    time.sleep(0.5)  # its download of "/" (2 s) is under way
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        other = workers(2, **settings)
        tag = bytes.fromhex(worker_tag(other))

        def taken_over() -> bool:
            records = redis_client.hvals("site:requests")
            return any(r.startswith(tag) for r in records)

        assert wait_until(taken_over, timeout=30)
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    for w in (stalled, other):
        assert w.wait(120) == 0, w.log()[-3000:]
    assert set(page_fetches(site)) == site.expected_pages()
    no_ops = stat(stalled, "distcrawl/ack/stale") + stat(stalled, "distcrawl/ack/missing")
    assert no_ops >= 1, stalled.log()[-3000:]
    assert "came after their leases were taken over" in stalled.log()
    assert redis_client.hlen("site:requests") == 0 and redis_client.zcard("site:leases") == 0


@pytest.mark.parametrize("loss", ["restart", "reset"])
def test_workers_go_on_after_redis_loses_everything(
    demo_site, workers, redis_server, redis_client, loss
):
    """Redis restarted without persistence, or the crawl reset, while workers hold leases:
    they go on with new ids, and no acknowledgement from before removes a request after."""
    before = demo_site(pages=300, delay=0.2, seed=1)
    after = demo_site(pages=150, seed=2)
    settings = {
        "DISTCRAWL_LEASE_TIMEOUT": 5,
        "DISTCRAWL_RECLAIM_INTERVAL": 0.5,
        "DISTCRAWL_IDLE_TIMEOUT": 6,
        "ROBOTSTXT_OBEY": False,
    }
    redis_client.lpush("site:start_urls", before.url + "/")
    pool = [workers(i, **settings) for i in (1, 2)]
    assert wait_until(lambda: len(page_fetches(before)) >= 40, timeout=60)
    assert redis_client.zcard("site:leases") > 0
    if loss == "restart":
        redis_server.restart()
    else:
        subprocess.run(
            [sys.executable, "-m", "distcrawl.cli", "reset", "site", "--yes", "--force"],
            env={**os.environ, "REDIS_URL": redis_server.url},
            check=True,
            capture_output=True,
            timeout=30,
        )
    redis_client.lpush("site:start_urls", after.url + "/")
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]
    fates = page_fetches(after)
    missing = after.expected_pages() - set(fates)
    stale = sum(stat(w, "distcrawl/ack/stale") + stat(w, "distcrawl/ack/missing") for w in pool)
    print(
        f"{loss}: pages after the loss fetched {len(fates)} of {len(after.expected_pages())}, "
        f"missing {len(missing)}; acknowledgements from before that were no-ops: {stale}"
    )
    assert not missing
    assert stale > 0  # the requests held at the loss did come back, and changed nothing
    assert redis_client.zcard("site:queue") == redis_client.zcard("site:leases") == 0
    assert redis_client.hlen("site:requests") == 0


def test_a_lost_commit_reply_stores_nothing_twice(demo_site, workers, redis_proxy, redis_client):
    """A proxy lets the first commit that stores a retry run in Redis, then drops its reply:
    the worker sends it again, Redis recognises it, and no retry is doubled."""
    site = demo_site(pages=40, links=3, fail_rate=0.5, fail_times=1, fail_mode="drop")
    sha = __import__("hashlib").sha1(script_source("commit", "set").encode()).hexdigest()

    def commit_with_a_retry(args: list[bytes]) -> bool:
        return args[0].upper() == b"EVALSHA" and args[1].decode() == sha and b"l" in args[3:]

    redis_proxy.drop_reply_once(commit_with_a_retry)
    redis_client.lpush("site:start_urls", site.url + "/")
    worker = workers(
        1,
        REDIS_URL=redis_proxy.url,
        DISTCRAWL_RETRY_BACKOFF_BASE=0.2,
        DISTCRAWL_IDLE_TIMEOUT=3,
        ROBOTSTXT_OBEY=False,
    )
    assert worker.wait(120) == 0, worker.log()[-3000:]
    assert redis_proxy.trap_fired.is_set()
    assert stat(worker, "distcrawl/commit/replayed") == 1
    all_fetches = page_fetches(site, ok_only=False)
    ok = page_fetches(site)
    assert set(ok) == site.expected_pages() and max(ok.values()) == 1
    assert max(all_fetches.values()) <= 2  # one failure, then one retry: never a doubled one
    assert redis_client.llen("site:dead") == 0 and redis_client.hlen("site:requests") == 0


def test_poison_queue_members_are_dead_lettered_once_and_idle_workers_close(
    demo_site, workers, redis_client
):
    site = demo_site(pages=30)
    good_slot = "127.0.0.1"
    poison = [
        good_slot.encode() + b"\0\x01\x02",  # too short to hold a priority and an id
        b"no separator at all",
        b"\xff\xfe\0" + b"\0" * 10 + b"payload",  # a slot that is not UTF-8
    ]
    redis_client.zadd("site:queue", dict.fromkeys(poison, 0))
    redis_client.zadd("site:ready", {good_slot: 0, b"\xff\xfe": 0})
    bad_slot = {"url": site.url + "/page/3", "meta": {"download_slot": "a\u0000b"}}
    redis_client.lpush("site:start_urls", json.dumps(bad_slot), site.url + "/")
    pool = [workers(i, DISTCRAWL_IDLE_TIMEOUT=3, ROBOTSTXT_OBEY=False) for i in (1, 2)]
    for w in pool:
        assert w.wait(120) == 0, w.log()[-3000:]
    assert set(page_fetches(site)) == site.expected_pages()
    records = [json.loads(r) for r in redis_client.lrange("site:dead", 0, -1)]
    assert len(records) == 4, records
    quarantined = [r for r in records if r["source"] == "queue"]
    raws = sorted(
        bytes.fromhex(r["raw_hex"]) if "raw_hex" in r else r["raw"].encode("latin-1")
        for r in quarantined
    )
    assert raws == sorted(poison)
    (start,) = [r for r in records if r["source"] == "start_urls"]
    assert "download_slot" in start["reason"] or "slot" in start["reason"]
    assert redis_client.hget("site:stats", "quarantined") == b"3"
    assert redis_client.zcard("site:queue") == 0 and redis_client.hlen("site:inflight") == 0


def test_a_start_url_pushed_as_the_last_worker_goes_idle_is_crawled(
    demo_site, workers, redis_client
):
    """An idle worker that polls start_urls rarely (DISTCRAWL_IDLE_POLL_MAX) gets an entry
    just before its idle timeout: it must not close before that entry is crawled."""
    site = demo_site(pages=3, links=1)
    worker = workers(1, DISTCRAWL_IDLE_TIMEOUT=2, DISTCRAWL_IDLE_POLL_MAX=5, ROBOTSTXT_OBEY=False)
    assert worker.wait_for_log("Frontier: "), worker.log()
    time.sleep(1.8)
    redis_client.lpush("site:start_urls", site.url + "/")
    assert worker.wait(60) == 0, worker.log()[-3000:]
    assert redis_client.llen("site:start_urls") == 0
    assert set(page_fetches(site)) == site.expected_pages()
    assert "the shared frontier is empty: closing" in worker.log()


def test_start_urls_claimed_by_a_worker_that_dies_are_crawled_by_others(
    demo_site, workers, redis_client
):
    """A worker exits right after claiming start_urls entries, before storing them: its
    claims go back to start_urls once its beats lapse, and the workers that start after it
    (new tags) crawl every start URL."""
    site = demo_site(pages=300, links=1)
    urls = [site.url + path for path in sorted(site.expected_pages())]
    redis_client.lpush("site:start_urls", *urls)
    settings = {
        **FAST_DEATH,
        "DISTCRAWL_START_URLS_BATCH": 10,
        "DISTCRAWL_IDLE_TIMEOUT": 3,
        "ROBOTSTXT_OBEY": False,
    }
    victim = workers(1, SCHEDULER="tests.hooks.ExitAfterClaim", TEST_EXIT_AFTER_CLAIM=3, **settings)
    assert victim.wait(60) == EXIT_STATUS, victim.log()[-3000:]
    tag = worker_tag(victim)
    assert redis_client.llen(f"site:claims:{tag}") == 10  # it died holding claims
    assert redis_client.sismember("site:claimants", tag)
    pool = [workers(i, **settings) for i in (2, 3)]
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]
    assert set(page_fetches(site)) == site.expected_pages()
    assert sum(stat(w, "distcrawl/start_urls/reclaimed") for w in pool) == 10
    assert "start URLs claimed by workers no longer alive" in "".join(w.log() for w in pool)
    assert redis_client.llen("site:start_urls") == 0
    assert redis_client.exists(f"site:claims:{tag}", "site:claimants") == 0
    assert redis_client.zcard("site:queue") == redis_client.zcard("site:leases") == 0


def test_two_workers_share_start_urls_and_give_back_claims_on_close(
    demo_site, workers, redis_client
):
    """Two workers claim from one list of start URLs: every page is fetched exactly once,
    and nothing stays claimed once they have closed."""
    site = demo_site(pages=300, links=1)
    urls = [site.url + path for path in sorted(site.expected_pages())]
    redis_client.lpush("site:start_urls", *urls)
    settings = {"DISTCRAWL_START_URLS_BATCH": 10, "DISTCRAWL_IDLE_TIMEOUT": 3}
    pool = [workers(i, ROBOTSTXT_OBEY=False, **settings) for i in (1, 2)]
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]
    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages()
    assert max(fetched.values()) == 1, [p for p, n in fetched.items() if n > 1]
    assert all(stat(w, "distcrawl/start_urls/read") > 0 for w in pool)
    assert redis_client.llen("site:start_urls") == 0
    assert redis_client.exists("site:claimants") == 0
    assert redis_client.keys("site:claims:*") == []
