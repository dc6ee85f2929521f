"""What the ``distcrawl acl`` users can reach, on a real redis-server: the producer reads
sizes and counters only, never a member of a key that holds request payloads (finding 1 of
issue 27); the worker of one crawl is held to that crawl's keys, whatever other crawls are
named (finding 2).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from scrapy.settings import Settings

from distcrawl import Producer
from distcrawl.admin import acl
from distcrawl.cli import main
from distcrawl.model.frontier import Frontier, shard_frontiers
from distcrawl.model.keys import FrontierKeys
from tests.test_acl import create_users

SITE = FrontierKeys("site")
#: what a pushed request's headers and meta carry, which the producer must never read back
SECRET = b"s3ss10n-Tok3n-Qx7"
WORKER_PASSWORD = "worker-pw-Hb43"


def settings(**overrides: Any) -> Settings:
    out = Settings()
    out.setmodule("distcrawl.settings", priority="project")
    for name, value in overrides.items():
        out.set(name, value, priority="cmdline")
    return out


def fill_crawl(redis_url: str, admin: redis.Redis, shards: int) -> list[FrontierKeys]:
    """A crawl in the state a running one has: requests with a Cookie and an Authorization
    header queued, leased (records in ``requests``), waiting for a retry and for a revisit,
    due revisits queued, a dead letter, a worker's claim of a start URL carrying meta, a
    heartbeat, counters, the pending cap. Returns the keys of the frontier's parts."""
    headers = {"Cookie": f"session={SECRET.decode()}", "Authorization": f"Bearer {SECRET.decode()}"}
    with Producer.from_url(redis_url, "site", settings(DISTCRAWL_SHARDS=shards)) as producer:
        for i in range(8):
            url = f"http://h{i % 4}.test/p{i}"
            assert producer.push(url, headers=headers, meta={"k": i}).ok
    parts = shard_frontiers(Frontier(admin, SITE, tag="0a0b0c0d"), shards if shards > 1 else None)
    for part in parts:
        k = part.keys
        [member, *_] = admin.zrange(k.queue, 0, 0)
        assert part.lease(1, 60_000).items, "nothing leased"
        admin.zadd(k.revisit_queue, {member: 0})  # a due revisit, laid out as the queue
        ids = list(admin.hkeys(k.requests))
        admin.zadd(k.delayed, {ids[0]: 1})
        admin.zadd(k.revisits, {ids[-1]: 2})
        admin.hset(k.stats, "quarantined", 0)
    crawl = parts[0].keys.sharded(1) if shards > 1 else SITE
    frontier = Frontier(admin, crawl, tag="0a0b0c0d")
    start = json.dumps({"url": "http://h9.test/", "meta": {"token": SECRET.decode()}})
    admin.lpush(crawl.start_urls, start, start)
    assert frontier.claim_start_urls(1)
    admin.lpush(crawl.dead, json.dumps({"url": "http://h1.test/", "payload": repr(SECRET)}))
    beat = {"host": "w1", "pid": 1, "state": "running", "tag": "0a0b0c0d", "pages": 3}
    admin.hset(crawl.workers, "w1-1", json.dumps(beat))
    admin.zadd(crawl.alive, {b"0a0b0c0d": 1})
    admin.hincrby(crawl.stats, "pages", 3)
    admin.zincrby(crawl.domains, 3, "h1.test")
    admin.set(crawl.paused, b"1")
    frontier.publish_settings(max_pending=1000)
    return [part.keys for part in parts]


def contents(client: redis.Redis, key: bytes) -> Any:
    """Everything ``key`` holds, read as an administrator; None for a key gone since it was
    listed (``<ns>:wake`` lives a second: on a loaded machine it can expire in between)."""
    read = {
        b"string": client.get,
        b"list": lambda k: client.lrange(k, 0, -1),
        b"set": client.smembers,
        b"zset": lambda k: client.zrange(k, 0, -1),
        b"hash": client.hgetall,
        b"none": lambda k: None,
    }
    return read[client.type(key)](key)


#: how the test calls each command a producer may be granted, on one key (``key``) and each
#: field its HASH has (``fields``); a granted command missing here fails the test, so that a
#: new grant is examined
KEYED: dict[str, Callable[[redis.Redis, bytes, list[bytes]], list[Any]]] = {
    "exists": lambda c, key, _: [c.exists(key)],
    "llen": lambda c, key, _: [c.llen(key)],
    "scard": lambda c, key, _: [c.scard(key)],
    "zcard": lambda c, key, _: [c.zcard(key)],
    "hlen": lambda c, key, _: [c.hlen(key)],
    "hget": lambda c, key, fields: [c.hget(key, f) for f in fields or [b"x"]],
    "hgetall": lambda c, key, _: [c.hgetall(key)],
    "zrange": lambda c, key, _: [c.zrange(key, 0, -1, withscores=True)],
    "zrevrange": lambda c, key, _: [c.zrevrange(key, 0, -1, withscores=True)],
    "lpush": lambda c, key, _: [c.lpush(key, b"http://x.test/")],
    "rpush": lambda c, key, _: [c.rpush(key, b"http://x.test/")],
}
#: commands of no key, run once each
KEYLESS: dict[str, Callable[[redis.Redis], Any]] = {
    "ping": lambda c: c.ping(),
    "select": lambda c: c.execute_command("SELECT", 0),
    "time": lambda c: c.time(),
    # a transaction is MULTI ... EXEC, whose reply holds those of the commands queued
    "multi": lambda c: c.pipeline(transaction=True).time().execute(),
    "exec": lambda c: c.pipeline(transaction=True).time().execute(),
}


def granted_commands(admin: redis.Redis, user: str) -> set[str]:
    """Every command granted to ``user``, in its root permissions or any selector."""
    info = admin.acl_getuser(user)
    # redis-py gives the root's commands as a list, each selector as [name, value, ...]
    rules = [*info["commands"]]
    for selector in info.get("selectors") or []:
        rules.append(dict(zip(selector[::2], selector[1::2], strict=True))["commands"])
    found: set[str] = set()
    for rule in rules:
        for token in rule.split():
            if token.startswith("+"):
                found.add(token[1:])
            elif token.startswith("-") and token != "-@all":
                pytest.fail(f"unexpected rule {token} in {rule!r}")
    return found


@pytest.mark.parametrize("shards", [1, 2])
def test_the_producer_reads_no_payload_byte(shards, capsys, monkeypatch, redis_server, redis_url):
    """Every command the producer is granted, on every key the crawl has (and every field of
    its HASHes): no reply carries a byte of a request's headers or meta. And ``push``,
    ``status`` and the pending cap still work through that user."""
    admin = redis.Redis.from_url(redis_url)
    producer_url, _ = create_users(capsys, monkeypatch, redis_server)
    producer = redis.Redis.from_url(producer_url)
    try:
        parts = fill_crawl(redis_url, admin, shards)
        keys = sorted(admin.scan_iter(count=1000))
        # the test would prove little if the secret were not where a producer could look
        holding = {k for k in keys if SECRET in repr(contents(admin, k)).encode()}
        for k in parts:
            assert {k.queue.encode(), k.requests.encode(), k.revisit_queue.encode()} <= holding
        assert SITE.dead.encode() in holding and SITE.claims("0a0b0c0d").encode() in holding

        granted = granted_commands(admin, "prod")
        assert granted - set(KEYED) - set(KEYLESS) == set(), "a grant the test does not run"
        replies: list[tuple[str, str, Any]] = []
        reached: set[bytes] = set()
        for key in [*keys, *(k.encode() for k in SITE.all())]:
            fields = list(admin.hkeys(key)) if admin.type(key) == b"hash" else []
            for command in sorted(granted & set(KEYED)):
                try:
                    got = KEYED[command](producer, key, fields)
                except redis.exceptions.NoPermissionError:
                    continue
                except redis.ResponseError as exc:  # WRONGTYPE: no member either
                    got = [str(exc)]
                reached.add(key)
                replies.append((command, key.decode(), got))
        for command in sorted(granted & set(KEYLESS)):
            replies.append((command, "", KEYLESS[command](producer)))
        leaks = [(c, k) for c, k, got in replies if SECRET in repr(got).encode()]
        assert leaks == [], leaks
        # it reaches the sizes of the payload keys, not nothing at all
        assert {k.queue.encode() for k in parts} <= reached

        # what push and status need still works as the producer
        capsys.readouterr()
        status = {}
        for url in (redis_url, producer_url):  # the producer sees what an administrator sees
            assert main(["--redis-url", url, "--json", "status", "site"]) == 0
            status[url] = json.loads(capsys.readouterr().out)
            del status[url]["time"]
            for worker in status[url]["workers"]:
                del worker["age"]  # the server's clock moved on
        assert status[producer_url] == status[redis_url]
        status = status[producer_url]
        assert status["leased"] >= len(parts) and status["dead"] == 1
        assert status["queue"] == 8 - status["leased"] + len(parts)  # + the due revisits
        assert [w["status"] for w in status["workers"]] == ["stale"]
        assert status["domains"] == [["h1.test", 3]] and status["paused"] is True
        assert main(["--redis-url", producer_url, "status", "site"]) == 0
        assert main(["--redis-url", producer_url, "push", "site", "http://n.test/"]) == 0
        with Producer.from_url(producer_url, "site", target="start_urls") as p:
            assert p.pending_room() is not None and p.dead_count() == 1
    finally:
        producer.close()
        admin.close()


# ---------------------------------------------------------------------- one crawl's worker

#: crawl names that start with ``site``: refused, or with keys no pattern of ``site`` matches
EXTENDING = [
    *("site:eu", "site:robotstxt", "site:0}", "{site", "site*", "site?", "site[x]", "site\\"),
    *("site2", "site-eu", "site.eu", "site_eu"),
]


def every_key(keys: FrontierKeys) -> list[str]:
    """Every key a crawl may have, fixed or per worker, host, Bloom part; on one server and
    on a cluster, with one shard and with two."""
    out: list[str] = []
    for named in (keys, keys.on_cluster(True)):
        parts = [named, *(named.sharded(2).of_shard(i) for i in range(2))]
        for k in parts:
            out += [*k.all(), k.claims("0a0b0c0d"), k.wake_of("0a0b0c0d"), k.bloom_part(0, 0)]
            out += [k.robots_txt("a.test"), k.robots_lock("a.test")]
    return sorted(set(out))


def make_worker(admin: redis.Redis, keys: FrontierKeys, name: str) -> redis.Redis:
    """The worker user ``distcrawl acl`` prints for ``keys``, created on the server."""
    user = acl.worker_user(keys, name, (f">{WORKER_PASSWORD}", False))
    admin.execute_command("ACL", "SETUSER", name, "reset", *user.rules)
    return redis.Redis(
        port=admin.connection_pool.connection_kwargs["port"],
        username=name,
        password=WORKER_PASSWORD,
    )


def reachable(worker: redis.Redis, keys: list[str]) -> list[str]:
    """The keys ``worker`` may read or write (EXISTS, then DEL of a key that is absent)."""
    found = []
    for key in keys:
        for command in ("EXISTS", "DEL"):
            try:
                worker.execute_command(command, key)
            except redis.exceptions.NoPermissionError:
                continue
            found.append(f"{command} {key}")
    return found


@pytest.mark.parametrize("name", EXTENDING)
def test_a_worker_reaches_no_key_of_a_crawl_whose_name_extends_its_own(
    name, capsys, redis_url, redis_client
):
    """The worker of ``site`` (``~site:*``) could write every key of crawl ``site:eu``; a
    crawl name that would let one crawl's patterns match another's is refused (by the CLI,
    the settings, the keys), and every other such name has keys out of ``site``'s reach
    (and ``site``'s keys out of its worker's reach)."""
    site_worker = make_worker(redis_client, SITE, "site-worker")
    try:
        assert reachable(site_worker, [SITE.queue, SITE.claims("0a0b0c0d")]) == [
            f"{c} {k}" for k in (SITE.queue, SITE.claims("0a0b0c0d")) for c in ("EXISTS", "DEL")
        ]
        try:
            other = FrontierKeys(name)
        except ValueError as exc:
            assert "may not contain" in str(exc)
            assert main(["acl", name]) == 2
            assert main(["--redis-url", redis_url, "push", name, "http://a.test/"]) == 2
            assert "a crawl name may not contain" in capsys.readouterr().err
            assert redis_client.dbsize() == 0
            return
        assert reachable(site_worker, every_key(other)) == []
        other_worker = make_worker(redis_client, other, "other-worker")
        try:
            assert reachable(other_worker, every_key(SITE)) == []
        finally:
            other_worker.close()
    finally:
        site_worker.close()
