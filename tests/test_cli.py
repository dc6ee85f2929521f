"""The ``distcrawl`` command against a real redis-server, run in-process through ``main``."""

from __future__ import annotations

import importlib.metadata
import io
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import scrapy

import distcrawl
from distcrawl.cli import main
from distcrawl.codec.serialize import RequestCodec
from distcrawl.codec.start_urls import parse_entry
from distcrawl.model.deadrecord import dead_letter
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import parse_entry as parse_queue_entry
from distcrawl.model.records import Entry, EntryKind
from distcrawl.testing.redis_server import RedisServer
from tests.support import server_ms

pytestmark = pytest.mark.timeout(60)

SITE = FrontierKeys("site")
SECRET_URL = "redis://:s3cret@127.0.0.1:1/0"


def run(capsys, redis_url, *argv):
    """``main`` with ``--redis-url``: (exit code, stdout, stderr)."""
    code = main(["--redis-url", redis_url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def crawl_ran(client, keys=SITE):
    """What the first worker of a crawl leaves: its layout record (``<ns>:meta``), without
    which push, status and pause warn that the crawl name may be misspelt."""
    Frontier(client, keys).record_layout({"format": "1"})


def start_urls(client, keys=SITE):
    return client.lrange(keys.start_urls, 0, -1)


class FakeTTY(io.StringIO):
    """A terminal whose user types ``answer``."""

    def isatty(self):
        return True


def fill(client, keys):
    """One value in each of the crawl's keys (one worker's claim list is not a fixed key:
    reset finds it through ``claimants``)."""
    client.lpush(keys.start_urls, b"http://example.com/")
    client.sadd(keys.claimants, b"0a0b0c0d")
    client.zadd(keys.queue, {b"1": 0})
    client.hset(keys.requests, b"1", b"0:x")
    client.zadd(keys.leases, {b"2": 1})
    client.zadd(keys.delayed, {b"3": 1})
    client.zadd(keys.revisits, {b"4": 1})
    client.zadd(keys.revisit_queue, {b"example.com\0x": 0})
    client.hset(keys.revisit_of, b"fp", b"4")
    client.sadd(keys.seen, b"fp")
    client.sadd(keys.legacy_seen, b"0123456789ab")
    client.hset(keys.bloom, b"layers", 0)
    client.set(keys.seq, 2)
    client.lpush(keys.dead, dead_letter("bad", raw=b"x", source="start_urls"))
    client.hset(keys.workers, b"host:1", b"{}")
    client.zadd(keys.alive, {b"0a0b0c0d": 1})
    client.hset(keys.commits, b"0a0b0c0d", b"c1")
    client.hset(keys.stats, b"pages", 1)
    client.zadd(keys.domains, {b"example.com": 1})
    client.hset(keys.history_minutes, b"29000000:pages", 1)
    client.hset(keys.history_ten_minutes, b"2900000:pages", 1)
    client.set(keys.paused, b"1")
    client.set(keys.reaper, b"0a0b0c0d", px=60_000)
    client.set(keys.reaper_idle, b"0a0b0c0d", px=60_000)
    client.zadd(keys.ready, {b"example.com": 1})
    client.hset(keys.slots, b"example.com", 1)
    client.hset(keys.inflight, b"example.com", 1)
    client.sadd(keys.placeless, b"00000000000a")
    client.hset(keys.throttle, b"example.com", 1000)
    client.hset(keys.throttle_raised, b"example.com", 1)
    client.hset(keys.throttle_state, b"example.com", b"2:0.5:0")
    client.hset(keys.limits, b"example.com", b"1000:")
    client.hset(keys.hungry, b"example.com", 1)
    client.hset(keys.robots, b"example.com", 0)
    client.hset(keys.robotstxt, b"example.com", b"0 200\n")
    client.set(keys.robots_txt("example.com"), b"0 200\n")
    client.hset(keys.meta, b"format", 1)
    client.hset(keys.sweep, keys.slots, b"0")
    client.hset(keys.settings, b"max_pending", 10)
    client.lpush(keys.wake, b"1")
    client.rpush(keys.runnable, b"1", b"1")
    client.hset(keys.lifecycle, b"state", b"finished")
    client.set(keys.webhook_lock, b"0a0b0c0d", px=60_000)
    client.xadd(keys.events, {b"event": b"finished"})
    client.zadd(keys.import_queue, {b"a scrapy-redis request": 0})
    client.sadd(keys.imported, b"digest")
    client.hset(keys.migration, b"id", b"m1")


# ---------------------------------------------------------------------- help and usage


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["push"],
        ["status"],
        ["reset"],
        ["dead"],
        ["dead", "list"],
        ["dead", "count"],
        ["dead", "purge"],
        ["setup"],
    ],
)
def test_help_for_every_command(capsys, argv):
    assert main([*argv, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: distcrawl")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["status"],
        ["dead"],
        ["status", "bad name"],
        ["dead", "list", "site", "--limit", "-1"],
        ["push", "site", "http://a.example/", "--priority", "high"],
    ],
)
def test_usage_errors_exit_2(capsys, argv):
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_help_never_shows_the_password_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("REDIS_URL", SECRET_URL)
    assert main(["--help"]) == 0
    assert "s3cret" not in capsys.readouterr().out


def test_version_names_distcrawl_scrapy_redis_py_and_python(capsys):
    """One line for a bug report, with distcrawl's version from the installed metadata (the
    number pyproject.toml sets), which distcrawl.__version__ must agree with."""
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    installed = importlib.metadata.version("distcrawl")
    assert out == (
        f"distcrawl {installed} (Scrapy {scrapy.__version__}, redis-py {redis.__version__}, "
        f"Python {platform.python_version()})\n"
    )
    assert distcrawl.__version__ == installed


def test_invalid_redis_url_is_a_usage_error(capsys):
    code, _, err = run(capsys, "http://:s3cret@127.0.0.1:1/0", "status", "site")
    assert code == 2
    assert "invalid --redis-url http://:***@127.0.0.1:1/0" in err
    assert "s3cret" not in err


# ---------------------------------------------------------------------- push


def test_push_urls_in_order(capsys, redis_url, redis_client):
    crawl_ran(redis_client)
    code, out, err = run(
        capsys, redis_url, "push", "site", "http://a.example/", "https://b.example/x"
    )
    assert (code, out, err) == (0, "pushed 2, refused 0\n", "")
    assert start_urls(redis_client) == [b"https://b.example/x", b"http://a.example/"]
    # the first given is the first a worker takes
    frontier = Frontier(redis_client, SITE)
    assert frontier.claim_start_urls(10) == [b"http://a.example/", b"https://b.example/x"]


def test_push_file_good_and_bad_lines(capsys, redis_url, redis_client, tmp_path):
    crawl_ran(redis_client)
    good_json = b'{"url": "https://b.example/", "priority": 3, "meta": {"k": 1}}'
    path = tmp_path / "urls.txt"
    path.write_bytes(
        b"# seed list\r\n"
        b"\n"
        b"   \n"
        b"http://a.example/\r\n" + good_json + b"\n"
        b"ftp://c.example/file\n"
        b'{"url": "http://d.example/", "colour": "red"}\n'
        b'{"url": \n'
        b"not a url\n"
        b"http://\xff.example/\n"
        b"  http://e.example/  \n"
        b"http://" + b"x" * 9000 + b".example/\n"
    )
    code, out, err = run(capsys, redis_url, "push", "site", "--file", str(path))
    assert code == 1
    assert out == "pushed 3, refused 6\n"
    refusals = err.splitlines()
    assert len(refusals) == 6
    assert all(line.startswith("refused: ") for line in refusals)
    assert "refused: ftp://c.example/file (unsupported scheme 'ftp'" in refusals[0]
    assert "unknown field(s) in JSON entry: colour" in refusals[1]
    assert "invalid JSON" in refusals[2]
    assert refusals[3].startswith("refused: not a url (")
    assert "not UTF-8" in refusals[4]
    assert "entry too large" in refusals[5] and len(refusals[5]) < 400
    # exactly the valid entries, raw (JSON untouched, surrounding whitespace stripped)
    assert start_urls(redis_client) == [b"http://e.example/", good_json, b"http://a.example/"]


def test_push_only_bad_entries_pushes_nothing(capsys, redis_url, redis_client):
    crawl_ran(redis_client)
    code, out, err = run(capsys, redis_url, "push", "site", "mailto:x@example.com")
    assert code == 1
    assert out == "pushed 0, refused 1\n"
    assert err.startswith("refused: mailto:x@example.com (")
    assert redis_client.exists(SITE.start_urls) == 0


def test_push_from_stdin(capsys, redis_url, redis_client, monkeypatch):
    crawl_ran(redis_client)
    data = b"http://a.example/\n# comment\njavascript:alert(1)\n\nhttp://b.example/\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, err = run(capsys, redis_url, "push", "site", "--file", "-")
    assert code == 1
    assert out == "pushed 2, refused 1\n"
    assert err.startswith("refused: javascript:alert(1) (")
    assert start_urls(redis_client) == [b"http://b.example/", b"http://a.example/"]


def test_push_from_text_only_stdin(capsys, redis_url, redis_client, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("http://a.example/\n"))
    assert run(capsys, redis_url, "push", "site", "--file", "-")[0] == 0
    assert start_urls(redis_client) == [b"http://a.example/"]


def test_push_args_and_file_together(capsys, redis_url, redis_client, tmp_path):
    path = tmp_path / "urls.txt"
    path.write_text("http://b.example/\n")
    code, out, _ = run(capsys, redis_url, "push", "site", "http://a.example/", "--file", str(path))
    assert (code, out) == (0, "pushed 2, refused 0\n")
    assert start_urls(redis_client) == [b"http://b.example/", b"http://a.example/"]


def test_push_priority_and_meta_wrap_plain_urls(capsys, redis_url, redis_client, tmp_path):
    own = b'{"url": "http://own.example/", "priority": -1}'
    path = tmp_path / "urls.txt"
    path.write_bytes(b"http://b.example/\n" + own + b"\n")
    code, out, _ = run(
        capsys,
        redis_url,
        "push",
        "site",
        "http://a.example/",
        "--priority",
        "5",
        "--meta",
        '{"batch": 1, "tag": "seed"}',
        "--file",
        str(path),
    )
    assert (code, out) == (0, "pushed 3, refused 0\n")
    pushed = start_urls(redis_client)[::-1]
    meta = {"batch": 1, "tag": "seed"}
    assert json.loads(pushed[0]) == {"url": "http://a.example/", "priority": 5, "meta": meta}
    assert json.loads(pushed[1]) == {"url": "http://b.example/", "priority": 5, "meta": meta}
    assert pushed[2] == own  # a JSON entry keeps its own fields
    for raw in pushed:  # what the workers will accept
        parse_entry(raw, max_bytes=8192, schemes=("http", "https"))


def test_push_priority_alone(capsys, redis_url, redis_client):
    assert run(capsys, redis_url, "push", "site", "http://a.example/", "--priority", "-2")[0] == 0
    assert json.loads(start_urls(redis_client)[0]) == {"url": "http://a.example/", "priority": -2}


def test_push_wrapped_entry_is_validated_too(capsys, redis_url, redis_client):
    big = json.dumps({"blob": "x" * 9000})
    code, out, err = run(capsys, redis_url, "push", "site", "http://a.example/", "--meta", big)
    assert code == 1
    assert out == "pushed 0, refused 1\n"
    assert "refused: http://a.example/ (entry too large" in err
    assert redis_client.exists(SITE.start_urls) == 0


@pytest.mark.parametrize("meta", ["[1, 2]", "not json", "3", '"text"'])
def test_push_bad_meta_is_a_usage_error(capsys, redis_url, redis_client, meta):
    code, out, err = run(capsys, redis_url, "push", "site", "http://a.example/", "--meta", meta)
    assert code == 2
    assert out == ""
    assert "argument --meta" in err
    assert redis_client.exists(SITE.start_urls) == 0


def test_push_nothing_or_missing_file_is_a_usage_error(capsys, redis_url, tmp_path):
    code, _, err = run(capsys, redis_url, "push", "site")
    assert code == 2 and "nothing to push" in err
    code, _, err = run(capsys, redis_url, "push", "site", "--file", str(tmp_path / "missing"))
    assert code == 2 and "cannot read" in err


def test_push_json_output(capsys, redis_url):
    code, out, _ = run(capsys, redis_url, "--json", "push", "site", "http://a.example/", "nope")
    assert code == 1
    assert json.loads(out) == {"pushed": 1, "refused": 1}


@pytest.mark.parametrize("command", ["push", "status", "pause"])
def test_a_crawl_name_that_never_ran_is_warned_about(capsys, redis_url, redis_client, command):
    """Before: ``push sitee URL`` said "pushed 1, refused 0" and the URL sat in a list no
    worker reads; status showed an empty crawl, pause paused nothing, all with exit 0."""
    crawl_ran(redis_client)
    argv = [command, "sitee"] + (["http://a.example/"] if command == "push" else [])
    code, _, err = run(capsys, redis_url, *argv)
    assert code == 0
    assert err == (
        "warning: no crawl 'sitee' ever ran on this Redis (none of sitee:meta, "
        "sitee:start_urls, sitee:queue): check the spider name\n"
    )
    # the crawl that ran: nothing to say
    argv[1] = "site"
    code, _, err = run(capsys, redis_url, *argv)
    assert (code, err) == (0, "")
    # a crawl pushed to before its first worker started is one that ran
    run(capsys, redis_url, "push", "other", "http://a.example/")
    code, _, err = run(capsys, redis_url, "status", "other")
    assert (code, err) == (0, "")


# ---------------------------------------------------------------------- status


def test_status_counts_what_is_in_redis(capsys, redis_url, redis_client):
    redis_client.lpush(SITE.start_urls, b"http://a.example/", b"http://b.example/")
    redis_client.zadd(SITE.queue, {b"1": 0, b"2": 0, b"3": -5})
    redis_client.zadd(SITE.leases, {b"4": 1})
    redis_client.zadd(SITE.delayed, {b"5": 1})
    redis_client.sadd(SITE.seen, *[str(i).encode() for i in range(1234)])
    for reason in ("a", "b", "c", "d"):
        redis_client.lpush(SITE.dead, dead_letter(reason, source="test"))
    redis_client.sadd(FrontierKeys("other").seen, b"not counted")

    code, out, err = run(capsys, redis_url, "status", "site")
    assert (code, err) == (0, "")
    for label, value in (
        ("pending", 3),
        ("in flight", 1),
        ("retrying", 1),
        ("dead", 4),
        ("seen", 1234),
        ("start_urls", 2),
    ):
        assert any(
            line.split()[:-1]
            and line.strip().startswith(label)
            and line.split()[len(label.split())] == str(value)
            for line in out.splitlines()
        ), (label, out)
    # --json before or after the subcommand
    for argv in (["--json", "status", "site"], ["status", "site", "--json"]):
        code, out, _ = run(capsys, redis_url, *argv)
        assert code == 0
        snap = json.loads(out)
        sizes = {k: snap[k] for k in ("queue", "leased", "delayed", "seen", "start_urls", "dead")}
        assert sizes == {
            "queue": 3,
            "leased": 1,
            "delayed": 1,
            "seen": 1234,
            "start_urls": 2,
            "dead": 4,
        }


def test_status_of_an_empty_crawl(capsys, redis_url):
    code, out, _ = run(capsys, redis_url, "--json", "status", "nothing-here")
    assert code == 0
    snap = json.loads(out)
    assert (snap["queue"], snap["leased"], snap["seen"], snap["workers"]) == (0, 0, 0, [])


def test_redis_url_after_the_subcommand_wins(capsys, redis_url):
    code, out, _ = run(capsys, SECRET_URL, "status", "site", "--redis-url", redis_url)
    assert code == 0 and out.startswith("crawl")


def test_redis_url_from_environment(capsys, redis_url, redis_client, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert main(["push", "site", "http://a.example/"]) == 0
    assert start_urls(redis_client) == [b"http://a.example/"]


# ---------------------------------------------------------------------- reset


def test_reset_removes_exactly_that_crawls_keys(capsys, redis_url, redis_client):
    fill(redis_client, SITE)
    others = [FrontierKeys("other"), FrontierKeys("site2"), FrontierKeys("site-eu")]
    for keys in others:
        fill(redis_client, keys)
    redis_client.set("site", b"bare")
    redis_client.set("unrelated", b"1")
    redis_client.set("site:custom", b"not a distcrawl key")
    # a worker's claim list, found through claimants
    claims = SITE.claims("0a0b0c0d")
    redis_client.lpush(claims, b"http://example.com/claimed")
    before = set(redis_client.keys("*"))
    assert set(SITE.all()) <= {k.decode() for k in before}

    code, out, err = run(capsys, redis_url, "reset", "site", "--yes")
    assert (code, out, err) == (0, f"removed {len(SITE.all()) + 2} keys of 'site'\n", "")
    after = set(redis_client.keys("*"))
    gone = {k.encode() for k in (*SITE.all(), SITE.robots_txt("example.com"), claims)}
    assert after == before - gone
    assert redis_client.get("site:custom") == b"not a distcrawl key"


@pytest.mark.parametrize("name", ["s?te", "*", "si*", "s[i]te", "s[^x]te", "s\\ite", "site:eu"])
def test_reset_of_a_name_with_glob_characters_leaves_other_crawls_alone(
    name, capsys, redis_url, redis_client
):
    """``reset 's?te'`` once scanned ``s?te:robotstxt:*`` and removed the robots.txt of
    crawl ``site``: such a name is refused now, before anything is read or removed."""
    fill(redis_client, SITE)
    redis_client.set(SITE.robots_lock("example.com"), b"1")
    before = {k: redis_client.dump(k) for k in redis_client.keys("*")}
    assert {
        SITE.robots_txt("example.com").encode(),
        SITE.robots_lock("example.com").encode(),
    } <= set(before)
    code, out, err = run(capsys, redis_url, "reset", name, "--yes")
    assert {k: redis_client.dump(k) for k in redis_client.keys("*")} == before
    assert code == 2 and out == ""
    assert f"invalid spider/namespace {name!r}: a crawl name may not contain" in err


def live_beat(client, tag, keys=SITE, ago_ms=0):
    client.zadd(keys.alive, {tag: server_ms(client) - ago_ms})


def test_reset_refuses_while_a_worker_is_live(capsys, redis_url, redis_client):
    fill(redis_client, SITE)
    live_beat(redis_client, b"1a2b3c4d")
    live_beat(redis_client, b"0f0f0f0f", ago_ms=60_000)  # lapsed: not live
    code, out, err = run(capsys, redis_url, "reset", "site", "--yes")
    assert (code, out) == (1, "")
    assert "1 worker(s) of 'site' beat within the last 10s (1a2b3c4d)" in err
    assert "0f0f0f0f" not in err
    assert "--force" in err
    assert redis_client.exists(*SITE.all()) == len(SITE.all())
    # a longer --worker-timeout counts the older beat as live too
    code, _, err = run(capsys, redis_url, "reset", "site", "--yes", "--worker-timeout", "120")
    assert code == 1
    assert "2 worker(s)" in err


def test_reset_with_force_warns_and_resets(capsys, redis_url, redis_client):
    fill(redis_client, SITE)
    live_beat(redis_client, b"1a2b3c4d")
    code, out, err = run(capsys, redis_url, "reset", "site", "--yes", "--force")
    assert code == 0
    assert out.startswith("removed ")
    assert err.startswith("warning: 1 worker(s) of 'site' beat within the last 10s (1a2b3c4d)")
    assert redis_client.exists(*SITE.all()) == 0


def test_reset_without_yes_on_a_pipe_refuses(capsys, redis_url, redis_client, monkeypatch):
    fill(redis_client, SITE)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    code, out, err = run(capsys, redis_url, "reset", "site")
    assert code == 1
    assert out == ""
    assert "--yes" in err
    assert redis_client.exists(*SITE.all()) == len(SITE.all())


@pytest.mark.parametrize("answer", ["", "n\n", "no\n", "yess\n"])
def test_reset_declined_at_the_prompt(capsys, redis_url, redis_client, monkeypatch, answer):
    fill(redis_client, SITE)
    monkeypatch.setattr(sys, "stdin", FakeTTY(answer))
    code, out, err = run(capsys, redis_url, "reset", "site")
    assert (code, out) == (1, "")
    assert f"Delete all {len(SITE.all()) + 1} keys of 'site' at {redis_url}? [y/N]" in err
    assert "aborted" in err
    assert redis_client.exists(*SITE.all()) == len(SITE.all())


@pytest.mark.parametrize("answer", ["y\n", "YES\n", " yes \n"])
def test_reset_confirmed_at_the_prompt(capsys, redis_url, redis_client, monkeypatch, answer):
    fill(redis_client, SITE)
    monkeypatch.setattr(sys, "stdin", FakeTTY(answer))
    code, out, _ = run(capsys, redis_url, "reset", "site")
    assert (code, out) == (0, f"removed {len(SITE.all()) + 1} keys of 'site'\n")
    assert redis_client.exists(*SITE.all()) == 0


def test_reset_of_nothing_does_not_ask(capsys, redis_url, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, out, _ = run(capsys, redis_url, "--json", "reset", "site")
    assert code == 0
    assert json.loads(out) == {"removed": 0}


@pytest.mark.integration
def test_prompt_redacts_the_password(capsys, tmp_path, monkeypatch):
    server = RedisServer(directory=tmp_path, password="s3cret").start()
    try:
        client = server.client()
        try:
            fill(client, SITE)
        finally:
            client.close()
        monkeypatch.setattr(sys, "stdin", FakeTTY("n\n"))
        code, out, err = run(capsys, server.url, "reset", "site")
        assert code == 1
        assert f"at redis://:***@127.0.0.1:{server.port}/0?" in err
        assert "s3cret" not in out + err
        # a wrong password is reported as such (not as an unreachable server), redacted
        wrong = server.url.replace("s3cret", "wr0ng")
        code, out, err = run(capsys, wrong, "status", "site")
        assert code == 1
        assert err.startswith("error: Redis refused the password at redis://:***@127.0.0.1:")
        assert "wr0ng" not in out + err and "s3cret" not in out + err
    finally:
        server.stop()


# ---------------------------------------------------------------------- dead letters


def add_dead(client, keys=SITE):
    """Three records, oldest first, as workers write them; returns them newest first."""
    records = [
        dead_letter("unsupported scheme 'ftp'", raw=b"ftp://x/", source="start_urls"),
        dead_letter("HTTP 500", url="http://a.example/page", source="download", retries=3),
        dead_letter("entry is not UTF-8 text", raw=b"\xffbad\nline", source="start_urls"),
    ]
    for record in records:
        client.lpush(keys.dead, record)
    return [json.loads(r) for r in reversed(records)]


def test_dead_list(capsys, redis_url, redis_client):
    expected = add_dead(redis_client)
    code, out, err = run(capsys, redis_url, "dead", "list", "site")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == 3
    fields = [line.split("  ") for line in lines]
    assert [f[1:3] for f in fields] == [
        ["start_urls", "entry is not UTF-8 text"],
        ["download", "HTTP 500"],
        ["start_urls", "unsupported scheme 'ftp'"],
    ]
    assert fields[1][3] == "http://a.example/page"  # the url when there is one
    assert fields[2][3] == "ftp://x/"  # else the raw entry
    assert "\\n" in fields[0][3]  # kept on one line
    for record, f in zip(expected, fields, strict=True):
        assert time.time() - 60 < record["time"] <= time.time()
        assert f[0].startswith(time.strftime("%Y-%m-%dT", time.gmtime(record["time"])))
        assert f[0].endswith("+00:00")

    code, out, _ = run(capsys, redis_url, "--json", "dead", "list", "site")
    assert code == 0
    assert json.loads(out) == expected


def test_dead_list_limit(capsys, redis_url, redis_client):
    expected = add_dead(redis_client)
    code, out, err = run(capsys, redis_url, "dead", "list", "site", "--limit", "2")
    assert code == 0
    assert len(out.splitlines()) == 2
    assert "2 of 3" in err
    code, out, _ = run(capsys, redis_url, "dead", "list", "site", "--limit", "1", "--json")
    assert (code, json.loads(out)) == (0, expected[:1])
    code, out, _ = run(capsys, redis_url, "dead", "list", "site", "--limit", "0", "--json")
    assert (code, json.loads(out)) == (0, expected)


def test_dead_list_survives_foreign_values(capsys, redis_url, redis_client):
    redis_client.lpush(SITE.dead, b"someone pushed this by hand", b"[1, 2]")
    code, out, _ = run(capsys, redis_url, "dead", "list", "site")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("-  -  not a dead-letter record  [1, 2]")
    assert lines[1].endswith("someone pushed this by hand")


def test_dead_count(capsys, redis_url, redis_client):
    assert run(capsys, redis_url, "dead", "count", "site")[1] == "0\n"
    add_dead(redis_client)
    add_dead(redis_client, FrontierKeys("other"))
    assert run(capsys, redis_url, "dead", "count", "site") == (0, "3\n", "")
    code, out, _ = run(capsys, redis_url, "dead", "count", "site", "--json")
    assert code == 0
    assert json.loads(out) == {"dead": 3}


def test_dead_redrive_of_a_url_only_record_keeps_the_site_scope(capsys, redis_url, redis_client):
    """`dead redrive` makes the request of a record without payload with the project's
    spider (as `push` validates with the project's settings): the site spider's scope."""
    redis_client.lpush(
        SITE.dead, dead_letter("gave up: 503", url="http://a.test/x", source="retry")
    )
    code, out, _ = run(capsys, redis_url, "dead", "redrive", "site")
    assert (code, out.strip()) == (0, "re-drove 1 dead letters of 'site'")
    [raw] = redis_client.zrange(SITE.queue, 0, -1)
    data = RequestCodec("msgpack").decode_dict(parse_queue_entry(raw).payload)
    assert data == {"u": "http://a.test/x", "M": {"site_scope": "a.test"}}


def test_dead_purge(capsys, redis_url, redis_client, monkeypatch):
    fill(redis_client, SITE)
    add_dead(redis_client)
    add_dead(redis_client, FrontierKeys("other"))

    monkeypatch.setattr(sys, "stdin", io.StringIO("yes\n"))
    code, _, err = run(capsys, redis_url, "dead", "purge", "site")
    assert code == 1 and "--yes" in err
    assert redis_client.llen(SITE.dead) == 4

    monkeypatch.setattr(sys, "stdin", FakeTTY("n\n"))
    code, _, err = run(capsys, redis_url, "dead", "purge", "site")
    assert code == 1
    assert f"Delete all 4 dead-letter records of 'site' at {redis_url}? [y/N]" in err
    assert redis_client.llen(SITE.dead) == 4

    code, out, _ = run(capsys, redis_url, "dead", "purge", "site", "--yes")
    assert (code, out) == (0, "removed 4 dead-letter records of 'site'\n")
    assert redis_client.exists(SITE.dead) == 0
    # only the dead letters went
    assert redis_client.exists(*SITE.all()) == len(SITE.all()) - 1
    assert redis_client.llen(FrontierKeys("other").dead) == 3

    code, out, _ = run(capsys, redis_url, "--json", "dead", "purge", "site")
    assert code == 0 and json.loads(out) == {"removed": 0}


# ---------------------------------------------------------------------- unreachable Redis


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "site"],
        ["push", "site", "http://a.example/"],
        ["reset", "site", "--yes"],
        ["dead", "list", "site"],
        ["dead", "count", "site"],
        ["dead", "purge", "site", "--yes"],
    ],
)
def test_unreachable_redis_exits_3_without_the_password(capsys, argv):
    started = time.monotonic()
    code, out, err = run(capsys, SECRET_URL, *argv)
    assert time.monotonic() - started < 5
    assert code == 3
    assert out == ""
    assert err.startswith("error: cannot reach Redis at redis://:***@127.0.0.1:1/0: ")
    assert "s3cret" not in out + err


def test_unreachable_redis_from_environment(capsys, monkeypatch):
    monkeypatch.setenv("REDIS_URL", SECRET_URL)
    assert main(["dead", "count", "site"]) == 3
    out, err = capsys.readouterr()
    assert "redis://:***@127.0.0.1:1/0" in err
    assert "s3cret" not in out + err


# ---------------------------------------------------------------------- console script


def test_console_script(redis_url, redis_client):
    script = shutil.which("distcrawl") or str(Path(sys.executable).parent / "distcrawl")
    assert Path(script).exists(), "the distcrawl console script is not installed"
    pushed = subprocess.run(
        [script, "--redis-url", redis_url, "push", "site", "http://a.example/", "bad"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert pushed.returncode == 1, pushed.stderr
    assert pushed.stdout == "pushed 1, refused 1\n"
    assert start_urls(redis_client) == [b"http://a.example/"]
    status = subprocess.run(
        [script, "--redis-url", redis_url, "--json", "status", "site"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["start_urls"] == 1
    unreachable = subprocess.run(
        [script, "--redis-url", SECRET_URL, "status", "site"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unreachable.returncode == 3
    assert "s3cret" not in unreachable.stdout + unreachable.stderr


def test_domains_looks_at_a_bounded_number_of_slots(capsys, redis_url, redis_client):
    frontier = Frontier(redis_client, SITE)
    entries = [
        Entry(EntryKind.REQUEST, f"fp-{n}-{i}".encode(), 0, b"payload", b"", f"h{n}.test")
        for n in range(30)
        for i in range(1 + n % 3)
    ]
    frontier.commit([], entries)
    code, out, err = run(capsys, redis_url, "--json", "domains", "site", "--scan", "10")
    assert code == 0
    assert "looked at 10 slots with requests queued" in err and "of 30" in err
    states = json.loads(out)
    assert 0 < len(states) <= 10
    code, out, err = run(capsys, redis_url, "--json", "domains", "site", "--limit", "50")
    assert (code, err) == (0, "")
    states = json.loads(out)
    assert len(states) == 30
    assert [s["queued"] for s in states[:10]] == [3] * 10  # the busiest first


def test_redis_url_from_the_project_the_command_runs_in(
    capsys, redis_url, redis_client, monkeypatch, tmp_path
):
    """Without --redis-url or $REDIS_URL, push goes where the project's workers go: the
    REDIS_URL of its settings.py, found through scrapy.cfg as `scrapy crawl` finds it."""
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = myproject.settings\n")
    package = tmp_path / "myproject"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(f"REDIS_URL = {redis_url!r}\n")
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["push", "site", "http://a.example/"]) == 0
    assert start_urls(redis_client) == [b"http://a.example/"]
    # $REDIS_URL still wins over the project's file
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    assert main(["push", "site", "http://b.example/"]) != 0
    assert start_urls(redis_client) == [b"http://a.example/"]
