"""distcrawl's Lua as a Redis function library (Redis 7+): ``distcrawl setup`` loads it, the
workers then send FCALL; a library of another version stops a worker at start; without one
the workers send EVALSHA as on Redis 6.2 (the rest of the suite runs that way)."""

from __future__ import annotations

import json

import pytest
import redis

from distcrawl.cli import main
from distcrawl.model import lua
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.testing.redis_server import RedisServer
from tests.support import page_fetches

SITE = FrontierKeys("site")


def pairs(reply: list) -> dict:
    """A RESP2 map reply (name, value, name, value ...) as a dict."""
    return dict(zip(reply[::2], reply[1::2], strict=True))


@pytest.mark.valkey
def test_setup_loads_the_library_once_and_again(capsys, redis_url, redis_client):
    assert lua.loaded_version(redis_client) is None
    assert main(["--redis-url", redis_url, "--json", "setup"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "library": "distcrawl",
        "version": lua.library_version(),
    }
    assert lua.loaded_version(redis_client) == lua.library_version()
    assert main(["--redis-url", redis_url, "setup"]) == 0  # REPLACE: an upgrade's step
    assert capsys.readouterr().out == (
        f"loaded the function library 'distcrawl' version {lua.library_version()}\n"
    )
    [library] = [pairs(raw) for raw in redis_client.function_list()]
    functions = {pairs(f)[b"name"].decode() for f in library[b"functions"]}
    assert {lua.function_name(n) for n in lua.NAMES} <= functions
    assert {"distcrawl_commit_bloom", "distcrawl_seen_bloom", lua.VERSION_FUNCTION} <= functions


def test_the_version_changes_with_any_script():
    before = lua.library_version()
    source = lua.source
    try:
        lua.source = lambda name: source(name) + ("\n-- changed" if name == "sent" else "")  # type: ignore[assignment]
        lua.library_version.cache_clear()
        assert lua.library_version() != before
    finally:
        lua.source = source  # type: ignore[assignment]
        lua.library_version.cache_clear()
    assert lua.library_version() == before


@pytest.mark.parametrize("loaded", [False, True])
@pytest.mark.valkey
def test_a_frontier_runs_its_scripts_either_way(loaded, redis_client):
    """The same frontier steps, by EVALSHA or FCALL; the server's own counters say which."""
    if loaded:
        lua.load_library(redis_client)
    redis_client.config_resetstat()
    frontier = Frontier(redis_client, SITE, tag="0a0b0c0d")
    frontier.add_seen([b"f" * 16])
    assert frontier.has_seen([b"f" * 16, b"g" * 16]) == [True, False]
    frontier.record_crawl_delay("a.test", 100, fetched=True)
    assert frontier.scripts.mode.functions is loaded
    calls = redis_client.info("commandstats")
    used, unused = ("cmdstat_fcall", "cmdstat_evalsha") if loaded else ("cmdstat_evalsha", "")
    assert calls[used]["calls"] >= 3
    assert unused not in calls


def test_a_worker_refuses_a_library_of_another_version(demo_site, workers, redis_client):
    stale = (
        "#!lua name=distcrawl\n"
        "redis.register_function{function_name='distcrawl_version', "
        "callback=function() return '0123456789abcdef' end, flags={'no-writes'}}\n"
    )
    redis_client.function_load(stale)
    site = demo_site(pages=5)
    redis_client.lpush(SITE.start_urls, site.url + "/")
    w = workers(1, DISTCRAWL_IDLE_TIMEOUT=2)
    assert w.wait(60) != 0, w.log()[-3000:]
    assert (
        "Redis holds distcrawl's function library version 0123456789abcdef, this distcrawl "
        f"needs {lua.library_version()}: stop the workers of the other version and run "
        "`distcrawl setup`"
    ) in w.log()
    assert page_fetches(site) == {}
    assert redis_client.llen(SITE.start_urls) == 1  # nothing taken

    # the library of this version loaded: the same worker crawls, through FCALL
    lua.load_library(redis_client)
    w = workers(2, DISTCRAWL_IDLE_TIMEOUT=2)
    assert w.wait(60) == 0, w.log()[-3000:]
    assert set(page_fetches(site)) == site.expected_pages()
    assert "Lua: distcrawl's function library" in w.log()


def test_loaded_version_without_functions_is_none(redis_client):
    """A user without FCALL (or Redis 6.2, which has no FCALL) goes the EVALSHA way."""
    redis_client.execute_command("ACL", "SETUSER", "nofcall", "on", ">pw", "~*", "+@all", "-fcall")
    port = redis_client.connection_pool.connection_kwargs["port"]
    client = redis.Redis(port=port, username="nofcall", password="pw")
    try:
        lua.load_library(redis_client)
        assert lua.loaded_version(client) is None
        assert lua.loaded_version(redis_client) == lua.library_version()
    finally:
        client.close()


def test_a_worker_user_of_functions_without_the_library_says_what_to_do(
    capsys, monkeypatch, demo_site, workers, redis_server, redis_client
):
    """``distcrawl acl`` grants FCALL only: before ``distcrawl setup`` the worker cannot run
    a script either way and stops at start with what to do (nothing taken, no retry loop)."""
    from tests.test_acl import create_users

    _, worker_url = create_users(capsys, monkeypatch, redis_server)
    site = demo_site(pages=5)
    redis_client.lpush(SITE.start_urls, site.url + "/")
    w = workers(1, REDIS_URL=worker_url, DISTCRAWL_IDLE_TIMEOUT=2)
    assert w.wait(60) != 0, w.log()[-3000:]
    assert "refuses this user EVALSHA: run `distcrawl setup` as an administrator" in w.log()
    assert page_fetches(site) == {} and redis_client.llen(SITE.start_urls) == 1


class NoFunctionsRedis(RedisServer):
    """A redis-server without FCALL and FUNCTION, as Redis 6.2 answers them."""

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--rename-command",
            "FCALL",
            "",
            "--rename-command",
            "FUNCTION",
            "",
        ]


@pytest.mark.integration
def test_without_functions_setup_says_so_and_scripts_go_as_evalsha(capsys, tmp_path):
    with NoFunctionsRedis(directory=tmp_path / "nofunctions") as server:
        client = server.client()
        try:
            assert main(["--redis-url", server.url, "setup"]) == 1
            assert "this Redis has no functions (Redis 7 or later)" in capsys.readouterr().err
            assert lua.loaded_version(client) is None
            frontier = Frontier(client, SITE, tag="0a0b0c0d")
            frontier.add_seen([b"f" * 16])
            assert frontier.has_seen([b"f" * 16]) == [True]
            assert frontier.scripts.mode.functions is False
        finally:
            client.close()
