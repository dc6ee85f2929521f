"""Idle workers park (distcrawl/engine/idle.py): no poll, blocking reads that return when work
arrives, rare plain beats, one parked reaper an interval.

Issue 28's bounds: an idle worker costs at most one Redis command a second (the calls inside
scripts counted, as INFO counts them) and still takes a pushed URL within a second. The
timings here have margins for a loaded machine; benchmarks/idle.py measures them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from distcrawl.codec.serialize import RequestCodec
from distcrawl.engine._batch_types import Batch
from distcrawl.engine.batch import Runner
from distcrawl.engine.idle import BlockingWait, IdleWaits
from distcrawl.engine.liveness import Liveness
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.producer import Producer
from tests.support import page_fetches, push_to_first_fetch, wait_until
from tests.test_producer import project_settings

SITE = FrontierKeys("site")
TAG = "0a0b0c0d"


def commands(client: Any) -> int:
    return int(client.info("stats")["total_commands_processed"])


def server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


class Delivered:
    """What IdleWaits hands over, as the scheduler's reactor would get it."""

    def __init__(self) -> None:
        self.got: list[tuple[str, Any]] = []
        self.event = threading.Event()

    def __call__(self, kind: str, value: Any) -> None:
        self.got.append((kind, value))
        self.event.set()


@pytest.fixture
def waits(redis_server):
    made: list[IdleWaits] = []

    def factory(deliver: Delivered, **kwargs: Any) -> IdleWaits:
        w = IdleWaits(
            redis_server.url,
            SITE,
            TAG,
            socket_timeout=5.0,
            cluster=False,
            deliver=deliver,
            **kwargs,
        )
        made.append(w)
        return w

    yield factory
    for w in made:
        w.end_claims()
        w.stop()


def transactions(client: Any) -> int:
    """EXECs Redis ran (a MULTI/EXEC pipeline's end)."""
    return int(client.info("commandstats").get("cmdstat_exec", {}).get("calls", 0))


def blocked(client: Any) -> int:
    return int(client.info("clients")["blocked_clients"])


def test_a_parked_claim_moves_a_push_into_a_registered_claim_list(waits, redis_client):
    deliver = Delivered()
    w = waits(deliver, claim_wait=5.0, wake_wait=5.0)
    w.park(claims=True)
    assert wait_until(lambda: blocked(redis_client) == 2, timeout=5)
    # registered before anything can move: the reaper finds it if the worker dies now
    assert redis_client.sismember(SITE.claimants, TAG)
    redis_client.lpush(SITE.start_urls, "http://a.test/")
    assert deliver.event.wait(2)
    assert deliver.got == [("claimed", b"http://a.test/")]
    # never out of Redis: in this worker's claim list until a commit stores it
    assert redis_client.lrange(SITE.claims(TAG), 0, -1) == [b"http://a.test/"]
    assert redis_client.llen(SITE.start_urls) == 0
    assert wait_until(lambda: not w.claiming, timeout=2)  # one entry, then disarmed


def test_a_wake_up_token_ends_a_parked_wait(waits, redis_client):
    deliver = Delivered()
    w = waits(deliver, claim_wait=5.0, wake_wait=5.0)
    w.park(claims=False)
    assert wait_until(lambda: blocked(redis_client) == 1, timeout=5)
    redis_client.lpush(SITE.wake, "1")  # as commit.lua pushes them
    assert deliver.event.wait(2)
    assert deliver.got == [("woken", None)]
    assert redis_client.llen(SITE.wake) == 0


def test_a_close_ends_the_claim_wait_at_once_with_client_unblock(waits, redis_client):
    w = waits(Delivered(), claim_wait=10.0, wake_wait=10.0)
    w.park(claims=True)
    assert wait_until(lambda: blocked(redis_client) == 2, timeout=5)
    started = time.monotonic()
    w.end_claims()
    assert wait_until(lambda: not w.claiming, timeout=5)
    assert time.monotonic() - started < 2.0  # not the 10 s of the BLMOVE's timeout
    w.stop()  # the wake-up wait's connection is cut: it takes no token meant for others
    assert wait_until(lambda: blocked(redis_client) == 0, timeout=5)


def test_a_dead_parked_workers_claim_goes_back_with_the_parked_reaper(
    waits, redis_client, redis_server
):
    deliver = Delivered()
    w = waits(deliver, claim_wait=5.0, wake_wait=5.0)
    w.park(claims=True)
    assert wait_until(lambda: blocked(redis_client) == 2, timeout=5)
    redis_client.lpush(SITE.start_urls, "http://a.test/")
    assert deliver.event.wait(2)
    w.stop()
    # the worker died before storing it: its last beat is older than the worker timeout
    redis_client.zadd(SITE.alive, {TAG: server_ms(redis_client) - 60_000})
    frontier = Frontier(redis_client, SITE, tag="01020304")
    runner = Runner(frontier, RequestCodec(), lease_ms=30_000, worker_timeout_ms=10_000)
    res = runner.run(Batch(idle_reap=True))
    assert res.error is None
    assert res.requeue is not None and res.requeue.dead_workers == 1
    assert res.requeue.unclaimed == 1
    assert redis_client.lrange(SITE.start_urls, 0, -1) == [b"http://a.test/"]
    assert not redis_client.sismember(SITE.claimants, TAG)
    # elected for the interval: a second parked worker's look is left to the next one
    other = Runner(
        Frontier(redis_client, SITE, tag="05060708"),
        RequestCodec(),
        lease_ms=30_000,
        worker_timeout_ms=10_000,
    )
    again = other.run(Batch(idle_reap=True))
    assert again.requeue is None


def test_the_parked_reaper_reads_an_idle_frontier_with_plain_commands(redis_client):
    frontier = Frontier(redis_client, SITE, tag="01020304")
    runner = Runner(frontier, RequestCodec(), lease_ms=30_000, worker_timeout_ms=10_000)
    redis_client.zadd(SITE.alive, {"01020304": server_ms(redis_client)})
    runner.run(Batch(idle_reap=True))  # the client settles how it sends scripts (FCALL probe)
    redis_client.delete(SITE.reaper_idle)  # the next interval
    before = commands(redis_client)
    res = runner.run(Batch(idle_reap=True))
    spent = commands(redis_client) - before - 1  # the INFO above counts itself
    assert res.error is None and res.requeue is None  # nothing to reap: no script ran
    assert spent <= 6  # SET NX, then TIME, two ZRANGEs, ZDIFF, HLEN


@pytest.mark.serial
def test_an_idle_worker_costs_about_one_command_a_second_and_takes_a_push_at_once(
    demo_site, workers, redis_server, redis_client
):
    site = demo_site(pages=3)
    worker = workers(1)
    assert worker.wait_for_log("Frontier: 0 queued"), worker.log()
    # parked once its first lease poll found nothing: its waits block in Redis
    assert wait_until(lambda: blocked(redis_client) == 2, timeout=10)
    # and past its idle spell's one look at the whole crawl (Frontier.drained, a transaction
    # of 14 commands, at Scrapy's first idle heartbeat; the first transaction recorded the
    # layout at open): the window measures the steady cost
    assert wait_until(lambda: transactions(redis_client) >= 2, timeout=15)
    time.sleep(1.0)
    before, started = commands(redis_client), time.monotonic()
    time.sleep(15.0)
    spent = commands(redis_client) - before - 1
    per_second = spent / (time.monotonic() - started)
    print(f"idle worker: {per_second:.2f} commands/s")
    # issue 28's bound is 1, over a minute (benchmarks/idle.py); 15 s hold at most 5 beats,
    # 4 BLMOVEs, a BLPOP, a reaper's look (7) and a monitor beat (10): 27 commands, 1.8/s
    assert per_second <= 2.0, per_second
    delay = push_to_first_fetch(redis_server.port, "site:start_urls", site)
    print(f"push to first fetch: {delay:.3f}s")
    assert delay < 1.0, delay
    # the links it found reach the queue and are fetched: it left its park
    assert wait_until(lambda: len(page_fetches(site)) == 4, timeout=30)
    assert worker.alive()
    worker.stop()
    assert worker.proc.returncode == 0
    assert "ERROR" not in worker.log()


@pytest.mark.serial
def test_work_another_worker_commits_wakes_a_parked_worker(
    demo_site, workers, redis_server, redis_client
):
    site = demo_site(pages=3)
    worker = workers(1)
    assert worker.wait_for_log("Frontier: 0 queued"), worker.log()
    assert wait_until(lambda: blocked(redis_client) == 2, timeout=10)
    pushed_at = time.time()
    with Producer.from_url(redis_server.url, "site", project_settings()) as producer:
        producer.push(site.url + "/page/1")  # commit.lua: queued, with a wake-up token
    assert wait_until(lambda: "/page/1" in page_fetches(site), timeout=10)
    first = min(line.time for line in site.read_log() if line.path == "/page/1")
    print(f"commit to first fetch: {first - pushed_at:.3f}s")
    assert first - pushed_at < 1.0, first - pushed_at
    worker.stop()
    assert worker.proc.returncode == 0


@pytest.mark.serial
def test_a_redrive_wakes_a_parked_worker(demo_site, workers, redis_server, redis_client):
    from distcrawl.model.deadrecord import dead_letter

    site = demo_site(pages=3)
    worker = workers(1)
    assert worker.wait_for_log("Frontier: 0 queued"), worker.log()
    assert wait_until(lambda: blocked(redis_client) == 2, timeout=10)
    url = site.url + "/page/2"
    redis_client.lpush("site:dead", dead_letter("gave up: 503", url=url, source="retry"))
    pushed_at = time.time()
    with Producer.from_url(redis_server.url, "site", project_settings()) as producer:
        assert producer.redrive().redriven == 1  # redrive.lua: queued, with a wake-up token
    # within a second, not at the parked worker's next look at the frontier (30 s)
    assert wait_until(lambda: "/page/2" in page_fetches(site), timeout=10)
    first = min(line.time for line in site.read_log() if line.path == "/page/2")
    assert first - pushed_at < 1.0, first - pushed_at
    worker.stop()
    assert worker.proc.returncode == 0


class _Client:
    def close(self) -> None:
        pass


def test_a_claim_wait_that_comes_back_late_registers_the_claim_list_again():
    """A wait that returns far later than its timeout: the process was frozen, long enough
    perhaps to be taken for dead and have its claim list unregistered by the reaper; the
    next BLMOVE registers it again first (its ``fresh`` SADD)."""
    seen: list[bool] = []
    done = threading.Event()

    def command(client: Any, fresh: bool) -> bytes | None:
        seen.append(fresh)
        if len(seen) == 2:
            time.sleep(0.3)  # frozen past its wait (0) and the stall allowed (0.2)
        return b"x" if len(seen) == 4 else None

    wait = BlockingWait(
        "t", _Client, command, lambda _: done.set(), lambda _: None, wait=0.0, stall=0.2
    )
    wait.arm()
    assert done.wait(5)
    wait.stop()
    assert seen == [True, False, True, False]


def test_a_parked_beat_that_finds_its_tag_gone_says_so(redis_server, redis_client):
    liveness = Liveness(
        redis_server.url, SITE, TAG, interval=1.0, socket_timeout=5.0, idle_interval=10.0
    )
    readded: list[bool] = []
    liveness.on_readded = lambda: readded.append(True)
    try:
        liveness.beat()  # alive.lua: the server's time learnt
        liveness.idle(True)
        liveness.beat()  # a plain ZADD, the tag was there
        assert readded == []
        redis_client.zrem(SITE.alive, TAG)  # taken for dead by a reaper
        liveness.beat()
        assert readded == [True]  # the claim list is registered again (idle.py)
        assert redis_client.zscore(SITE.alive, TAG) is not None
    finally:
        liveness.stop(clean=True)
