"""Redis that answers but takes no write (full at maxmemory, a read-only replica, busy,
loading, a master down...) is an outage, not a refusal of a commit's content: nothing is
dead-lettered, the commit waits and goes again unchanged, and the crawl goes on when Redis
takes writes again. The errors are a real server's, read through redis-py 8, which strips
their code and raises a subclass."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
import redis
from redis._parsers.base import BaseParser

from distcrawl.codec.serialize import RequestCodec
from distcrawl.engine._batch_types import Batch, Commit
from distcrawl.engine.batch import Runner
from distcrawl.model.connection import auth_refusal
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.records import Entry, EntryKind
from distcrawl.model.refusals import outage_code, refused, reply_code
from distcrawl.testing.process import find_free_port
from tests.support import page_fetches, stat, wait_until

LEASE = {"lease_ms": 60_000, "worker_timeout_ms": 10_000}


def request(n: int) -> Entry:
    return Entry(EntryKind.REQUEST, f"p{n}".encode(), 0, f"f{n}".encode(), b"", "t.test")


def error_of(call) -> redis.RedisError:
    with pytest.raises(redis.RedisError) as caught:
        call()
    return caught.value


def fill(client: redis.Redis) -> None:
    """maxmemory below what Redis holds now, noeviction: every write is refused."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", max(1, client.info("memory")["used_memory"] // 2))


def test_a_full_redis_refuses_a_commit_as_an_outage_and_a_bad_entry_as_content(redis_client):
    frontier = Frontier(redis_client, FrontierKeys("t"))
    runner = Runner(frontier, RequestCodec(), **LEASE)
    frontier.commit([], [request(0)])
    fill(redis_client)
    oom = error_of(lambda: frontier.commit([], [request(1), request(2)]))
    print("a real server's OOM through redis-py:", type(oom).__name__, repr(str(oom)))
    assert "script:" in str(oom) and not str(oom).startswith("OOM")  # the code stripped
    assert reply_code(oom) == outage_code(oom) == "OOM" and not refused(oom)
    # the commit in a batch, as the scheduler sends it: an outage, and how full Redis is
    res = runner.run(Batch(commits=[Commit([], [request(3)], [])]))
    assert outage_code(res.commit_error) == "OOM" and not refused(res.commit_error)
    assert res.memory is not None and res.memory.used > res.memory.maxmemory > 0
    assert res.memory.policy == "noeviction"
    # a split commit's pieces are not dead-lettered for it either: the error goes up
    split = Commit([], [request(4), request(5)], [])
    split.split = True
    res = runner.run(Batch(commits=[split]))
    assert outage_code(res.commit_error) == "OOM" and res.split_dead == 0
    redis_client.config_set("maxmemory", 0)
    assert redis_client.llen("t:dead") == 0
    # a genuinely bad entry is still refused for its content, split out and dead-lettered
    bad = Entry(EntryKind.REQUEST, b"bad", 0, b"bad", b"", "a\0b")
    commit = Commit([], [request(6), bad, request(7)], [])
    content = error_of(lambda: frontier.commit([], commit.entries))
    assert refused(content) and reply_code(content) is None
    commit.split = True
    res = runner.run(Batch(commits=[commit]))
    assert res.commit_error is None and res.split_dead == 1
    assert redis_client.llen("t:dead") == 1 and redis_client.zcard("t:queue") == 3


def test_readonly_busy_and_masterdown_of_real_servers_are_outages(
    redis_server, redis_client, redis_replica
):
    # READONLY: a real replica after REPLICAOF, as a client left on the old master sees it
    replica = redis_replica(redis_server)
    with replica.client() as client:
        assert wait_until(lambda: client.info("replication")["master_link_status"] == "up", 10)
        frontier = Frontier(client, FrontierKeys("t"))
        readonly = error_of(lambda: frontier.commit([], [request(1)]))
    print("a real replica's READONLY:", type(readonly).__name__, repr(str(readonly)))
    assert isinstance(readonly, redis.exceptions.ReadOnlyError)
    assert outage_code(readonly) == "READONLY" and not refused(readonly)
    # MASTERDOWN: a replica whose master is gone, told not to serve stale data
    stale = redis_replica(redis_server)
    with stale.client() as client:
        client.config_set("replica-serve-stale-data", "no")
        client.replicaof("127.0.0.1", find_free_port())
        down = error_of(lambda: Frontier(client, FrontierKeys("t")).commit([], [request(1)]))
    print("a real replica's MASTERDOWN:", type(down).__name__, repr(str(down)))
    assert outage_code(down) == "MASTERDOWN" and not refused(down)
    # BUSY: a script running past busy-reply-threshold (lua-time-limit before Redis 7)
    redis_client.config_set("lua-time-limit", 50)

    def busy_script() -> None:
        with redis.Redis.from_url(redis_server.url) as other:
            other.eval(
                "local t = redis.call('TIME') local stop = t[1] * 1e6 + t[2] + 600000 "
                "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] > stop",
                0,
            )

    def running() -> bool:
        """Whether the script is past the threshold: then Redis answers BUSY to anyone."""
        try:
            redis_client.ping()
        except redis.ResponseError as exc:
            return str(exc).startswith("BUSY")
        return False

    frontier = Frontier(redis_client, FrontierKeys("t"))
    frontier.commit([], [])  # its scripts loaded before the busy one runs
    thread = threading.Thread(target=busy_script)
    thread.start()
    try:
        # on a loaded machine the thread's EVAL may start late: commit once it runs
        assert wait_until(running, 5, step=0.01)
        busy = error_of(lambda: frontier.commit([], [request(1)]))
    finally:
        thread.join(10)
    print("a real server's BUSY:", type(busy).__name__, repr(str(busy)))
    assert outage_code(busy) == "BUSY" and not refused(busy)
    # NOREPLICAS: a master told to take writes only with a replica, once it has none
    replica.stop()
    redis_client.config_set("min-replicas-to-write", 1)
    lonely = error_of(lambda: Frontier(redis_client, FrontierKeys("t")).commit([], [request(1)]))
    print("a real server's NOREPLICAS:", type(lonely).__name__, repr(str(lonely)))
    assert outage_code(lonely) == "NOREPLICAS" and not refused(lonely)


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        ("LOADING Redis is loading the dataset in memory", "LOADING"),
        ("TRYAGAIN Multiple keys request during rehashing of slot", "TRYAGAIN"),
        ("CLUSTERDOWN The cluster is down", "CLUSTERDOWN"),
        ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", None),
        ("NOREPLICAS Not enough good replicas to write.", "NOREPLICAS"),
        ("OOM command not allowed when used memory > 'maxmemory'. script: 1f, on @user_s:3.", None),
        ("READONLY You can't write against a read only replica. script: 1f, on @user_s:3.", None),
        ("NOPERM User w has no permissions to run the 'hset' command script: 1f", "NOPERM"),
        ("EXECABORT Transaction discarded because of previous errors.", "EXECABORT"),
    ],
)
def test_replies_a_server_cannot_easily_be_made_to_give_are_read_by_class_and_text(reply, code):
    """As redis-py's parser makes them from the reply (class, status code, stripped text),
    and as text only: Redis 6.2 wraps a script's failing command, a caller may re-raise."""
    parsed = BaseParser.parse_error(reply)
    want = code or reply.split(" ")[0]
    assert reply_code(parsed) == want and not refused(parsed)
    if type(parsed) is not redis.ResponseError:
        assert not str(parsed).startswith(want)  # redis-py stripped it: the class says it
    wrapped = f"Error running script (call to f_1f): @user_script:3: -{reply}"
    assert reply_code(redis.ResponseError(wrapped)) == want
    # the server's wording alone, code gone
    if want not in ("TRYAGAIN", "EXECABORT"):
        assert reply_code(redis.ResponseError(str(parsed))) == want


def test_nopermission_is_no_refusal_of_content(redis_server, redis_client):
    """An ACL refusal inside a script is the operator's to fix, never the entries' fault."""
    redis_client.acl_setuser(
        "w", enabled=True, passwords=["+pw"], keys=["~*"], commands=["+@all", "-zadd"]
    )
    with redis.Redis(port=redis_server.port, username="w", password="pw") as client:
        denied = error_of(lambda: Frontier(client, FrontierKeys("t")).commit([], [request(1)]))
    print("a real server's NOPERM:", type(denied).__name__, repr(str(denied)))
    assert reply_code(denied) == "NOPERM" and not refused(denied) and outage_code(denied) is None
    assert auth_refusal(denied) == "Redis refused the user's permissions"  # what the log says


def test_a_crawl_pauses_while_redis_is_full_and_goes_on_with_nothing_lost(
    demo_site, workers, redis_client
):
    """A real worker crawling the demo site; Redis reaches maxmemory (noeviction) mid-crawl,
    then is given room: nothing dead-lettered, every page fetched, one line saying it."""
    site = demo_site(pages=150, delay=0.2)
    redis_client.lpush("site:start_urls", site.url + "/")
    worker = workers(1, CONCURRENT_REQUESTS=4, ROBOTSTXT_OBEY=False, DISTCRAWL_IDLE_TIMEOUT=3)
    assert wait_until(lambda: len(page_fetches(site)) >= 20, timeout=60), worker.log()[-2000:]
    fill(redis_client)
    assert wait_until(lambda: stat_in_log(worker, "Redis"), timeout=30)
    time.sleep(2)  # the worker's batches fail; what it held is fetched
    during = len(page_fetches(site))
    leases = redis_client.zcard("site:leases")
    # start URLs pushed meanwhile (a push is a write Redis refuses too: put there by an
    # operator's hand, as it were, with room made for an instant)
    redis_client.config_set("maxmemory", 0)
    redis_client.lpush("site:start_urls", *[f"{site.url}/page/{n}" for n in range(5)])
    fill(redis_client)
    time.sleep(3)
    after_hold = len(page_fetches(site))
    unclaimed = redis_client.llen("site:start_urls")
    dead_while_full = redis_client.llen("site:dead")
    redis_client.config_set("maxmemory", 0)
    assert worker.wait(120) == 0, worker.log()[-3000:]
    log = worker.log()
    fates = page_fetches(site)
    missing = site.expected_pages() - set(fates)
    dead = [json.loads(r) for r in redis_client.lrange("site:dead", 0, -1)]
    full_lines = re.findall(r"Redis at \S+ is full \(used_memory \d+ of maxmemory \d+ bytes", log)
    print(
        f"full Redis: dead letters {len(dead)} (while full {dead_while_full}), "
        f"distcrawl/dead/refused {stat(worker, 'distcrawl/dead/refused')}, missing "
        f"{len(missing)} of {len(site.expected_pages())}, pages fetched while full "
        f"{after_hold - during} (leases held {leases}), start URLs left unclaimed {unclaimed} "
        f"of 5, 'is full' lines {len(full_lines)}"
    )
    assert not dead and stat(worker, "distcrawl/dead/refused") == 0
    assert "one part at a time" not in log  # no split: a full Redis says nothing of content
    assert not missing
    assert len(full_lines) == 1, log[-3000:]
    assert stat(worker, "distcrawl/redis_full") >= 1
    assert after_hold == during  # intake paused: nothing new leased or fetched while full
    assert unclaimed == 5  # nor start URLs claimed, which could not be stored either
    assert "Redis takes writes again" in log
    assert redis_client.zcard("site:queue") == redis_client.zcard("site:leases") == 0
    assert redis_client.hlen("site:requests") == 0


def stat_in_log(worker, _: str) -> bool:
    """The worker said its batches fail (before the fix: "refused"; after: "is full")."""
    log = worker.log()
    return " is full (" in log or "Redis refused a" in log


def test_a_worker_on_a_replica_waits_for_its_promotion_and_dead_letters_nothing(
    demo_site, workers, redis_server, redis_client, redis_replica
):
    """REDIS_URL names a read-only replica (a failover not yet done): every write is
    refused with a real READONLY; once the replica is promoted the crawl goes on."""
    site = demo_site(pages=30)
    redis_client.lpush("site:start_urls", site.url + "/")
    replica = redis_replica(redis_server)
    with replica.client() as client:
        assert wait_until(lambda: client.llen("site:start_urls") == 1, 10)
        worker = workers(1, REDIS_URL=replica.url, ROBOTSTXT_OBEY=False, DISTCRAWL_IDLE_TIMEOUT=2)
        assert worker.wait_for_log("read-only replica", timeout=30), worker.log()[-3000:]
        time.sleep(2)  # batches refused, retried
        assert not page_fetches(site) and client.llen("site:dead") == 0
        client.replicaof("NO", "ONE")  # promoted
        assert worker.wait(60) == 0, worker.log()[-3000:]
        log = worker.log()
        assert log.count("read-only replica") == 1 and "takes writes again" in log
        assert "one part at a time" not in log
        assert set(page_fetches(site)) == site.expected_pages()
        assert client.llen("site:dead") == 0 and client.zcard("site:queue") == 0
