"""``distcrawl web``: the console's numbers against Redis during a real two-worker crawl,
its actions and their refusal in read-only mode, its token, and the history rollups the
workers' heartbeats write (their key names are pinned in tests/test_keys.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from distcrawl.model.dashboard import snapshot
from distcrawl.model.frontier import Frontier
from distcrawl.model.frontier_admin import FrontierAdmin
from distcrawl.model.history import RESOLUTIONS, SERIES, HistoryWriter, field
from distcrawl.model.keys import FrontierKeys
from distcrawl.web.security import Guard, is_loopback
from tests.support import page_fetches, wait_until
from tests.web_console import Console, basic

FAST = {"DISTCRAWL_HEARTBEAT_INTERVAL": 0.5}
KEYS = FrontierKeys("site")
#: what the console and the snapshot must agree on once the crawl stands still
#: a non-loopback address, which the console refuses before binding it
OFF = ("--host", "10.1.2.3")
STILL = ("queue", "queue_slots", "leased", "delayed", "revisits", "seen", "start_urls", "dead")


@pytest.fixture
def console(tmp_path: Path, redis_url: str) -> Iterator[Callable[..., Console]]:
    started: list[Console] = []

    def factory(*options: str, url: str | None = None) -> Console:
        web = Console(url or redis_url, tmp_path / f"web-{len(started)}.log", *options)
        started.append(web)
        return web.start()

    try:
        yield factory
    finally:
        for web in started:
            web.stop()


def _snap(client: redis.Redis) -> dict:
    return snapshot(Frontier(client, KEYS))


def test_the_console_shows_what_redis_holds_during_a_two_worker_crawl(
    demo_site, workers, redis_client, console
):
    site = demo_site(pages=400, delay=0.05)
    redis_client.lpush("site:start_urls", site.url + "/")
    pool = [workers(i, DISTCRAWL_IDLE_TIMEOUT=3, **FAST) for i in (1, 2)]
    web = console()
    assert wait_until(lambda: len(page_fetches(site)) >= 60, timeout=60)
    live = json.loads(web.get("/api/crawl/site/status"))
    assert live["state"] == "running" and live["totals"]["pages"] > 0
    assert sum(w["status"] == "alive" for w in live["workers"]) == 2
    # read-only: every action refused, nothing changed in Redis
    before = redis_client.exists("site:paused"), redis_client.llen("site:start_urls")
    for action in ("pause", "resume", "push", "dead/redrive"):
        status, body, _ = web.request(f"/crawl/site/{action}", {"url": site.url + "/x"})
        assert status == 403 and "read-only" in body, (action, status, body)
    assert (redis_client.exists("site:paused"), redis_client.llen("site:start_urls")) == before
    # the crawl held still (paused, nothing in flight): the page's numbers are Redis'
    redis_client.set("site:paused", b"1")

    def still() -> bool:
        first = _snap(redis_client)
        if first["leased"] or {w.get("state") for w in first["workers"]} != {"paused"}:
            return False
        # the counters come with the workers' beats (FAST: every 0.5 s): a page stored after
        # the beat that said "paused" is counted by the next one, late on a loaded machine
        time.sleep(1.2)
        return _snap(redis_client)["totals"] == first["totals"]

    assert wait_until(still, timeout=30)
    shown = json.loads(web.get("/api/crawl/site/status"))
    truth = _snap(redis_client)
    assert shown["state"] == "paused"
    assert {k: shown[k] for k in STILL} == {k: truth[k] for k in STILL}
    assert shown["totals"] == truth["totals"] and shown["domains"] == truth["domains"]
    html = web.get("/crawl/site")
    for name in STILL:
        if name != "queue_slots":
            assert f'data-field="{name}">{truth[name]}<' in html, name
    # the rollups have this minute's pages, and the console reads them
    hist = json.loads(web.get("/api/crawl/site/history?span=hour"))
    assert sum(hist["series"]["pages"]) > 0 and len(hist["times"]) == 60
    assert any(v is not None for v in hist["series"]["queue"])
    assert sum(json.loads(web.get("/api/crawl/site/history?span=day"))["series"]["pages"]) > 0
    domains = web.get("/crawl/site/domains")
    assert "127.0.0.1" in domains and "next allowed in" in domains
    redis_client.delete("site:paused")
    for w in pool:
        assert w.wait(120) == 0, w.log()[-2000:]
    assert set(page_fetches(site)) == site.expected_pages()
    final = json.loads(web.get("/api/crawl/site/status"))
    assert final["totals"] == _snap(redis_client)["totals"]
    assert sum(json.loads(web.get("/api/crawl/site/history"))["series"]["items"]) == 401


def test_actions_round_trip_into_redis(redis_server, redis_client, console):
    """Pause, resume, push and re-drive through the forms' POSTs; a missing form token or
    another origin is refused. The Redis password appears in no page and no log line."""
    redis_client.config_set("requirepass", "s3cret-pw")
    client = redis.Redis(port=redis_server.port, password="s3cret-pw")
    web = console("--allow-actions", url=f"redis://:s3cret-pw@127.0.0.1:{redis_server.port}/0")
    token = web.csrf()
    assert web.request("/crawl/site/pause", {})[0] == 403  # no form token
    evil = {"Origin": "http://evil.test"}
    assert web.request("/crawl/site/pause", {"csrf": token}, evil)[0] == 403
    assert not client.exists("site:paused")
    assert web.request("/crawl/site/pause", {"csrf": token})[0] == 303
    assert client.get("site:paused") == b"1"
    assert json.loads(web.get("/api/crawl/site/status"))["paused"] is True
    assert web.request("/crawl/site/resume", {"csrf": token})[0] == 303
    assert not client.exists("site:paused")
    status, _, headers = web.request("/crawl/site/push", {"csrf": token, "url": "ftp://x.test/"})
    assert status == 303 and "refused" in headers["Location"]
    assert web.request("/crawl/site/push", {"csrf": token, "url": "http://a.test/"})[0] == 303
    assert client.lrange("site:start_urls", 0, -1) == [b"http://a.test/"]
    record = {"reason": "bad", "source": "start_urls", "raw": "http://b.test/", "time": 1}
    client.lpush("site:dead", json.dumps(record))
    dead = web.get("/crawl/site/dead")
    assert "http://b.test/" in dead and 'id="redrive"' in dead
    redrive = {"csrf": token, "source": "start_urls"}
    assert web.request("/crawl/site/dead/redrive", redrive)[0] == 303
    assert client.llen("site:dead") == 0
    assert b"http://b.test/" in client.lrange("site:start_urls", 0, -1)
    pages = [web.get(p) for p in ("/crawl/site", "/crawl/site/dead", "/api/crawl/site/status")]
    assert not any("s3cret" in page for page in pages)
    assert "s3cret" not in web.log() and "redis://:***@" in web.log()
    client.close()
    # Redis gone: a 503 that says so, nothing secret in it or in the log
    redis_server.stop()
    status, body, _ = web.request("/api/crawl/site/status")
    assert status == 503 and body.startswith("Redis: ") and "s3cret" not in body
    assert "s3cret" not in web.log() and "Traceback" not in web.log()


def test_the_dead_letters_are_paged(redis_client, console):
    records = [json.dumps({"reason": f"r{i}", "url": f"http://d.test/{i}"}) for i in range(120)]
    redis_client.rpush("site:dead", *records)
    web = console()
    first, last = web.get("/crawl/site/dead"), web.get("/crawl/site/dead?page=2")
    assert "http://d.test/0<" in first and "http://d.test/49<" in first
    assert "http://d.test/50<" not in first and 'id="next"' in first
    assert "http://d.test/100<" in last and "http://d.test/119<" in last
    assert 'id="next"' not in last and "page 3 of 3" in last


def test_the_domains_page_shows_each_domains_politeness(redis_client, console):
    """A page of the busiest domains with what the frontier holds of each: a `distcrawl
    limit` override, a robots.txt Crawl-delay; 50 a page."""
    redis_client.zadd("site:domains", {f"d{i}.test": 1000 - i for i in range(120)})
    FrontierAdmin(redis_client, KEYS).set_limit("d1.test", 2.0, 3)
    redis_client.hset("site:robots", "d2.test", 4500)
    web = console()
    first = web.get("/crawl/site/domains")
    row = next(r for r in first.split("<tr>") if "<td>d1.test</td>" in r)
    assert "<td>2.0s</td><td>3</td>" in row
    assert "<td>4.5s</td>" in next(r for r in first.split("<tr>") if "<td>d2.test</td>" in r)
    assert "d49.test" in first and "d50.test" not in first
    assert "d119.test" in web.get("/crawl/site/domains?page=2")


def test_a_token_is_needed_when_given_and_off_loopback(redis_url, console):
    web = console("--token", "tok-123")
    assert web.request("/crawl/site")[0] == 401
    assert web.request("/crawl/site", headers={"Authorization": basic("wrong")})[0] == 401
    assert web.request("/crawl/site", headers={"Authorization": basic("tok-123")})[0] == 200
    bearer = {"Authorization": "Bearer tok-123"}
    assert web.request("/api/crawl/site/status", headers=bearer)[0] == 200
    assert "tok-123" not in web.log()
    # another Host than the loopback address (DNS rebinding) is refused
    assert web.request("/crawl/site", headers={**bearer, "Host": "evil.test"})[0] == 403
    # on any other address, no start without a token (refused before binding it)
    refused = subprocess.run(
        [sys.executable, "-m", "distcrawl.cli", "--redis-url", redis_url, "web", "site", *OFF],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert refused.returncode == 2 and "without a token" in refused.stderr


def test_guard_rules():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.1.2.3") and not is_loopback("example.test")
    with pytest.raises(ValueError, match="without a token"):
        Guard("10.1.2.3", None)
    guard = Guard("10.1.2.3", "t")
    assert guard.csrf_ok(guard.csrf) and not guard.csrf_ok("x")


def test_history_writer_deletes_what_left_the_window():
    """Each beat deletes the buckets that left the window since the worker's last beat; the
    first beat three windows back (docs/internals.md, History rollups)."""
    writer = HistoryWriter()
    hour = RESOLUTIONS["hour"]
    now = 1_000_000 * 60
    first = writer.ops(KEYS, now, {"pages": 5, "retries": 2}, {"queue": 7})
    args = [op.args for op in first if op.args[1] == "site:history:1m"]
    bucket = now // 60
    assert ["HINCRBY", "site:history:1m", field(bucket, "pages"), 5] in args
    assert ["HSET", "site:history:1m", field(bucket, "queue"), 7] in args
    assert not any("retries" in str(a) for a in args)
    (hdel,) = [a for a in args if a[0] == "HDEL"]
    assert len(hdel[2:]) == 3 * hour.buckets * len(SERIES)
    assert field(bucket - hour.buckets, "pages") in hdel[2:]
    assert field(bucket - hour.buckets + 1, "pages") not in hdel[2:]
    assert ["PEXPIRE", "site:history:1m", 2 * hour.window * 1000] in args
    later = writer.ops(KEYS, now + 120, {}, {})
    (hdel,) = [op.args for op in later if op.args[:2] == ["HDEL", "site:history:1m"]]
    assert hdel[2:] == [field(b, s) for b in (bucket - 59, bucket - 58) for s in SERIES]
    assert not any(op.args[0] == "PEXPIRE" for op in later)  # nothing written
