"""The demo site and the throwaway Redis are test infrastructure: if they lie, every test lies."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from distcrawl.demo.redis_server import RedisServer, find_free_port
from distcrawl.demo.site import (
    DemoSite,
    LogLine,
    bfs_from_home,
    expected_pages,
    home_links,
    page_links,
    read_log,
)

UA = "distcrawl-test/1.0"
HREF = re.compile(r'href="([^"]+)"')


def fetch(url: str, timeout: float = 10.0) -> tuple[int, str, bytes]:
    """(status, content type, body) for any status, 404 included."""
    req = urllib.request.Request(url, headers={"User-Agent": UA})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers.get("Content-Type", ""), err.read()


def wait_log(site: DemoSite, count: int, timeout: float = 5.0) -> list[LogLine]:
    """The log line is written as the response is sent, so the client may see it first."""
    deadline = time.monotonic() + timeout
    lines = site.read_log()
    while len(lines) < count and time.monotonic() < deadline:
        time.sleep(0.02)
        lines = site.read_log()
    return lines


@pytest.fixture
def site(demo_site: Callable[..., DemoSite]) -> DemoSite:
    return demo_site(pages=50, links=5)


# ------------------------------------------------------------------ pure helpers


def test_page_links_are_deterministic_and_chain_to_next() -> None:
    assert page_links(3, 50, 17, seed=1) == page_links(3, 50, 17, seed=1)
    assert page_links(3, 50, 17, seed=1) != page_links(3, 50, 17, seed=2)
    for n in range(50):
        links = page_links(n, 50, 17, seed=1)
        assert len(links) == 17
        assert f"/page/{(n + 1) % 50}" in links
        assert all(re.fullmatch(r"/page/\d+", p) and int(p[6:]) < 50 for p in links)


def test_bfs_over_links_reaches_exactly_expected_pages() -> None:
    for pages, links in [(50, 17), (7, 1), (200, 3), (1, 5)]:
        seen = {"/"}
        todo = list(home_links(pages))
        seen.update(todo)
        while todo:
            path = todo.pop()
            for nxt in page_links(int(path.rsplit("/", 1)[1]), pages, links, seed=1):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        assert seen == expected_pages(pages)
        assert set(bfs_from_home(pages, links, seed=1)) == expected_pages(pages)


def test_links_repeat_sometimes() -> None:
    """Duplicate links are a feature: they exercise the crawler's dedup."""
    assert any(len(set(page_links(n, 50, 17, 1))) < 17 for n in range(50))


# ------------------------------------------------------------------ live site


def test_home_page(site: DemoSite) -> None:
    status, ctype, body = fetch(site.url + "/")
    assert status == 200
    assert ctype == "text/html; charset=utf-8"
    assert HREF.findall(body.decode()) == [f"/page/{k}" for k in range(10)]


def test_page_content_matches_helpers(site: DemoSite) -> None:
    status, ctype, body = fetch(site.url + "/page/3")
    text = body.decode()
    assert status == 200 and ctype == "text/html; charset=utf-8"
    assert "<title>Page 3</title>" in text
    assert '<meta name="description" content="Description of page 3">' in text
    assert "<h1>Page 3</h1>" in text
    assert HREF.findall(text) == page_links(3, 50, 5, seed=1)
    assert fetch(site.url + "/page/3")[2] == body  # stable across requests


def test_special_page_links_pdf_and_private(site: DemoSite) -> None:
    hrefs = HREF.findall(fetch(site.url + "/page/7")[2].decode())
    assert "/files/7.pdf" in hrefs and "/private/7" in hrefs
    status, ctype, body = fetch(site.url + "/files/7.pdf")
    assert status == 200 and ctype == "application/pdf" and body.startswith(b"%PDF")
    assert fetch(site.url + "/private/7")[0] == 200
    assert fetch(site.url + "/files/8.pdf")[0] == 404


def test_robots_txt(site: DemoSite, demo_site: Callable[..., DemoSite]) -> None:
    status, ctype, body = fetch(site.url + "/robots.txt")
    assert status == 200 and ctype.startswith("text/plain")
    assert body == b"User-agent: *\nDisallow: /private/\n"
    slow = demo_site(pages=5, crawl_delay=0.5)
    assert b"Crawl-delay: 0.5\n" in fetch(slow.url + "/robots.txt")[2]


@pytest.mark.parametrize("path", ["/page/50", "/page/07", "/page/x", "/nope", "/page/3/"])
def test_unknown_paths_are_404(site: DemoSite, path: str) -> None:
    assert fetch(site.url + path)[0] == 404


def test_request_log_has_one_line_per_request(site: DemoSite) -> None:
    paths = ["/", "/page/1", "/nope", "/robots.txt", "/page/1"]
    statuses = [fetch(site.url + p)[0] for p in paths]
    lines = wait_log(site, len(paths))
    assert len(lines) == len(paths)
    assert [(ln.method, ln.path, ln.status, ln.user_agent) for ln in lines] == [
        ("GET", p, s, UA) for p, s in zip(paths, statuses, strict=True)
    ]
    assert statuses == [200, 200, 404, 200, 200]
    assert all(abs(ln.time - time.time()) < 60 for ln in lines)
    assert read_log(Path(site.log_path or "")) == lines


def test_delay_is_applied_without_blocking(demo_site: Callable[..., DemoSite]) -> None:
    slow = demo_site(pages=5, delay=0.3)
    start = time.monotonic()
    assert fetch(slow.url + "/page/1")[0] == 200
    elapsed = time.monotonic() - start
    assert 0.3 <= elapsed < 5.0
    start = time.monotonic()
    assert fetch(slow.url + "/robots.txt")[0] == 200
    assert time.monotonic() - start < 0.3


def test_client_disconnect_during_delay_is_logged_not_crashing(
    demo_site: Callable[..., DemoSite],
) -> None:
    slow = demo_site(pages=5, delay=0.5)
    with pytest.raises(TimeoutError):
        fetch(slow.url + "/page/2", timeout=0.1)
    time.sleep(0.6)
    assert fetch(slow.url + "/page/3")[0] == 200
    lines = wait_log(slow, 2)
    assert [(ln.path, ln.status) for ln in lines] == [("/page/2", 499), ("/page/3", 200)]
    assert slow.proc is not None and slow.proc.poll() is None


def test_stop_terminates_process(demo_site: Callable[..., DemoSite]) -> None:
    s = demo_site(pages=5)
    proc = s.proc
    s.stop()
    assert proc is not None and proc.returncode is not None
    s.stop()  # idempotent


# ------------------------------------------------------------------ redis server


def test_redis_fixture(redis_client: redis.Redis, redis_url: str) -> None:
    assert redis_url.startswith("redis://127.0.0.1:")
    redis_client.set("k", "v")
    assert redis_client.get("k") == b"v"


def test_redis_restart_keeps_aof_data(tmp_path: Path) -> None:
    with RedisServer(directory=tmp_path, appendonly=True) as server:
        port, pid = server.port, server.pid
        client = server.client()
        client.set("survivor", "yes")
        client.close()
        server.restart()
        assert server.port == port and server.pid != pid
        client = server.client()
        assert client.get("survivor") == b"yes"
        client.close()
    assert server.proc is None


def test_redis_without_aof_loses_data_on_restart(tmp_path: Path) -> None:
    with RedisServer(directory=tmp_path) as server:
        client = server.client()
        client.set("gone", "1")
        client.close()
        server.restart()
        client = server.client()
        assert client.get("gone") is None
        client.close()


def test_redis_password(tmp_path: Path) -> None:
    with RedisServer(directory=tmp_path, password="s3cret") as server:
        assert server.url == f"redis://:s3cret@127.0.0.1:{server.port}/0"
        client = server.client()
        assert client.ping()
        client.close()
        no_retry = Retry(NoBackoff(), 0)  # redis-py retries auth errors with backoff (~5 s)
        anonymous = redis.Redis(host="127.0.0.1", port=server.port or 0, retry=no_retry)
        with pytest.raises(redis.AuthenticationError):
            anonymous.set("x", 1)
        anonymous.close()


def test_redis_fixed_port_and_owned_dir_cleanup() -> None:
    port = find_free_port()
    server = RedisServer(port=port).start()
    directory = server.directory
    assert server.port == port and directory is not None and Path(directory).is_dir()
    server.stop()
    assert not Path(directory).exists()
