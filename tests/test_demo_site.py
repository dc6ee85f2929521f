"""The demo site and the throwaway Redis are test infrastructure: if they lie, every test lies."""

from __future__ import annotations

import hashlib
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

from distcrawl.demo.site import (
    DemoSite,
    LogLine,
    SiteConfig,
    _parse_args,
    bfs_from_home,
    expected_pages,
    home_links,
    leaf_links,
    page_links,
    read_log,
    route,
)
from distcrawl.testing.redis_server import RedisServer, find_free_port

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


def test_default_home_page_is_unchanged_by_the_leaves_option() -> None:
    """A digest taken before leaves existed: tests and the demo rely on this exact page."""
    body = route("/", SiteConfig(50, 5, 1, 0.0, None)).body
    digest = "e191f46b6b15f301b7886242037c6fb59249653497db1e0520d49142948d8a5d"
    assert hashlib.sha256(body).hexdigest() == digest
    assert route("/", SiteConfig(50, 5, 1, 0.0, None, leaves=0)).body == body
    assert "/leaf/" not in body.decode()
    assert route("/leaf/0", SiteConfig(50, 5, 1, 0.0, None)).status == 404


def test_home_page_links_every_leaf_in_order_after_the_pages() -> None:
    cfg = SiteConfig(50, 5, 1, 0.0, None, leaves=3000)
    hrefs = HREF.findall(route("/", cfg).body.decode())
    assert hrefs == home_links(50) + [f"/leaf/{i}" for i in range(3000)]
    assert leaf_links(3000) == hrefs[10:]


def test_leaf_pages_are_tiny_titled_and_link_free() -> None:
    cfg = SiteConfig(50, 5, 1, 0.0, None, leaves=100)
    for i in (0, 1, 99):
        answer = route(f"/leaf/{i}", cfg)
        text = answer.body.decode()
        assert answer.status == 200 and answer.content_type.startswith(b"text/html")
        assert f"<title>Leaf {i}</title>" in text
        assert HREF.findall(text) == [] and "<a " not in text
        assert len(answer.body) < 300
    for path in ("/leaf/100", "/leaf/01", "/leaf/-1", "/leaf/x", "/leaf/", "/leaf/3/"):
        assert route(path, cfg).status == 404, path


def test_leaves_are_expected_and_reached_by_bfs() -> None:
    assert expected_pages(50, leaves=4) == expected_pages(50) | {f"/leaf/{i}" for i in range(4)}
    assert set(bfs_from_home(50, 5, seed=1, leaves=4)) == expected_pages(50, leaves=4)
    assert list(bfs_from_home(50, 5, seed=1)) == list(bfs_from_home(50, 5, seed=1, leaves=0))


def test_leaves_option_on_command_line_and_constructor() -> None:
    assert _parse_args([]).leaves == 0
    assert _parse_args(["--leaves", "7"]).leaves == 7
    assert "--leaves" not in DemoSite(pages=5).command()
    command = DemoSite(pages=5, leaves=7).command()
    assert command[command.index("--leaves") + 1] == "7"
    assert DemoSite(pages=5, leaves=7).expected_pages() == expected_pages(5, leaves=7)


def test_site_spider_follows_every_leaf_of_the_home_page() -> None:
    """The spider has no per-page link cap: all 5000 leaves become requests, in order."""
    from scrapy import Request
    from scrapy.http import HtmlResponse

    from distcrawl.items import PageItem
    from distcrawl.spiders.site import SiteSpider

    url = "http://127.0.0.1:8000/"
    body = route("/", SiteConfig(20, 3, 1, 0.0, None, leaves=5000)).body
    response = HtmlResponse(
        url, body=body, headers={"Content-Type": "text/html; charset=utf-8"}, request=Request(url)
    )
    out = list(SiteSpider().parse(response))
    expected = [url[:-1] + p for p in home_links(20) + leaf_links(5000)]
    assert [r.url for r in out if isinstance(r, Request)] == expected
    items = [i for i in out if isinstance(i, PageItem)]
    assert len(items) == 1 and items[0].links == expected


# ------------------------------------------------------------------ live site


def test_home_page(site: DemoSite) -> None:
    status, ctype, body = fetch(site.url + "/")
    assert status == 200
    assert ctype == "text/html; charset=utf-8"
    assert HREF.findall(body.decode()) == [f"/page/{k}" for k in range(10)]


def test_site_with_thousands_of_leaves(demo_site: Callable[..., DemoSite]) -> None:
    leafy = demo_site(pages=20, links=3, leaves=5000)
    status, _, body = fetch(leafy.url + "/", timeout=10)
    hrefs = HREF.findall(body.decode())
    assert status == 200
    assert hrefs == home_links(20) + [f"/leaf/{i}" for i in range(5000)]
    status, ctype, body = fetch(leafy.url + "/leaf/4999", timeout=10)
    assert status == 200 and ctype == "text/html; charset=utf-8"
    assert b"<title>Leaf 4999</title>" in body and HREF.findall(body.decode()) == []
    assert fetch(leafy.url + "/leaf/5000", timeout=10)[0] == 404
    assert leafy.expected_urls() == {leafy.url + p for p in expected_pages(20, leaves=5000)}
    assert len(leafy.expected_urls()) == 1 + 20 + 5000


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


@pytest.mark.integration
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


@pytest.mark.integration
def test_redis_without_aof_loses_data_on_restart(tmp_path: Path) -> None:
    with RedisServer(directory=tmp_path) as server:
        client = server.client()
        client.set("gone", "1")
        client.close()
        server.restart()
        client = server.client()
        assert client.get("gone") is None
        client.close()


@pytest.mark.integration
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


@pytest.mark.integration
def test_redis_fixed_port_and_owned_dir_cleanup() -> None:
    port = find_free_port()
    server = RedisServer(port=port).start()
    directory = server.directory
    assert server.port == port and directory is not None and Path(directory).is_dir()
    server.stop()
    assert not Path(directory).exists()
