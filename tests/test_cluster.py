"""A crawl on a Redis Cluster of three masters: real worker processes and a real cluster.

The workers are given the URL of a master that does NOT serve the crawl's slot, so every
command they send first proves that redirection works; every key the crawl creates must be
in the slot of ``site:start_urls`` (no CROSSSLOT is possible then). Counts come from the demo
site's own log.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from distcrawl.cli import main
from distcrawl.model.connection import make_redis
from distcrawl.model.keys import FrontierKeys
from distcrawl.testing.workers import worker_agent
from tests.cluster import REDIS_CLI, RedisClusterNodes
from tests.support import (
    Heard,
    assert_only_the_victims_leases_refetched,
    leases_held_by,
    page_fetches,
    wait_until,
)

SITE = FrontierKeys("site", cluster=True)


@pytest.fixture(autouse=True)
def empty_cluster(redis_cluster: RedisClusterNodes) -> None:
    """The cluster is shared by the module: each test starts from empty nodes."""
    redis_cluster.flush()


@pytest.fixture
def redis_url(redis_cluster: RedisClusterNodes) -> str:
    """A master that does not hold the crawl's slot: the workers' URL (``workers`` uses it)."""
    return redis_cluster.url_away_from(SITE.start_urls)


@pytest.fixture
def cluster_client(redis_url: str) -> Iterator[redis.Redis]:
    client = RedisCluster.from_url(redis_url)
    try:
        yield client  # type: ignore[misc]
    finally:
        client.close()


def lpush_with_redis_cli(nodes: RedisClusterNodes, url: str) -> None:
    """As a producer does, unchanged for a cluster but for ``-c`` (follow redirections)."""
    subprocess.run(
        [REDIS_CLI, "-c", "-p", str(nodes.ports[0]), "lpush", SITE.start_urls, url],
        check=True,
        capture_output=True,
        timeout=10,
    )


def assert_one_slot(nodes: RedisClusterNodes) -> None:
    """Every key of every node is a key of the crawl, in the slot of ``site:start_urls``, on
    the master serving that slot."""
    slot = nodes.keyslot(SITE.start_urls)
    owner = nodes.owner(slot)
    found = {port: nodes.keys_of(port) for port in nodes.ports}
    assert found[owner], "the crawl left no key at all"
    for port, keys in found.items():
        if port != owner:
            assert keys == [], (port, keys)
    for key in found[owner]:
        name = key.decode()
        assert name == SITE.start_urls or name.startswith("{site:start_urls}:"), name
        assert nodes.keyslot(key) == slot, name


def assert_drained(client: redis.Redis) -> None:
    assert client.zcard(SITE.queue) == 0
    assert client.zcard(SITE.leases) == 0
    assert client.hlen(SITE.requests) == 0
    assert client.llen(SITE.start_urls) == 0


@pytest.mark.valkey
def test_two_workers_crawl_every_page_once_through_a_node_without_the_slot(
    redis_cluster, demo_site, workers, cluster_client, redis_url
):
    site = demo_site(pages=300)
    lpush_with_redis_cli(redis_cluster, site.url + "/")
    pool = [workers(i, DISTCRAWL_IDLE_TIMEOUT=3) for i in (1, 2)]
    for w in pool:
        assert w.wait(120) == 0, w.log()[-3000:]

    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages()
    assert max(fetched.values()) == 1
    assert_drained(cluster_client)
    assert cluster_client.llen(SITE.dead) == 0
    for w in pool:
        assert "is a Redis Cluster node" in w.log()
        assert "ERROR" not in w.log(), w.log()[-3000:]
        assert "CROSSSLOT" not in w.log()
    assert_one_slot(redis_cluster)


def test_a_crawl_of_three_shards_spreads_over_the_three_masters(
    redis_cluster, demo_site, workers, cluster_client
):
    """DISTCRAWL_SHARDS=3: each shard's hash tag on its own master, each shard's keys in its
    one slot, the crawl's own keys in the slot of ``site:start_urls``; every page once.
    Before any test moves a slot: the module's tests share one cluster."""
    # 2,000 pages over 8 hosts (127.0.0.2-9)
    sites = [demo_site(pages=249, links=5, host=f"127.0.0.{i}") for i in range(2, 10)]
    for site in sites:
        lpush_with_redis_cli(redis_cluster, site.url + "/")
    pool = [workers(i, DISTCRAWL_SHARDS=3, DISTCRAWL_IDLE_TIMEOUT=3) for i in (1, 2)]
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]
        assert "CROSSSLOT" not in w.log() and "ERROR" not in w.log(), w.log()[-3000:]
    for site in sites:
        fetched = page_fetches(site)
        assert set(fetched) == site.expected_pages() and max(fetched.values()) == 1, site.url
    parts = [SITE.sharded(3).of_shard(i) for i in range(3)]
    owners = {redis_cluster.owner(redis_cluster.keyslot(p.seen)) for p in parts}
    assert len(owners) == 3  # one shard per master
    for port in redis_cluster.ports:
        for key in redis_cluster.keys_of(port):
            name = key.decode()
            home = [p for p in parts if name.startswith(p.prefix)]
            if home:
                assert redis_cluster.keyslot(key) == redis_cluster.keyslot(home[0].seen), name
            else:
                assert redis_cluster.keyslot(key) == redis_cluster.keyslot(SITE.start_urls), name
    assert sum(cluster_client.scard(p.seen) for p in parts) >= 8 * 250
    # the scripts were routed by distcrawl from the slot map, not by asking a node for their
    # keys (COMMAND GETKEYS, a round trip per script call)
    stats = [redis_cluster.node(port).info("commandstats") for port in redis_cluster.ports]
    calls = [
        sum(s.get(name, {}).get("calls", 0) for s in stats)
        for name in ("cmdstat_evalsha", "cmdstat_command|getkeys")
    ]
    assert calls[0] > 100 and calls[1] < calls[0] / 20, calls
    assert sum(cluster_client.zcard(p.queue) + cluster_client.zcard(p.leases) for p in parts) == 0


def test_wait_replicas_on_masters_without_a_replica_makes_no_commit_wait(
    redis_cluster, demo_site, workers
):
    """DISTCRAWL_WAIT_REPLICAS=1 on three masters that have no replica: each node's INFO
    replication says so before any WAIT, one warning per node, no commit waits the timeout."""
    from tests.test_shards import _linked_sites

    sites, args = _linked_sites(demo_site, count=3, pages=30)
    for site in sites:
        lpush_with_redis_cli(redis_cluster, site.url + "/")
    w = workers(
        1,
        spider_args=args,
        DISTCRAWL_SHARDS=3,
        DISTCRAWL_WAIT_REPLICAS=1,
        DISTCRAWL_WAIT_REPLICAS_TIMEOUT=2,
        DISTCRAWL_IDLE_TIMEOUT=3,
    )
    assert w.wait(120) == 0, w.log()[-3000:]
    for site in sites:
        assert set(page_fetches(site)) == site.expected_pages()
    stats = [redis_cluster.node(port).info("commandstats") for port in redis_cluster.ports]
    assert sum(s.get("cmdstat_wait", {}).get("calls", 0) for s in stats) == 0
    warned = re.findall(r"Redis at (\S+) has 0 connected replicas, fewer than", w.log())
    assert warned and len(warned) == len(set(warned)) <= 3, warned
    assert all(name.startswith("127.0.0.1:") for name in warned)
    assert "'distcrawl/commit/wait_skipped'" in w.log()


def test_memory_of_every_master_holding_a_shard_is_watched(redis_cluster, workers):
    """A master that holds only a shard (not the crawl's own keys) near its maxmemory is
    reported as loudly as the crawl's own master would be."""
    crawl_master = redis_cluster.owner(redis_cluster.keyslot(SITE.start_urls))
    parts = [SITE.sharded(3).of_shard(i) for i in range(3)]
    shard_only = next(
        port
        for port in (redis_cluster.owner(redis_cluster.keyslot(p.queue)) for p in parts)
        if port != crawl_master
    )
    node = redis_cluster.node(shard_only)
    try:
        used = int(node.info("memory")["used_memory"])
        node.config_set("maxmemory", used * 2)
        worker = workers(1, DISTCRAWL_SHARDS=3, DISTCRAWL_MAXMEMORY_WARN=0.4)
        assert wait_until(lambda: "of maxmemory" in worker.log(), timeout=30), worker.log()
        assert "ERROR: Redis memory at" in worker.log()
    finally:
        node.config_set("maxmemory", 0)
        node.close()


@pytest.mark.serial
def test_sigkill_of_a_worker_on_a_cluster_loses_no_page(
    redis_cluster, demo_site, workers, cluster_client
):
    site = demo_site(pages=300, delay=0.1)  # slow pages: the kill lands mid-crawl
    settings = {
        "DISTCRAWL_LEASE_TIMEOUT": 3,
        "DISTCRAWL_RECLAIM_INTERVAL": 0.5,
        "DISTCRAWL_IDLE_TIMEOUT": 5,
        "DISTCRAWL_WORKER_TIMEOUT": 3,
        "DISTCRAWL_HEARTBEAT_INTERVAL": 0.5,
    }
    lpush_with_redis_cli(redis_cluster, site.url + "/")
    victim, survivor = workers(1, **settings), workers(2, **settings)
    assert wait_until(lambda: len(page_fetches(site)) >= 80, timeout=60)
    victim.kill()
    killed_at = time.time()
    held = leases_held_by(cluster_client, SITE, victim.log())
    assert held > 0
    replacement = workers(3, **settings)

    for w in (survivor, replacement):
        assert w.wait(120) == 0, w.log()[-3000:]
    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages(), "pages missing after SIGKILL"
    assert_only_the_victims_leases_refetched(site, held, worker_agent(1))
    after = [line for line in site.read_log() if line.time > killed_at]
    assert any(line.user_agent == worker_agent(3) for line in after)
    assert_drained(cluster_client)
    assert_one_slot(redis_cluster)


def test_the_parked_reaper_gives_a_dead_workers_leases_back_on_a_cluster(cluster_client):
    """The elected parked worker's plain reads (batch.py ``_idle_reap``) carry TIME, which a
    cluster pipeline refuses: it is asked of the keys' node after the pipeline."""
    from distcrawl.codec.serialize import RequestCodec
    from distcrawl.engine._batch_types import Batch
    from distcrawl.engine.batch import Runner
    from distcrawl.model.frontier import Frontier
    from distcrawl.model.records import Entry, EntryKind

    dead = Frontier(cluster_client, SITE, tag="0a0b0c0d")
    dead.commit([], [Entry(EntryKind.REQUEST, b"fp", 0, b"payload", b"", "a.test")])
    assert len(dead.lease(5, 60_000).items) == 1
    seconds, _ = cluster_client.time(target_nodes=cluster_client.get_node_from_key(SITE.alive))
    cluster_client.zadd(SITE.alive, {"0a0b0c0d": (int(seconds) - 60) * 1000})  # died
    frontier = Frontier(cluster_client, SITE, tag="01020304")
    runner = Runner(frontier, RequestCodec(), lease_ms=30_000, worker_timeout_ms=10_000)
    res = runner.run(Batch(idle_reap=True))
    assert res.error is None, res.error
    assert res.requeue is not None and res.requeue.dead_workers == 1
    assert cluster_client.zcard(SITE.leases) == 0
    assert cluster_client.zcard(SITE.queue) == 1


def test_cli_status_dead_and_reset_on_a_cluster(redis_cluster, cluster_client, redis_url, capsys):
    assert main(["--redis-url", redis_url, "push", "site", "http://a.example/"]) == 0
    cluster_client.lpush(SITE.dead, json.dumps({"reason": "boom", "url": "http://b.example/"}))
    capsys.readouterr()

    assert main(["--redis-url", redis_url, "--json", "status", "site"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["start_urls"], status["dead"]) == (1, 1)

    assert main(["--redis-url", redis_url, "--json", "dead", "list", "site"]) == 0
    assert [r["url"] for r in json.loads(capsys.readouterr().out)] == ["http://b.example/"]
    assert main(["--redis-url", redis_url, "--cluster", "yes", "dead", "count", "site"]) == 0
    assert capsys.readouterr().out.strip() == "1"
    assert main(["--redis-url", redis_url, "pause", "site"]) == 0
    assert cluster_client.exists(SITE.paused) == 1
    assert main(["--redis-url", redis_url, "limit", "site", "a.example", "--delay", "2"]) == 0
    assert main(["--redis-url", redis_url, "--json", "domains", "site"]) == 0
    capsys.readouterr()
    assert main(["--redis-url", redis_url, "doctor", "site"]) == 0
    assert "no problems found" in capsys.readouterr().out
    cluster_client.set(SITE.robots_txt("a.example"), b"0 200\n")
    assert_one_slot(redis_cluster)

    assert main(["--redis-url", redis_url, "--json", "reset", "site", "--yes"]) == 0
    assert json.loads(capsys.readouterr().out) == {"removed": 5}
    assert all(redis_cluster.keys_of(port) == [] for port in redis_cluster.ports)
    # told it is a single server, the CLI names the keys as on one: Redis refuses (MOVED)
    assert main(["--redis-url", redis_url, "--cluster", "no", "dead", "count", "site"]) == 1


def test_make_redis_detects_a_cluster_node(redis_cluster, redis_url):
    client = make_redis(redis_url, cluster=None, socket_timeout=4.0)
    try:
        assert isinstance(client, RedisCluster)
        # a lost reply is never answered by sending the command again (redirections are
        # followed whatever this says), and the socket timeouts are kept
        assert client.retry.get_retries() == 0
        node = client.get_node_from_key(SITE.queue)
        kwargs = node.redis_connection.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (4.0, 4.0)
        client.set(SITE.paused, b"1")  # redirected to the slot's master
        assert client.get(SITE.paused) == b"1"
    finally:
        client.close()


def test_the_crawls_slot_migrates_to_another_master_mid_crawl(
    redis_cluster, demo_site, workers, cluster_client
):
    site = demo_site(pages=300, delay=0.05)
    lpush_with_redis_cli(redis_cluster, site.url + "/")
    pool = [workers(i, DISTCRAWL_IDLE_TIMEOUT=3) for i in (1, 2)]
    assert wait_until(lambda: len(page_fetches(site)) >= 60, timeout=60)
    slot = redis_cluster.keyslot(SITE.start_urls)
    source = redis_cluster.owner(slot)
    target = next(p for p in redis_cluster.ports if p != source)
    moved = redis_cluster.migrate_slot(slot, target)
    assert moved > 5
    assert redis_cluster.owner(slot) == target
    for w in pool:
        assert w.wait(120) == 0, w.log()[-3000:]

    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages()
    assert max(fetched.values()) == 1
    assert_drained(cluster_client)
    assert_one_slot(redis_cluster)


def test_a_shards_slot_migrates_to_another_master_mid_crawl(
    redis_cluster, demo_site, workers, cluster_client
):
    """DISTCRAWL_SHARDS=3: the slot of the shard that holds the site moves while two workers
    crawl it (their scripts are routed from their slot map: a MOVED must re-route them)."""
    from distcrawl.model.shards import shard_of_url

    site = demo_site(pages=300, delay=0.05, host="127.0.0.2")
    lpush_with_redis_cli(redis_cluster, site.url + "/")
    pool = [workers(i, DISTCRAWL_SHARDS=3, DISTCRAWL_IDLE_TIMEOUT=3) for i in (1, 2)]
    assert wait_until(lambda: len(page_fetches(site)) >= 60, timeout=60)
    part = SITE.sharded(3).of_shard(shard_of_url(site.url, 3))
    slot = redis_cluster.keyslot(part.queue)
    source = redis_cluster.owner(slot)
    target = next(p for p in redis_cluster.ports if p != source)
    moved = redis_cluster.migrate_slot(slot, target)
    assert moved > 5
    assert redis_cluster.owner(slot) == target
    for w in pool:
        assert w.wait(120) == 0, w.log()[-3000:]
        assert "CROSSSLOT" not in w.log()

    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages()
    assert max(fetched.values()) == 1
    assert cluster_client.zcard(part.queue) == 0 and cluster_client.zcard(part.leases) == 0


def test_acl_users_created_on_every_node_suffice(
    redis_cluster, demo_site, workers, capsys, monkeypatch, redis_url
):
    """The users ``distcrawl --cluster yes acl`` prints, created on every master: a crawl
    through the worker user and push/status through the producer, with no refusal."""
    monkeypatch.setenv("P_PW", "producer-pw-71")
    monkeypatch.setenv("W_PW", "worker-pw-36")
    argv = ["--cluster", "yes", "acl", "site"]
    argv += ["--producer-password-env", "P_PW", "--worker-password-env", "W_PW"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    for port in redis_cluster.ports:
        node = redis_cluster.node(port)
        try:
            for line in lines:
                node.execute_command(*line.split())
            node.acl_log_reset()
        finally:
            node.close()
    host = redis_url.removeprefix("redis://")
    producer_url = f"redis://site-producer:producer-pw-71@{host}"
    worker_url = f"redis://site-worker:worker-pw-36@{host}"
    try:
        # the worker user may FCALL only: the administrator loads the library on every master
        assert main(["--redis-url", redis_url, "setup"]) == 0
        site = demo_site(pages=60)
        assert main(["--redis-url", producer_url, "push", "site", site.url + "/"]) == 0
        worker = workers(1, REDIS_URL=worker_url, DISTCRAWL_IDLE_TIMEOUT=2)
        assert worker.wait(60) == 0, worker.log()[-3000:]
        assert set(page_fetches(site)) == site.expected_pages()
        assert "Lua: distcrawl's function library" in worker.log()
        capsys.readouterr()
        assert main(["--redis-url", producer_url, "--json", "status", "site"]) == 0
        assert json.loads(capsys.readouterr().out)["queue"] == 0
        assert main(["--redis-url", worker_url, "reset", "site", "--yes"]) == 0
        for port in redis_cluster.ports:
            node = redis_cluster.node(port)
            try:
                refused = [e for e in node.acl_log() if e.get("username") != "default"]
            finally:
                node.close()
            assert refused == [], (port, refused)
    finally:
        for port in redis_cluster.ports:
            node = redis_cluster.node(port)
            try:
                node.acl_deluser("site-producer", "site-worker")
                if node.info("replication")["role"] == "master":
                    node.function_flush()  # the other tests send EVALSHA
            finally:
                node.close()


def test_a_worker_started_before_redis_connects_once_it_answers(tmp_path, demo_site):
    """DISTCRAWL_REDIS_CLUSTER=auto needs an answer before anything is named: a worker whose
    Redis is not up yet keeps retrying the connection, then crawls as usual."""
    from distcrawl.testing.redis_server import RedisServer, find_free_port
    from distcrawl.testing.workers import Worker

    port = find_free_port()
    url = f"redis://127.0.0.1:{port}/0"
    site = demo_site(pages=20)
    worker = Worker(
        1,
        redis_url=url,
        settings={"DISTCRAWL_IDLE_TIMEOUT": 2, "DISTCRAWL_DOMAIN_CONCURRENCY": 64},
        log_path=tmp_path / "worker-1.log",
    ).start()
    server = RedisServer(port=port, directory=tmp_path / "redis")
    try:
        assert worker.wait_for_log("Redis unreachable"), worker.log()
        server.start()
        client = server.client()
        client.lpush("site:start_urls", site.url + "/")
        client.close()
        assert worker.wait(60) == 0, worker.log()[-3000:]
        assert set(page_fetches(site)) == site.expected_pages()
        assert "Traceback" not in worker.log()
    finally:
        worker.stop(timeout=10)
        server.stop()


def test_a_failover_of_the_crawls_master_loses_no_page(
    redis_cluster, demo_site, workers, redis_url
):
    """The master of the crawl's slot is SIGKILLed mid-crawl and its replica promoted: the
    workers see connection errors, keep their work, and go on with the new master. The replica
    is an earlier copy (replication is asynchronous), so a page may be fetched twice, never
    lost. Last in the module: it leaves a dead node behind."""
    slot = redis_cluster.keyslot(SITE.start_urls)
    master = redis_cluster.owner(slot)
    replica = redis_cluster.add_replica(master)
    site = demo_site(pages=300, delay=0.05)
    lpush_with_redis_cli(redis_cluster, site.url + "/")
    settings = {"DISTCRAWL_IDLE_TIMEOUT": 5, "DISTCRAWL_LEASE_TIMEOUT": 5}
    pool = [workers(i, **settings) for i in (1, 2)]
    assert wait_until(lambda: len(page_fetches(site)) >= 60, timeout=60)
    redis_cluster.kill(master)
    assert wait_until(lambda: redis_cluster.is_master(replica), timeout=30)
    for w in pool:
        assert w.wait(120) == 0, w.log()[-3000:]

    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages(), "pages lost in the failover"
    client = RedisCluster(host="127.0.0.1", port=replica)
    try:
        assert_drained(client)  # type: ignore[arg-type]
    finally:
        client.close()
    assert any("Redis unreachable" in w.log() for w in pool)


@pytest.mark.valkey
def test_a_hold_published_on_a_cluster_reaches_every_worker(redis_url, cluster_client):
    """The holds channel (engine/holds.py) on a cluster: a worker subscribes on the node of
    the crawl's slot, found from a node that does not serve it, and hears a hold published
    through the cluster client, whichever node that sends it to."""
    from distcrawl.codec.politeness import Hold

    heard = Heard(redis_url, SITE.holds, cluster=None)
    try:
        assert heard.listener.subscribed.wait(20)
        cluster_client.publish(SITE.holds, Hold("a.test", 2000).message())
        assert heard.got.wait(10)
        assert heard.holds == [Hold("a.test", 2000)]
    finally:
        heard.stop()
