"""``distcrawl migrate``: a paused crawl moved from one redis-server to a real 3-master Redis
Cluster (and back), with real worker processes before and after the move.

The witness of "nothing lost, nothing duplicated" is the demo site's own request log: every
page fetched exactly once over both halves of the crawl. The cluster URL given is a master
that does not serve the crawl's slot, so every write of the copy proves redirection.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from scrapy import Request

from distcrawl.admin import migrate, reshard
from distcrawl.cli import main
from distcrawl.codec.serialize import RequestCodec
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.shards import shard_of_url
from distcrawl.testing.redis_server import RedisServer
from tests.cluster import RedisClusterNodes
from tests.support import page_fetches, server_ms, wait_until

PLAIN = FrontierKeys("site")
TAGGED = FrontierKeys("site", cluster=True)


@pytest.fixture(autouse=True)
def empty_cluster(redis_cluster: RedisClusterNodes) -> None:
    """The cluster is shared by the module: each test starts from empty nodes."""
    redis_cluster.flush()


@pytest.fixture
def cluster_url(redis_cluster: RedisClusterNodes) -> str:
    return redis_cluster.url_away_from(TAGGED.start_urls)


@pytest.fixture
def cluster_client(cluster_url: str) -> Iterator[redis.Redis]:
    client = RedisCluster.from_url(cluster_url)
    try:
        yield client  # type: ignore[misc]
    finally:
        client.close()


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


#: a key of the crawl with less time than this to live is one a comparison leaves out
SHORT_LIVED_MS = 60_000


def contents(client: redis.Redis, keys: FrontierKeys) -> dict[str, Any]:
    """Every key of the crawl on ``client`` by its suffix (the name without the prefix), with
    its whole value read by type: what must be the same on both sides of a move. Keys that
    live less than a minute are left out: wake-up tokens (a second) and the reaper's election
    lock (``DISTCRAWL_RECLAIM_INTERVAL``) may expire between this listing and the migration's
    copy, which then rightly skips them."""
    names = [k.decode() for k in client.keys("*")] if not isinstance(client, RedisCluster) else []
    if isinstance(client, RedisCluster):
        names = [k.decode() for k in client.scan_iter(count=1000)]
    out: dict[str, Any] = {}
    for name in names:
        ttl = client.pttl(name)
        if ttl == -2 or 0 <= ttl < SHORT_LIVED_MS:  # gone since listed, or soon to go
            continue
        kind = client.type(name).decode()
        value = migrate._content(migrate.Side(client, keys, ""), name, kind)
        if kind == "set":
            value = sorted(value)
        short = "start_urls" if name == keys.start_urls else name.removeprefix(keys.prefix)
        assert short != name, f"{name} is not a key of the crawl"
        out[short] = (kind, value)
    return out


def seed_frontier(client: redis.Redis) -> dict[str, Any]:
    """A frontier as a crawl leaves it part way, without processes: queued requests, one
    leased by a worker since killed, a retry due later, start URLs claimed by that dead
    worker, seen fingerprints, a robots.txt with a TTL, paused."""
    frontier = Frontier(client, PLAIN, tag="0a0b0c0d")
    frontier.record_layout({"format": "1", "shards": "1", "seen": "set"})
    client.lpush(PLAIN.start_urls, *(f"http://s{i}.example/" for i in range(5)))
    assert frontier.claim_start_urls(2)
    client.sadd(PLAIN.seen, *(f"fp{i}".encode() for i in range(300)))
    client.hset(PLAIN.requests, mapping={f"r{i}": b"x" * 20 for i in range(200)})
    client.zadd(PLAIN.queue, {f"entry{i}".encode(): 0 for i in range(200)})
    client.zadd(PLAIN.leases, {b"r1": 123})
    client.set(PLAIN.robots_txt("a.example"), b"0 200\nUser-agent: *\n", px=600_000)
    client.hset(PLAIN.stats, mapping={"pages": 7})
    client.set(PLAIN.paused, b"1")
    return contents(client, PLAIN)


@pytest.mark.parametrize("seen", ["set", "bloom"])
def test_a_crawl_half_done_on_one_node_finishes_on_a_cluster_every_page_once(
    seen, redis_url, redis_client, cluster_url, cluster_client, demo_site, workers, capsys
):
    """Real workers crawl part of the site on one node, the crawl is paused and moved, and
    workers on the cluster finish it: the site's log shows every page once. With the Bloom
    seen-set, its parts (listed in its ``bloom`` HASH) must move too, or the cluster's workers
    would fetch the first half's pages again."""
    # a small Bloom filter: a few kB of parts, not the default 1e9 URLs' worth
    settings = {"DISTCRAWL_SEEN": seen, "DISTCRAWL_BLOOM_CAPACITY": 10_000}
    site = demo_site(pages=200, delay=0.05)
    assert run(capsys, "--redis-url", redis_url, "push", "site", site.url + "/")[0] == 0
    # one request at a time (about 20 pages/s): the pause lands well before the end
    slow = {"DISTCRAWL_DOMAIN_CONCURRENCY": 1, "DISTCRAWL_HEARTBEAT_INTERVAL": 0.5}
    first = workers(1, DISTCRAWL_IDLE_TIMEOUT=60, **slow, **settings)
    assert wait_until(lambda: len(page_fetches(site)) >= 40, timeout=60)
    assert run(capsys, "--redis-url", redis_url, "pause", "site")[0] == 0
    # paused: the worker finishes what it holds, then is stopped (a clean stop ends its beat)
    assert wait_until(lambda: redis_client.zcard(PLAIN.leases) == 0, timeout=30)
    first.stop()
    assert first.wait(5) == 0, first.log()[-3000:]
    before = page_fetches(site)
    with capsys.disabled():
        print(f"migrate test ({seen}): {len(before)} of {len(site.expected_pages())} pages before")
    assert 40 <= len(before) < len(site.expected_pages())
    assert redis_client.zcard(PLAIN.queue) > 0
    frontier = contents(redis_client, PLAIN)
    if seen == "bloom":
        assert any(name.startswith("bloom:") for name in frontier), sorted(frontier)

    code, out, err = run(
        capsys, "--redis-url", redis_url, "migrate", "site", "--to", cluster_url, "--delete-source"
    )
    assert code == 0, err
    assert "removed" in out
    with capsys.disabled():
        print(out)
    assert redis_client.keys("*") == []
    moved = contents(cluster_client, TAGGED)
    assert moved.pop("migration")[0] == "hash"
    assert moved == frontier
    assert cluster_client.exists(TAGGED.paused) == 1  # still paused there, until resumed

    assert run(capsys, "--redis-url", cluster_url, "resume", "site")[0] == 0
    pool = [workers(i, REDIS_URL=cluster_url, DISTCRAWL_IDLE_TIMEOUT=3, **settings) for i in (2, 3)]
    for w in pool:
        assert w.wait(120) == 0, w.log()[-3000:]
        assert "is a Redis Cluster node" in w.log()
        assert "ERROR" not in w.log(), w.log()[-3000:]
    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages(), "pages missing after the move"
    assert max(fetched.values()) == 1, [p for p, n in fetched.items() if n > 1]
    assert cluster_client.zcard(TAGGED.queue) == 0
    assert cluster_client.hlen(TAGGED.requests) == 0


def empty(cluster_client: redis.Redis) -> bool:
    return list(cluster_client.scan_iter(count=1000)) == []


def test_refused_unless_paused_and_no_worker_beats(
    redis_url, redis_client, cluster_url, cluster_client, capsys
):
    seed_frontier(redis_client)
    argv = ["--redis-url", redis_url, "migrate", "site", "--to", cluster_url]
    redis_client.delete(PLAIN.paused)
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert "not paused" in err
    redis_client.set(PLAIN.paused, b"1")
    redis_client.zadd(PLAIN.alive, {b"01020304": server_ms(redis_client) - 2000})
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert "1 worker(s) beat within the last 10s (01020304)" in err
    assert empty(cluster_client)
    assert redis_client.exists(PLAIN.migration) == 0

    # a beat older than the worker timeout is a dead worker's: its leases move as they are
    code, _, err = run(capsys, *argv, "--worker-timeout", "1")
    assert code == 0, err
    assert cluster_client.zcard(TAGGED.leases) == 1


def test_force_skips_the_checks(redis_url, redis_client, cluster_url, cluster_client, capsys):
    seed_frontier(redis_client)
    redis_client.delete(PLAIN.paused)
    argv = ["--redis-url", redis_url, "migrate", "site", "--to", cluster_url, "--force"]
    assert run(capsys, *argv)[0] == 0
    assert cluster_client.zcard(TAGGED.queue) == 200


def test_dry_run_lists_the_keys_and_writes_nothing(
    redis_url, redis_client, cluster_url, cluster_client, capsys
):
    before = seed_frontier(redis_client)
    code, out, err = run(
        capsys, "--redis-url", redis_url, "migrate", "site", "--to", cluster_url, "--dry-run"
    )
    assert code == 0, err
    assert "site:queue -> {site:start_urls}:queue: zset of 200, " in out
    assert "site:start_urls -> site:start_urls: list of 3" in out
    assert "site:claims:0a0b0c0d -> {site:start_urls}:claims:0a0b0c0d: list of 2" in out
    assert "site:robotstxt:a.example -> {site:start_urls}:robotstxt:a.example: string" in out
    assert f"{len(before)} keys" in out and "nothing written" in out
    assert empty(cluster_client)
    assert contents(redis_client, PLAIN) == before

    # not paused: still listed (to size the move beforehand), and what a run would refuse
    redis_client.delete(PLAIN.paused)
    code, out, err = run(
        capsys, "--redis-url", redis_url, "migrate", "site", "--to", cluster_url, "--dry-run"
    )
    assert code == 1
    assert "site:queue -> {site:start_urls}:queue" in out and "not paused" in err
    assert empty(cluster_client)


def test_an_interrupted_delete_of_the_source_finishes_when_run_again(
    redis_url, redis_client, cluster_url, cluster_client, capsys
):
    before = seed_frontier(redis_client)
    argv = ["--redis-url", redis_url, "migrate", "site", "--to", cluster_url]
    assert run(capsys, *argv)[0] == 0
    assert contents(redis_client, PLAIN).keys() == {*before, "migration"}  # source kept
    # the delete cut short: some keys gone, paused and the record are deleted last
    redis_client.unlink(PLAIN.queue, PLAIN.seen, PLAIN.start_urls)
    code, out, err = run(capsys, *argv, "--delete-source")
    assert code == 0, err
    assert "already migrated" in out and "removed" in out
    assert redis_client.keys("*") == []
    moved = contents(cluster_client, TAGGED)
    moved.pop("migration")
    assert moved == before
    code, out, err = run(capsys, *argv, "--delete-source")
    assert (code, out) == (1, "")
    assert "no crawl 'site' at the source" in err


def test_an_interrupted_run_finishes_when_run_again_and_then_is_a_no_op(
    redis_url, redis_client, cluster_url, cluster_client, capsys, monkeypatch
):
    before = seed_frontier(redis_client)
    argv = ["--redis-url", redis_url, "--json", "migrate", "site", "--to", cluster_url]
    copy = migrate.Migration._copy
    batches = []

    def cut_after_two(self, chunk, outcome):
        if len(batches) == 2:
            raise redis.ConnectionError("connection lost (simulated)")
        batches.append(len(chunk))
        copy(self, chunk, outcome)

    monkeypatch.setattr(migrate, "BATCH", 3)
    monkeypatch.setattr(migrate.Migration, "_copy", cut_after_two)
    code, out, err = run(capsys, *argv)
    assert (code, out) == (3, "")
    assert "cannot reach Redis" in err
    assert 0 < len(contents(cluster_client, TAGGED)) - 1 < len(before)

    monkeypatch.setattr(migrate.Migration, "_copy", copy)
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    outcome = json.loads(out)
    assert outcome["keys"] == len(before)
    # what the first run wrote is found identical (the DUMP of a hash table, the seen SET or
    # the requests HASH here, differs between servers, its content does not), the rest is
    # copied now
    assert outcome["unchanged"] == 6 and outcome["copied"] == len(before) - 6
    assert outcome["mismatches"] == [] and not outcome["already_done"]
    moved = contents(cluster_client, TAGGED)
    moved.pop("migration")
    assert moved == before

    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert json.loads(out)["already_done"] is True
    moved = contents(cluster_client, TAGGED)
    moved.pop("migration")
    assert moved == before
    assert contents(redis_client, PLAIN).keys() == {*before, "migration"}


def test_a_target_holding_another_crawl_of_that_name_is_refused(
    redis_url, redis_client, cluster_url, cluster_client, capsys
):
    seed_frontier(redis_client)
    cluster_client.zadd(TAGGED.queue, {b"another crawl's entry": 0})
    code, out, err = run(capsys, "--redis-url", redis_url, "migrate", "site", "--to", cluster_url)
    assert (code, out) == (1, "")
    assert "already holds a crawl 'site'" in err
    assert cluster_client.zcard(TAGGED.queue) == 1
    assert redis_client.exists(PLAIN.migration) == 0


def test_a_key_that_differs_after_the_copy_keeps_the_source(
    redis_url, redis_client, cluster_url, cluster_client, capsys, monkeypatch
):
    """Verification compares every key's size: a producer's LPUSH to the source during the
    copy (simulated here) is found, and --delete-source deletes nothing."""
    before = seed_frontier(redis_client)
    copy = migrate.Migration._copy

    def with_a_late_push(self, chunk, outcome):
        copy(self, chunk, outcome)
        redis_client.lpush(PLAIN.start_urls, b"http://late.example/")

    monkeypatch.setattr(migrate.Migration, "_copy", with_a_late_push)
    argv = ["--redis-url", redis_url, "migrate", "site", "--to", cluster_url, "--delete-source"]
    code, out, err = run(capsys, *argv)
    assert code == 1
    assert "differs: site:start_urls: list of 4, target list of 3" in err
    assert "the source is kept" in err
    assert redis_client.llen(PLAIN.start_urls) == 4
    assert contents(redis_client, PLAIN).keys() == {*before, "migration"}

    monkeypatch.setattr(migrate.Migration, "_copy", copy)
    code, out, err = run(capsys, *argv)  # run again: the late entry goes too
    assert code == 0, err
    assert "1 copied" in out and "removed" in out
    assert cluster_client.llen(TAGGED.start_urls) == 4
    assert redis_client.keys("*") == []


def test_a_cluster_crawl_moves_back_to_a_single_node(
    redis_url, redis_client, cluster_url, cluster_client, capsys, tmp_path
):
    before = seed_frontier(redis_client)
    argv = ["migrate", "site", "--delete-source"]
    assert run(capsys, "--redis-url", redis_url, *argv, "--to", cluster_url)[0] == 0
    other = RedisServer(directory=tmp_path / "back").start()
    try:
        code, out, err = run(capsys, "--redis-url", cluster_url, *argv, "--to", other.url)
        assert code == 0, err
        assert f"{len(before)} keys from {cluster_url} to {other.url}" in out
        assert empty(cluster_client)
        back = redis.Redis.from_url(other.url)
        try:
            moved = contents(back, PLAIN)
        finally:
            back.close()
    finally:
        other.stop()
    assert moved.pop("migration")[1][b"from"] == cluster_url.encode()
    assert moved == before


def test_credentials_are_never_printed_nor_stored(
    redis_url, redis_client, redis_cluster, capsys, tmp_path
):
    seed_frontier(redis_client)
    secret = "s3cret-Pw-91"
    target = f"redis://intruder:{secret}@127.0.0.1:{redis_cluster.ports[0]}/0"
    for extra in ([], ["--dry-run"], ["--json"]):
        argv = ["--redis-url", redis_url, "migrate", "site", "--to", target, *extra]
        code, out, err = run(capsys, *argv)
        assert (code, out) == (1, "")
        assert "error: Redis refused the password at the target redis://intruder:***@" in err
        assert secret not in err
    assert redis_client.exists(PLAIN.migration) == 0

    # a target that takes the password: the URLs the migration records keep are redacted too
    other = RedisServer(directory=tmp_path / "locked", password=secret).start()
    try:
        code, out, err = run(capsys, "--redis-url", redis_url, "migrate", "site", "--to", other.url)
        assert code == 0, err
        assert secret not in out + err and ":***@" in out
        record = redis_client.hgetall(PLAIN.migration)
        assert secret.encode() not in record[b"to"] and b":***@" in record[b"to"]
        locked = redis.Redis.from_url(other.url)
        try:
            assert locked.zcard(PLAIN.queue) == 200
        finally:
            locked.close()
    finally:
        other.stop()


def test_the_same_server_as_target_is_refused(redis_url, redis_client, capsys):
    """Same server, same names: --delete-source would delete the crawl it just "copied"."""
    before = seed_frontier(redis_client)
    argv = ["--redis-url", redis_url, "migrate", "site", "--to", redis_url, "--delete-source"]
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert "the same Redis server" in err
    assert contents(redis_client, PLAIN) == before


def test_the_json_outcomes_give_the_runs_counts_then_how_it_ended():
    """``--json`` prints each run's own counts first, then the fields the two runs share."""
    ending = ["mismatches", "deleted", "already_done", "seconds"]
    moved = migrate.Outcome(keys=3, copied=2, unchanged=1, deleted=3).as_dict()
    assert list(moved) == ["keys", "copied", "unchanged", "expired", *ending]
    assert (moved["keys"], moved["deleted"], moved["mismatches"]) == (3, 3, [])
    resharded = reshard.ReshardOutcome(1, 4, queued=7, seconds=0.5).as_dict()
    shards = ["from_shards", "to_shards", "queued", "retries", "dead_lettered", "seen"]
    assert list(resharded) == [*shards, *ending]
    assert (resharded["to_shards"], resharded["queued"], resharded["seconds"]) == (4, 7, 0.5)


def test_copy_batches_are_bounded_in_keys_and_bytes(monkeypatch):
    """A hundred large Bloom parts must not travel (and sit in memory) in one pipeline."""
    monkeypatch.setattr(migrate, "BATCH_BYTES", 100)
    infos = [
        migrate.KeyInfo(f"k{i}", f"k{i}", "string", 1, -1, n)
        for i, n in enumerate([60, 30, 20, 500, 10, 10] + [None] * 250)
    ]
    batches = [[i.source for i in b] for b in migrate._by_size(infos)]
    assert batches[:3] == [["k0", "k1"], ["k2"], ["k3"]]
    assert [len(b) for b in batches[3:]] == [100, 100, 52]
    assert sum(len(b) for b in batches) == len(infos)


# ---------------------------------------------------------------------- --shards N


def shards_of(count: int) -> list[FrontierKeys]:
    return PLAIN.parts(count)


def queue_entry(slot: str, seq: int, payload: bytes, priority: int = 0) -> bytes:
    prio = (2**31 - priority).to_bytes(4, "big")
    return slot.encode() + b"\0" + prio + seq.to_bytes(6, "big") + payload


def seed_sharded(client: redis.Redis, *, hosts: int = 30, per_host: int = 40) -> dict[str, Any]:
    """A paused frontier of one shard without processes: ``hosts`` x ``per_host`` queued
    requests of two priorities, retries waiting, fingerprints, limits, a Crawl-delay being
    read (dropped) and one known, a member that is no entry and one whose payload does not
    decode. Returns what must come out of it."""
    codec = RequestCodec()
    Frontier(client, PLAIN).record_layout({"format": "1", "shards": "1", "seen": "set"})
    entries, expected = {}, set()
    seq = 0
    for h in range(hosts):
        for p in range(per_host):
            seq += 1
            url = f"http://h{h}.example/{p}"
            payload = codec.encode(Request(url, priority=p % 2))
            entries[queue_entry(f"h{h}.example", seq, payload, p % 2)] = 0
            expected.add((f"h{h}.example", p % 2, payload))
    entries[b"no nul in this member"] = 0
    entries[queue_entry("bad.example", 999_999, b"mnot msgpack \xc1")] = 0
    client.zadd(PLAIN.queue, entries)
    retries = {}
    for r in range(5):
        seq += 1
        payload = codec.encode(Request(f"http://h{r}.example/retry"))
        ident = f"{seq:012x}"
        client.hset(PLAIN.requests, ident, b"\0" * 8 + queue_entry(f"h{r}.example", seq, payload))
        client.zadd(PLAIN.delayed, {ident: 1_000_000 + r})
        retries[payload] = 1_000_000 + r
    client.set(PLAIN.seq, seq)
    client.sadd(PLAIN.seen, *(f"fp{i}".encode() for i in range(2500)))
    client.hset(PLAIN.limits, mapping={"h1.example": "500:1"})
    client.hset(PLAIN.robots, mapping={"h2.example": "2000", "h3.example": "-99"})
    client.hset(PLAIN.stats, mapping={"pages": 7})
    client.set(PLAIN.paused, b"1")
    return {"queued": expected, "retries": retries, "seq": seq}


def resharded(client: redis.Redis, count: int) -> dict[str, Any]:
    """What the frontier of ``count`` shards holds, as seed_sharded describes it; checks
    that each request is in its URL's shard, ids are unique and below every seq."""
    codec = RequestCodec()
    queued: list[tuple[str, int, bytes]] = []
    retries: dict[bytes, float] = {}
    ids: list[int] = []
    for i, k in enumerate(shards_of(count)):
        seq = int(client.get(k.seq) or 0)
        members = client.zrange(k.queue, 0, -1)
        slots = set()
        for member in members:
            cut = member.index(b"\0")
            slot, payload = member[:cut].decode(), member[cut + 11 :]
            ident = int.from_bytes(member[cut + 5 : cut + 11], "big")
            assert ident <= seq
            ids.append(ident)
            priority = 2**31 - int.from_bytes(member[cut + 1 : cut + 5], "big")
            assert shard_of_url(codec.decode_dict(payload)["u"], count) == i
            queued.append((slot, priority, payload))
            slots.add(slot.encode())
        assert set(client.zrange(k.ready, 0, -1)) == slots  # every slot with requests ready
        for ident, due in client.zrange(k.delayed, 0, -1, withscores=True):
            record = client.hget(k.requests, ident)
            assert record[:8] == b"\0" * 8
            assert int(ident, 16) <= seq
            ids.append(int(ident, 16))
            payload = record[8:][record[8:].index(b"\0") + 11 :]
            assert shard_of_url(codec.decode_dict(payload)["u"], count) == i
            retries[payload] = due
    assert len(ids) == len(set(ids)), "an id given twice"
    assert len(queued) == len(set(queued)), "a request queued twice"
    return {"queued": set(queued), "retries": retries}


def old_layout_gone(client: redis.Redis) -> bool:
    state = [PLAIN.queue, PLAIN.requests, PLAIN.delayed, PLAIN.seen, PLAIN.seq, PLAIN.ready]
    return client.exists(*state) == 0


def test_a_seeded_frontier_is_resharded_to_four_and_back_losing_nothing(
    redis_url, redis_client, capsys
):
    seed = seed_sharded(redis_client)
    # an imported crawl's legacy seen-set (scrapy-redis fingerprints) goes with it
    redis_client.sadd(PLAIN.legacy_seen, *(b"legacy-%06d" % i for i in range(30)))
    argv = ["--redis-url", redis_url, "migrate", "site", "--shards", "4"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert "1 -> 4 shards: 1200 queued and 5 retries moved, 2 to the dead letters" in out
    assert redis_client.hget(PLAIN.meta, "shards") == b"4"
    moved = resharded(redis_client, 4)
    assert moved["queued"] == seed["queued"]
    assert moved["retries"] == seed["retries"]
    for k in shards_of(4):
        assert redis_client.scard(k.seen) == 2500  # every shard holds the whole seen-set
        assert redis_client.scard(k.legacy_seen) == 30
        assert redis_client.hgetall(k.limits) == {b"h1.example": b"500:1"}
        assert redis_client.hgetall(k.robots) == {b"h2.example": b"2000"}
        assert redis_client.zcard(k.queue) > 0
    dead = [json.loads(r) for r in redis_client.lrange(PLAIN.dead, 0, -1)]
    reasons = sorted(d["reason"] for d in dead)
    assert reasons[0].startswith("malformed queue entry: "), reasons
    assert reasons[1].startswith("undecodable payload"), reasons
    assert {d["source"] for d in dead} == {"queue"}
    assert old_layout_gone(redis_client)
    assert redis_client.hget(PLAIN.stats, "pages") == b"7"  # crawl-wide keys stay
    assert redis_client.exists(PLAIN.paused)
    assert not [f for f in redis_client.hkeys(PLAIN.migration) if f.startswith(b"reshard:")]

    code, out, err = run(capsys, *argv)  # a run again: nothing to do
    assert (code, out.strip()) == (0, "'site' already has 4 shard(s)"), err

    # and back to one: the shards' keys go, their dead letters and counters are the crawl's
    redis_client.lpush(shards_of(4)[1].dead, b'{"reason": "met in a shard"}')
    redis_client.hset(shards_of(4)[1].stats, "quarantined", 1)
    code, out, err = run(capsys, "--redis-url", redis_url, "migrate", "site", "--shards", "1")
    assert code == 0, err
    back = resharded(redis_client, 1)
    assert back["queued"] == seed["queued"] and back["retries"] == seed["retries"]
    assert redis_client.scard(PLAIN.seen) == 2500
    assert redis_client.scard(PLAIN.legacy_seen) == 30
    assert redis_client.llen(PLAIN.dead) == 3
    assert int(redis_client.hget(PLAIN.stats, "quarantined")) == 3
    assert [k for k in redis_client.keys("*") if k.startswith(b"{")] == []


def test_an_interrupted_reshard_finishes_when_run_again_nothing_lost_nor_twice(
    redis_url, redis_client, capsys, monkeypatch
):
    seed = seed_sharded(redis_client)
    monkeypatch.setattr(reshard, "BATCH", 100)
    progress = reshard.Resharding._progress
    calls = []

    def fail_midway(self, *args, **kwargs):
        calls.append(args[0])
        if len(calls) == 7:  # the queue part way
            progress(self, *args, **kwargs)
            raise redis.ConnectionError("cut short")
        return progress(self, *args, **kwargs)

    monkeypatch.setattr(reshard.Resharding, "_progress", fail_midway)
    argv = ["--redis-url", redis_url, "migrate", "site", "--shards", "4"]
    assert run(capsys, *argv)[0] != 0
    assert redis_client.hget(PLAIN.meta, "shards") == b"1"  # the old layout is still whole
    assert redis_client.zcard(PLAIN.queue) == 1202
    # a batch copied again after its progress was lost: the same ids, no second copy
    redis_client.hset(PLAIN.migration, "reshard:queue:0", 300)

    delete = reshard.Resharding.delete
    monkeypatch.setattr(reshard.Resharding, "delete", lambda self, source: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(argv)
    capsys.readouterr()
    assert redis_client.hget(PLAIN.meta, "shards") == b"4"  # switched, not yet deleted
    assert redis_client.zcard(PLAIN.queue) == 1202
    monkeypatch.setattr(reshard.Resharding, "delete", delete)
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    moved = resharded(redis_client, 4)
    assert moved["queued"] == seed["queued"]
    assert moved["retries"] == seed["retries"]
    assert redis_client.llen(PLAIN.dead) == 2
    assert old_layout_gone(redis_client)
    assert run(capsys, *argv)[:2] == (0, "'site' already has 4 shard(s)\n")


def test_reshard_refused_unless_paused_no_worker_beats_and_no_lease(
    redis_url, redis_client, capsys
):
    seed_sharded(redis_client, hosts=2, per_host=2)
    argv = ["--redis-url", redis_url, "migrate", "site", "--shards", "4"]
    redis_client.delete(PLAIN.paused)
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "") and "not paused" in err
    redis_client.set(PLAIN.paused, b"1")
    redis_client.zadd(PLAIN.alive, {b"01020304": server_ms(redis_client)})
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "") and "1 worker(s) beat within the last 10s (01020304)" in err
    redis_client.delete(PLAIN.alive)
    redis_client.zadd(PLAIN.leases, {b"000000000001": 1})
    code, out, err = run(capsys, *argv, "--force")  # --force never moves leases
    assert (code, out) == (1, "") and "1 request(s) leased" in err and "reaper" in err
    assert redis_client.hget(PLAIN.meta, "shards") == b"1"
    assert redis_client.exists(PLAIN.migration) == 0
    assert [k for k in redis_client.keys("*") if k.startswith(b"{")] == []
    redis_client.delete(PLAIN.leases)
    code, out, err = run(capsys, *argv, "--dry-run")
    assert code == 0 and "1 -> 4 shards, 6 queued requests" in out, err
    assert redis_client.exists(PLAIN.migration) == 0
    code, out, err = run(capsys, *argv, "--to", redis_url)
    assert code == 2 and "--shards re-shards on this Redis" in err


@pytest.mark.parametrize("seen", ["set", "bloom"])
def test_a_crawl_half_done_with_one_shard_finishes_with_four_every_page_once(
    seen, redis_url, redis_client, demo_site, workers, capsys
):
    """Real workers crawl part of three sites (hosts of three shards of four) with one shard;
    the crawl is paused, its worker stopped, re-sharded to four, and two workers with
    DISTCRAWL_SHARDS=4 finish it: every page of every site fetched once, none missing."""
    settings = {"DISTCRAWL_SEEN": seen, "DISTCRAWL_BLOOM_CAPACITY": 10_000}
    sites = [demo_site(pages=80, delay=0.05, host=f"127.0.0.{h}") for h in (2, 4, 5)]
    assert len({shard_of_url(s.url, 4) for s in sites}) == 3
    for site in sites:
        assert run(capsys, "--redis-url", redis_url, "push", "site", site.url + "/")[0] == 0
    slow = {"DISTCRAWL_DOMAIN_CONCURRENCY": 1, "DISTCRAWL_HEARTBEAT_INTERVAL": 0.5}
    first = workers(1, DISTCRAWL_IDLE_TIMEOUT=60, **slow, **settings)

    def fetched() -> int:
        return sum(len(page_fetches(s)) for s in sites)

    assert wait_until(lambda: fetched() >= 60, timeout=60)
    assert run(capsys, "--redis-url", redis_url, "pause", "site")[0] == 0
    assert wait_until(lambda: redis_client.zcard(PLAIN.leases) == 0, timeout=30)
    first.stop()
    assert first.wait(5) == 0, first.log()[-3000:]
    before = fetched()
    expected = sum(len(s.expected_pages()) for s in sites)
    with capsys.disabled():
        print(f"reshard test ({seen}): {before} of {expected} pages before")
    assert 60 <= before < expected
    queued = redis_client.zcard(PLAIN.queue)
    assert queued > 0

    argv = ["--redis-url", redis_url, "migrate", "site", "--shards", "4"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert f"1 -> 4 shards: {queued} queued" in out and "0 to the dead letters" in out
    assert old_layout_gone(redis_client)
    assert redis_client.exists(*(f"site:bloom:0:{p}" for p in range(4))) == 0
    assert redis_client.hget(PLAIN.meta, "shards") == b"4"
    assert run(capsys, *argv)[1] == "'site' already has 4 shard(s)\n"

    assert run(capsys, "--redis-url", redis_url, "resume", "site")[0] == 0
    pool = [workers(i, DISTCRAWL_SHARDS=4, DISTCRAWL_IDLE_TIMEOUT=3, **settings) for i in (2, 3)]
    for w in pool:
        assert w.wait(120) == 0, w.log()[-3000:]
        assert "] ERROR:" not in w.log(), w.log()[-3000:]
    for site in sites:
        pages = page_fetches(site)
        assert set(pages) == site.expected_pages(), f"pages of {site.url} missing"
        assert max(pages.values()) == 1, [p for p, n in pages.items() if n > 1]
    for k in shards_of(4):
        assert redis_client.zcard(k.queue) == redis_client.hlen(k.requests) == 0
    assert redis_client.llen(PLAIN.dead) == 0
    assert old_layout_gone(redis_client)


def test_moved_to_a_cluster_then_resharded_there(
    redis_url, redis_client, cluster_url, cluster_client, capsys
):
    """One node to a cluster of one shard (--to), then 4 shards there (--shards): the shards'
    keys spread over the masters, the switch is one transaction in the crawl's slot."""
    seed = seed_sharded(redis_client, hosts=10, per_host=10)
    argv = ["--redis-url", redis_url, "migrate", "site", "--to", cluster_url, "--delete-source"]
    assert run(capsys, *argv)[0] == 0
    code, out, err = run(capsys, "--redis-url", cluster_url, "migrate", "site", "--shards", "4")
    assert code == 0, err
    assert "1 -> 4 shards: 100 queued and 5 retries moved, 2 to the dead letters" in out
    moved = resharded(cluster_client, 4)
    assert moved["queued"] == seed["queued"] and moved["retries"] == seed["retries"]
    assert cluster_client.hget(TAGGED.meta, "shards") == b"4"
    assert cluster_client.llen(TAGGED.dead) == 2
    assert cluster_client.exists(TAGGED.queue, TAGGED.seen, TAGGED.delayed) == 0
    for k in shards_of(4):
        assert cluster_client.scard(k.seen) == 2500
