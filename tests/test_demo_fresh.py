"""The demo site's fresh pages: the revisit tests trust their versions, validators and counters,
so these check them on a virtual clock and then over real HTTP."""

from __future__ import annotations

import email.utils
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from distcrawl.demo.fresh import (
    FRESH_INDEX,
    FreshCount,
    FreshPages,
    etag,
    etag_matches,
    fresh_path,
    fresh_paths,
    http_date,
    parse_http_date,
)
from distcrawl.demo.site import DemoSite, SiteConfig, _parse_args, route

HREF = re.compile(r'href="([^"]+)"')
VERSION = re.compile(r'<p class="version">(\w+) page (\d+), version (\d+)</p>')
CLOCK = re.compile(r'<p class="clock">(\d+)</p>')


class Answer:
    """One response, whatever its status (urllib raises for a 304)."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def version(self) -> int:
        match = VERSION.search(self.body.decode())
        assert match is not None, self.body
        return int(match.group(3))


def get(url: str, method: str = "GET", **headers: str) -> Answer:
    req = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return Answer(resp.status, dict(resp.headers), resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return Answer(err.code, dict(err.headers), err.read())


def inm(tag: str) -> dict[str, str]:
    return {"If-None-Match": tag}


def ims(date: str) -> dict[str, str]:
    return {"If-Modified-Since": date}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ on a virtual clock


def fresh_at(now: float, **options: float) -> tuple[FreshPages, Clock]:
    clock = Clock(now)
    return FreshPages(start=1000.25, clock=clock, **options), clock


def test_versions_follow_the_clock_by_kind() -> None:
    pages, clock = fresh_at(1000.25, fast=2.0, slow=10.0)
    for now, fast, slow in [(1000.25, 0, 0), (1002.24, 0, 0), (1002.25, 1, 0), (1020.3, 10, 2)]:
        clock.now = now
        assert pages.version("fast", now) == fast
        assert pages.version("slow", now) == slow
        assert pages.version("never", now) == 0
        answer = pages.answer("/fresh/fast/3.html")
        assert answer is not None and answer.status == 200
        assert f"fast page 3, version {fast}".encode() in answer.body
        assert (b"etag", f'"fast-3-v{fast}"'.encode()) in answer.headers
    assert pages.version_start("fast", 10) == 1020.25
    assert pages.version_start("never", 0) == 1000.25


def test_last_modified_is_the_version_start_at_whole_seconds() -> None:
    pages, _ = fresh_at(1007.0, fast=2.0)  # version 3 began at 1006.25
    answer = pages.answer("/fresh/fast/0.html")
    assert answer is not None
    headers = dict(answer.headers)
    assert headers[b"last-modified"] == http_date(1006.0).encode()
    assert headers[b"last-modified"] == b"Thu, 01 Jan 1970 00:16:46 GMT"
    assert headers[b"etag"] == etag("fast", 0, 3).encode() == b'"fast-0-v3"'


def test_if_none_match_lists_weak_tags_and_star() -> None:
    assert etag_matches('"a-1-v2"', '"a-1-v2"')
    assert etag_matches('W/"a-1-v2"', '"a-1-v2"')
    assert etag_matches('"x", W/"y" ,"a-1-v2"', '"a-1-v2"')
    assert etag_matches(" * ", '"a-1-v2"')
    assert not etag_matches('"a-1-v1"', '"a-1-v2"')
    assert not etag_matches("a-1-v2", '"a-1-v2"')  # not a quoted tag
    assert not etag_matches("", '"a-1-v2"')


def test_conditional_answers_on_the_virtual_clock() -> None:
    pages, clock = fresh_at(1007.0, fast=2.0)
    last_modified = http_date(1006.25)
    for headers, status in [
        ({"if_none_match": '"fast-0-v3"'}, 304),
        ({"if_none_match": '"fast-0-v2", W/"fast-0-v3"'}, 304),
        ({"if_none_match": "*"}, 304),
        ({"if_none_match": '"fast-0-v2"'}, 200),
        # If-None-Match decides alone when it is there
        ({"if_none_match": '"fast-0-v2"', "if_modified_since": last_modified}, 200),
        ({"if_modified_since": last_modified}, 304),
        ({"if_modified_since": http_date(1007.0)}, 304),
        ({"if_modified_since": http_date(1005.0)}, 200),
        ({"if_modified_since": http_date(2000.0)}, 200),  # after the server's clock: invalid
        ({"if_modified_since": "yesterday"}, 200),
        ({}, 200),
    ]:
        answer = pages.answer("/fresh/fast/0.html", "", **headers)
        assert answer is not None and answer.status == status, headers
        assert dict(answer.headers)[b"etag"] == b'"fast-0-v3"'
        assert (answer.body == b"") == (status == 304)
        assert (answer.content_type == b"") == (status == 304)
    clock.now = 1008.3  # version 4
    answer = pages.answer("/fresh/fast/0.html", "", if_none_match='"fast-0-v3"')
    assert answer is not None and answer.status == 200
    assert dict(answer.headers)[b"etag"] == b'"fast-0-v4"'


def test_without_validators_there_is_a_clock_and_never_a_304() -> None:
    pages, clock = fresh_at(1007.0)
    first = pages.answer("/fresh/slow/1.html", "validators=0", if_none_match="*")
    clock.now = 1007.001
    second = pages.answer("/fresh/slow/1.html", "validators=0", if_none_match="*")
    assert first is not None and second is not None
    assert first.status == second.status == 200 and first.headers == second.headers == ()
    assert CLOCK.findall(first.body.decode()) == ["1007000"]
    assert CLOCK.findall(second.body.decode()) == ["1007001"]
    assert HREF.findall(first.body.decode()) == ["/fresh/?validators=0"]
    with_tags = pages.answer("/fresh/slow/1.html", "validators=1")
    assert with_tags is not None and with_tags.headers and b"clock" not in with_tags.body


def test_index_and_unknown_paths() -> None:
    pages, _ = fresh_at(1007.0, pages=3)
    index = pages.answer(FRESH_INDEX)
    assert index is not None and index.status == 200
    assert HREF.findall(index.body.decode()) == fresh_paths(3)
    assert fresh_paths(3)[:4] == [
        "/fresh/fast/0.html",
        "/fresh/fast/1.html",
        "/fresh/fast/2.html",
        "/fresh/slow/0.html",
    ]
    variants = pages.answer(FRESH_INDEX, "validators=0")
    assert variants is not None
    assert HREF.findall(variants.body.decode()) == fresh_paths(3, validators=False)
    assert fresh_path("never", 2, validators=False) == "/fresh/never/2.html?validators=0"
    for path in ("/fresh/fast/3.html", "/fresh/fast/01.html", "/fresh/other/0.html"):
        assert pages.answer(path) is None, path  # the site's own 404
    for path in ("/fresh/fast/0", "/fresh/fast/", "/fresh", "/page/1"):
        assert pages.answer(path) is None, path


def test_the_home_page_does_not_link_the_fresh_pages() -> None:
    body = route("/", SiteConfig(3000, 17, 1, 0.0, None)).body.decode()
    assert "/fresh" not in body
    assert route("/fresh/", SiteConfig(3000, 17, 1, 0.0, None)).status == 404  # served by fresh


def test_bad_periods_are_refused() -> None:
    with pytest.raises(ValueError, match="fresh periods must be positive"):
        FreshPages(fast=0)
    with pytest.raises(SystemExit):
        _parse_args(["--fresh-slow", "-1"])


def test_fresh_options_on_command_line_and_constructor() -> None:
    args = _parse_args([])
    assert (args.fresh_pages, args.fresh_fast, args.fresh_slow) == (10, 2.0, 10.0)
    args = _parse_args(["--fresh-pages", "4", "--fresh-fast", "0.3", "--fresh-slow", "3"])
    assert (args.fresh_pages, args.fresh_fast, args.fresh_slow) == (4, 0.3, 3.0)
    command = DemoSite(pages=5, fresh_pages=4, fresh_fast=0.3).command()
    assert command[command.index("--fresh-pages") + 1] == "4"
    assert command[command.index("--fresh-fast") + 1] == "0.3"
    assert command[command.index("--fresh-slow") + 1] == "10.0"


def test_http_dates() -> None:
    assert parse_http_date("Thu, 01 Jan 1970 00:16:46 GMT") == 1006.0
    assert parse_http_date("Thu, 01 Jan 1970 00:16:46 -0000") == 1006.0
    assert parse_http_date(email.utils.formatdate(1006.0, usegmt=True)) == 1006.0
    for junk in ("", "yesterday", "Thu, 99 Foo 1970"):
        assert parse_http_date(junk) is None


# ------------------------------------------------------------------ over HTTP


def test_fast_pages_advance_and_never_pages_stay(demo_site: Callable[..., DemoSite]) -> None:
    site = demo_site(pages=5, fresh_fast=0.3)
    start = site.fresh_stats().start
    first = get(site.url + "/fresh/fast/2.html")
    versions = [first.version]
    deadline = time.monotonic() + 5.0
    for _ in range(100):  # at most 100 fetches and 5 s
        if len(set(versions)) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
        before = time.time()
        answer = get(site.url + "/fresh/fast/2.html")
        after = time.time()
        assert answer.status == 200
        assert answer.headers["ETag"] == f'"fast-2-v{answer.version}"'
        # the same machine's clock: the version is the one of the request's moment
        assert (before - start) // 0.3 - 1 <= answer.version <= (after - start) // 0.3 + 1
        versions.append(answer.version)
    assert len(set(versions)) >= 3 and versions == sorted(versions)
    never = get(site.url + "/fresh/never/4.html")
    assert never.status == 200 and never.version == 0
    assert never.headers["ETag"] == '"never-4-v0"'
    assert parse_http_date(never.headers["Last-Modified"]) == int(start)


def test_304_on_if_none_match_and_if_modified_since(demo_site: Callable[..., DemoSite]) -> None:
    site = demo_site(pages=5, fresh_slow=60.0)
    url = site.url + "/fresh/slow/1.html"
    ok = get(url)
    tag, last_modified = ok.headers["ETag"], ok.headers["Last-Modified"]
    assert ok.status == 200 and tag == '"slow-1-v0"' and ok.version == 0
    for headers in (inm(tag), inm(f'"nope", W/{tag}'), inm("*"), ims(last_modified)):
        answer = get(url, **headers)
        assert answer.status == 304, headers
        assert answer.body == b""
        assert answer.headers["ETag"] == tag
        assert answer.headers["Last-Modified"] == last_modified
        assert "Content-Length" not in answer.headers and "Content-Type" not in answer.headers
    assert get(url, **inm('"slow-1-v1"')).status == 200
    assert get(url, **inm('"nope"'), **ims(last_modified)).status == 200
    assert get(url, **ims("Thu, 01 Jan 1970 00:00:00 GMT")).status == 200
    assert get(url, **ims("not a date")).status == 200
    head = get(url, method="HEAD", **inm(tag))
    assert head.status == 304 and head.body == b""


def test_304_after_a_delay_too(demo_site: Callable[..., DemoSite]) -> None:
    """A delayed answer is sent by another code path: a 304 there has no length either."""
    site = demo_site(pages=5, delay=0.1)
    url = site.url + "/fresh/never/0.html"
    tag = get(url).headers["ETag"]
    answer = get(url, **inm(tag))
    assert answer.status == 304 and answer.body == b"" and answer.headers["ETag"] == tag
    assert "Content-Length" not in answer.headers
    assert get(url).status == 200


def test_200_with_a_new_etag_after_a_change(demo_site: Callable[..., DemoSite]) -> None:
    site = demo_site(pages=5, fresh_fast=0.5)
    url = site.url + "/fresh/fast/0.html"
    old = get(url).headers["ETag"]
    changed = None
    deadline = time.monotonic() + 5.0
    for _ in range(100):  # polled every 0.05 s: the new version began at most that long ago
        answer = get(url, **inm(old))
        if answer.status == 200:
            changed = answer
            break
        assert answer.status == 304 and answer.headers["ETag"] == old
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert changed is not None, "the fast page never changed"
    new = changed.headers["ETag"]
    assert new != old and new == f'"fast-0-v{changed.version}"' and changed.version >= 1
    assert get(url, **inm(new)).status == 304  # well within the new version's 0.5 s


def test_without_validators_a_clock_and_no_304(demo_site: Callable[..., DemoSite]) -> None:
    site = demo_site(pages=5)
    url = site.url + "/fresh/fast/1.html?validators=0"
    clocks = []
    for _ in range(2):
        answer = get(url, **inm("*"), **ims(email.utils.formatdate(usegmt=True)))
        assert answer.status == 200
        assert "ETag" not in answer.headers and "Last-Modified" not in answer.headers
        assert "fast page 1, version" in answer.body.decode()
        clocks += [int(c) for c in CLOCK.findall(answer.body.decode())]
        time.sleep(0.02)
    assert len(clocks) == 2 and clocks[0] < clocks[1]
    assert abs(clocks[1] - time.time() * 1000) < 60_000
    links = HREF.findall(get(site.url + "/fresh/?validators=0").body.decode())
    assert links == fresh_paths(10, validators=False)


def test_counters_count_200s_and_304s(demo_site: Callable[..., DemoSite]) -> None:
    site = demo_site(pages=5, fresh_pages=3)
    assert site.fresh_stats().counts == {}
    page, variant = fresh_path("never", 2), fresh_path("slow", 0, validators=False)
    tag = get(site.url + page).headers["ETag"]
    get(site.url + page)
    for _ in range(3):
        assert get(site.url + page, **inm(tag)).status == 304
    assert get(site.url + variant).status == 200
    assert get(site.url + "/fresh/never/3.html").status == 404  # fresh_pages=3
    assert HREF.findall(get(site.url + FRESH_INDEX).body.decode()) == fresh_paths(3)
    stats = site.fresh_stats()
    assert stats.of(page) == FreshCount(ok=2, not_modified=3)
    assert stats.of(variant) == FreshCount(ok=1, not_modified=0)
    assert stats.of(FRESH_INDEX) == FreshCount(1, 0)
    assert stats.of("/fresh/never/3.html") == FreshCount()
    assert set(stats.counts) == {page, variant, FRESH_INDEX}
    assert stats.pages == 3 and stats.periods == {"fast": 2.0, "slow": 10.0, "never": None}
    # the endpoint itself, and the request log agrees
    with urllib.request.urlopen(site.url + "/_fresh/stats", timeout=10) as resp:
        assert resp.headers["Content-Type"] == "application/json"
        raw = json.loads(resp.read())
    assert raw["counts"][page] == {"200": 2, "304": 3}
    logged = [(ln.path, ln.status) for ln in site.read_log() if ln.path == page]
    assert logged == [(page, 200)] * 2 + [(page, 304)] * 3
