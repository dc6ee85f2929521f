"""The layout record: workers that would corrupt each other's frontier refuse to join."""

from __future__ import annotations

from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.layout import (
    FORMAT_VERSION,
    GENERATION,
    Joined,
    Layout,
    LayoutMismatch,
    generation_op,
)
from distcrawl.testing.redis_server import RedisServer
from tests.support import page_fetches

LAYOUT = Layout(shards=1, seen="set", serializer="msgpack", fingerprinter="a.Fingerprinter")


def test_the_first_worker_records_its_layout_and_later_ones_read_it(redis_client):
    first = Frontier(redis_client, FrontierKeys("site"))
    recorded = first.record_layout(LAYOUT.fields())
    generation = recorded.pop(GENERATION)
    assert len(bytes.fromhex(generation)) == 8
    assert recorded == {
        "shards": "1",
        "seen": "set",
        "serializer": "msgpack",
        "fingerprinter": "a.Fingerprinter",
        "format": str(FORMAT_VERSION),
    }
    other = Layout(shards=1, seen="bloom", serializer="json", fingerprinter="a.Fingerprinter")
    second = Frontier(redis_client, FrontierKeys("site"))
    stored = second.record_layout(other.fields())
    assert stored["serializer"] == "msgpack"  # the first record stands
    assert stored[GENERATION] == generation
    assert other.differences(stored) == [
        "DISTCRAWL_SEEN: this worker 'bloom', the frontier 'set'",
        "DISTCRAWL_SERIALIZER: this worker 'json', the frontier 'msgpack'",
    ]
    assert LAYOUT.differences(stored) == []


def test_a_record_from_an_older_version_gains_the_fields_it_lacks(redis_client):
    redis_client.hset("site:meta", mapping={"format": FORMAT_VERSION, "serializer": "msgpack"})
    stored = Frontier(redis_client, FrontierKeys("site")).record_layout(LAYOUT.fields())
    assert LAYOUT.differences(stored) == []
    assert redis_client.hget("site:meta", "seen") == b"set"


def test_a_worker_rejoins_a_frontier_that_was_reset(redis_client):
    frontier = Frontier(redis_client, FrontierKeys("site"))
    stored = frontier.record_layout(LAYOUT.fields())
    joined = Joined(LAYOUT, stored[GENERATION])
    op = generation_op(frontier.keys)
    assert op.args == ["HGET", "site:meta", GENERATION]
    assert op.parse(redis_client.execute_command(*op.args)) == joined.generation
    assert joined.rejoin(joined.generation, frontier.record_layout) is None

    redis_client.flushdb()  # gone: this worker sets the frontier up again
    old = joined.generation
    seen = op.parse(redis_client.execute_command(*op.args))
    assert seen is None
    rejoined = joined.rejoin(seen, frontier.record_layout)
    assert rejoined is not None and rejoined.gone and rejoined.differences == []
    assert joined.generation not in (None, old)
    assert redis_client.hget("site:meta", GENERATION).decode() == joined.generation
    assert redis_client.hget("site:meta", "serializer") == b"msgpack"

    # set up anew by a worker with other settings: this one may not work in it
    redis_client.delete("site:meta")
    other = Layout(shards=1, seen="set", serializer="json", fingerprinter="a.Fingerprinter")
    theirs = frontier.record_layout(other.fields())[GENERATION]
    rejoined = joined.rejoin(theirs, frontier.record_layout)
    assert rejoined is not None and not rejoined.gone
    assert rejoined.differences == [
        "DISTCRAWL_SERIALIZER: this worker 'msgpack', the frontier 'json'"
    ]
    assert joined.generation == theirs


def test_another_format_version_is_a_difference():
    assert Layout(1, "set", "msgpack", "f", format=2).differences({"format": "1"}) == [
        "distcrawl's frontier format version: this worker '2', the frontier '1'"
    ]
    error = LayoutMismatch("site", ["DISTCRAWL_SEEN: this worker 'bloom', the frontier 'set'"])
    assert "'site'" in str(error) and "distcrawl reset" in str(error)


def test_a_worker_with_another_serializer_refuses_to_join_the_crawl(
    demo_site, workers, redis_client
):
    site = demo_site(pages=30)
    redis_client.lpush("site:start_urls", site.url + "/")
    first = workers(1, DISTCRAWL_IDLE_TIMEOUT=2)
    assert first.wait(60) == 0, first.log()[-3000:]
    assert len(page_fetches(site)) == 31
    assert redis_client.hget("site:meta", "serializer") == b"msgpack"

    redis_client.lpush("site:start_urls", site.url + "/page/1?again")
    odd = workers(2, DISTCRAWL_SERIALIZER="json", DISTCRAWL_IDLE_TIMEOUT=2)
    assert odd.wait(60) == 1, odd.log()[-3000:]
    assert "DISTCRAWL_SERIALIZER: this worker 'json', the frontier 'msgpack'" in odd.log()
    # it took nothing: the entry waits for a worker of the crawl
    assert redis_client.llen("site:start_urls") == 1
    assert redis_client.hget("site:meta", "serializer") == b"msgpack"


def test_a_worker_warns_when_redis_keeps_no_append_only_file(
    demo_site, workers, redis_client, tmp_path
):
    site = demo_site(pages=5)
    redis_client.lpush("site:start_urls", site.url + "/")
    without = workers(1, DISTCRAWL_IDLE_TIMEOUT=1)
    assert without.wait(60) == 0, without.log()[-3000:]
    assert "keeps no append-only file (appendonly no)" in without.log()

    with RedisServer(directory=tmp_path / "aof", appendonly=True) as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        # work to close after: the idle clock starts with the crawl's first work
        aof_client = server.client()
        aof_client.lpush("site:start_urls", site.url + "/")
        aof_client.close()
        with_aof = workers(2, REDIS_URL=url, DISTCRAWL_IDLE_TIMEOUT=1)
        assert with_aof.wait(60) == 0, with_aof.log()[-3000:]
        assert "distcrawl frontier 'site'" in with_aof.log()
        assert "append-only file" not in with_aof.log()
