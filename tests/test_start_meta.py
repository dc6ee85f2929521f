"""Producers cannot steer the workers through a start_urls entry: the meta keys Scrapy and
distcrawl act on, and ``dont_filter``, are refused unless DISTCRAWL_START_META_KEYS names them.

Real ``scrapy crawl`` workers against the demo site; what was fetched comes from the site's own
log, what reached a proxy from a listening socket nobody else knows.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from distcrawl.cli import main
from distcrawl.codec.start_urls import RESERVED_META_KEYS
from tests.support import page_fetches, wait_until

pytestmark = pytest.mark.timeout(120)

ECHO = {"spider": "meta_echo", "SPIDER_MODULES": "distcrawl.spiders,tests.meta_spider"}
#: /private/7 exists on the demo site (pages >= 8) and robots.txt disallows it
PRIVATE = "/private/7"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A port that would take a proxied request: connections wait in its backlog."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield sock
    finally:
        sock.close()


def connections(sock: socket.socket) -> int:
    sock.settimeout(0.5)
    count = 0
    for _ in range(16):
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            break
        conn.close()
        count += 1
    return count


def dead_records(client, key: str = "site:dead") -> list[dict]:
    return [json.loads(r) for r in client.lrange(key, 0, -1)]


def test_every_reserved_meta_key_is_dead_lettered_and_nothing_fetched(
    demo_site, workers, redis_client, listener
):
    site = demo_site(pages=10)
    proxy = f"http://127.0.0.1:{listener.getsockname()[1]}"
    values = {"proxy": proxy, "download_slot": "escape", "dont_obey_robotstxt": True}
    bad = {}
    for key in [*sorted(RESERVED_META_KEYS), "distcrawl_anything_new"]:
        # each entry its own URL, which no page links to; dont_obey_robotstxt a disallowed one
        path = PRIVATE if key == "dont_obey_robotstxt" else f"/page/1?reserved={key}"
        bad[key] = {"url": site.url + path, "meta": {key: values.get(key, 1), "tag": "x"}}
    bad["dont_filter"] = {"url": site.url + "/page/1?reserved=dont_filter", "dont_filter": True}
    pool = [workers(1)]
    assert pool[0].wait_for_log("Frontier: "), pool[0].log()
    for data in bad.values():
        redis_client.lpush("site:start_urls", json.dumps(data))
    redis_client.lpush("site:start_urls", site.url + "/")

    assert wait_until(lambda: redis_client.llen("site:dead") == len(bad), timeout=30), (
        dead_records(redis_client),
        pool[0].log()[-3000:],
    )
    by_raw = {r["raw"]: r for r in dead_records(redis_client)}
    for key, data in bad.items():
        record = by_raw[json.dumps(data)]
        named = key if key == "dont_filter" else f"meta.{key}"
        assert record["source"] == "start_urls"
        assert f"reserved key(s) in JSON entry: {named} " in record["reason"], record
    # the good entry was crawled (robots.txt obeyed), none of the refused ones was fetched
    assert wait_until(lambda: len(page_fetches(site)) == 11, timeout=30)
    assert wait_until(lambda: redis_client.hlen("site:requests") == 0, timeout=10)
    refused = [ln.path for ln in site.read_log() if "reserved=" in ln.path or PRIVATE in ln.path]
    assert refused == []
    assert connections(listener) == 0  # nothing went through the producer's proxy
    log = pool[0].log()
    assert "Bad start_urls entry" in log and "meta.dont_obey_robotstxt" in log
    assert pool[0].alive()


def test_own_keys_reach_the_callback_and_the_setting_lets_named_keys_through(
    demo_site, workers, redis_client
):
    site = demo_site(pages=10)
    worker = workers(1, **ECHO, DISTCRAWL_START_META_KEYS="download_timeout,dont_filter")
    assert worker.wait_for_log("Frontier: "), worker.log()
    entries = [
        {"url": site.url + "/page/1", "meta": {"tag": "x"}},
        {"url": site.url + "/page/2", "meta": {"tag": "y", "download_timeout": 7}},
        # the setting names these two, not proxy
        {"url": site.url + "/page/3?reserved=proxy", "meta": {"proxy": "http://127.0.0.1:1"}},
        {"url": site.url + "/page/4", "dont_filter": True},
        {"url": site.url + "/page/4", "dont_filter": True},
    ]
    for data in entries:
        redis_client.lpush("meta_echo:start_urls", json.dumps(data))

    page1 = f'meta of {site.url}/page/1: {{"download_timeout": 180.0, "tag": "x"}}'
    page2 = f'meta of {site.url}/page/2: {{"download_timeout": 7, "tag": "y"}}'
    assert worker.wait_for_log(page1, timeout=30), worker.log()[-3000:]
    assert worker.wait_for_log(page2, timeout=30), worker.log()[-3000:]
    assert wait_until(lambda: page_fetches(site)["/page/4"] == 2, timeout=30)  # not deduplicated
    assert wait_until(lambda: redis_client.llen("meta_echo:dead") == 1, timeout=10)
    (record,) = dead_records(redis_client, "meta_echo:dead")
    assert "reserved key(s) in JSON entry: meta.proxy " in record["reason"]
    assert not [ln.path for ln in site.read_log() if "reserved=" in ln.path]


def test_dont_filter_is_refused_unless_named(demo_site, workers, redis_client):
    site = demo_site(pages=10)
    worker = workers(1, **ECHO, DISTCRAWL_START_META_KEYS="download_timeout")
    assert worker.wait_for_log("Frontier: "), worker.log()
    redis_client.lpush(
        "meta_echo:start_urls",
        json.dumps({"url": site.url + "/page/4", "dont_filter": True}),
        json.dumps({"url": site.url + "/page/5", "meta": {"download_timeout": 9}}),
    )
    assert worker.wait_for_log(f'meta of {site.url}/page/5: {{"download_timeout": 9, "tag": null}}')
    assert wait_until(lambda: redis_client.llen("meta_echo:dead") == 1, timeout=10)
    (record,) = dead_records(redis_client, "meta_echo:dead")
    assert "reserved key(s) in JSON entry: dont_filter " in record["reason"]
    assert "DISTCRAWL_START_META_KEYS" in record["reason"]
    assert page_fetches(site)["/page/4"] == 0


# ---------------------------------------------------------------------- distcrawl push


def push(capsys, redis_url, *argv):
    code = main(["--redis-url", redis_url, "push", "site", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("key", ["proxy", "download_slot", "dont_obey_robotstxt", "depth"])
def test_push_refuses_reserved_meta_keys(capsys, redis_url, redis_client, key):
    own = json.dumps({"url": "http://a.example/", "meta": {key: "x", "tag": "t"}})
    code, out, err = push(capsys, redis_url, own)
    assert (code, out) == (1, "pushed 0, refused 1\n")
    assert f"reserved key(s) in JSON entry: meta.{key} (" in err
    # the same through --meta on plain URLs
    wrapped = json.dumps({key: "x"})
    code, out, err = push(capsys, redis_url, "http://b.example/", "--meta", wrapped)
    assert (code, out) == (1, "pushed 0, refused 1\n")
    assert f"refused: http://b.example/ (reserved key(s) in JSON entry: meta.{key} (" in err
    assert redis_client.llen("site:start_urls") == 0


def test_push_follows_the_setting(capsys, redis_url, redis_client):
    timeout = json.dumps({"url": "http://a.example/", "meta": {"download_timeout": 5}})
    refilter = json.dumps({"url": "http://b.example/", "dont_filter": True})
    code, out, err = push(capsys, redis_url, timeout, refilter)
    assert (code, out) == (1, "pushed 0, refused 2\n")
    assert "meta.download_timeout" in err and "entry: dont_filter (" in err
    code, out, err = push(
        capsys, redis_url, timeout, refilter, "-s", "DISTCRAWL_START_META_KEYS=download_timeout"
    )
    assert (code, out) == (1, "pushed 1, refused 1\n")
    assert "dont_filter" in err and "download_timeout" not in err
    allowed = "DISTCRAWL_START_META_KEYS=download_timeout,dont_filter"
    assert push(capsys, redis_url, refilter, "-s", allowed)[:2] == (0, "pushed 1, refused 0\n")
    assert redis_client.lrange("site:start_urls", 0, -1) == [refilter.encode(), timeout.encode()]


def test_push_reads_the_project_settings(capsys, redis_url, redis_client, tmp_path, monkeypatch):
    (tmp_path / "meta_project_settings.py").write_text(
        'DISTCRAWL_START_META_KEYS = ["cookiejar"]\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "meta_project_settings")
    jar = json.dumps({"url": "http://a.example/", "meta": {"cookiejar": 1}})
    proxied = json.dumps({"url": "http://b.example/", "meta": {"proxy": "http://127.0.0.1:1"}})
    code, out, err = push(capsys, redis_url, jar, proxied)
    assert (code, out) == (1, "pushed 1, refused 1\n")
    assert "meta.proxy" in err and "cookiejar" not in err
    assert redis_client.lrange("site:start_urls", 0, -1) == [jar.encode()]


def test_push_bad_set_option_is_a_usage_error_without_echo(capsys, redis_url):
    code, _, err = push(capsys, redis_url, "http://a.example/", "-s", "s3cret-no-equals")
    assert code == 2
    assert "-s expects NAME=VALUE" in err and "s3cret" not in err
