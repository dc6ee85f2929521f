import json
import re
import sys
from pathlib import Path

import pytest
import scrapy

from distcrawl import retry
from distcrawl.codec import deadletter, politeness, start_urls
from distcrawl.codec.start_urls import (
    RESERVED_META_KEYS,
    InvalidEntry,
    parse_entry,
    request_from_entry,
    validate_url,
)
from distcrawl.engine.intake import RETRY_DELAY_META
from distcrawl.spiders import site

SCHEMES = ("http", "https")


def parse(raw: bytes, max_bytes: int = 8192, allowed: tuple[str, ...] = ()):
    return parse_entry(raw, max_bytes=max_bytes, schemes=SCHEMES, start_meta_keys=allowed).data


def entry(**fields) -> bytes:
    return json.dumps({"url": "http://a.test/", **fields}).encode()


def test_plain_url():
    assert parse(b"  http://127.0.0.1:8000/a  ") == {"url": "http://127.0.0.1:8000/a"}


def test_json_entry_with_options():
    data = parse(
        b'{"url": "https://example.test/x", "priority": 5, "meta": {"k": 1}, "method": "POST",'
        b' "headers": {"X-A": "b"}, "body": "q=1", "dont_filter": true}',
        allowed=("dont_filter",),
    )
    request = request_from_entry(data)
    assert request.url == "https://example.test/x"
    assert request.priority == 5
    assert request.meta["k"] == 1
    assert request.method == "POST"
    assert request.headers[b"X-A"] == b"b"
    assert request.body == b"q=1"
    assert request.dont_filter is True


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not a url", "not a URL"),
        (b"example.com/page", "no scheme"),
        (b"ftp://example.com/file", "unsupported scheme"),
        (b"http://", "no host"),
        (b"http://example.com:99999999/", "malformed URL"),
        (b'{"url": "http://a.test/", ', "invalid JSON"),
        (b'{"href": "http://a.test/"}', "unknown field"),
        (b'{"priority": 1}', "no 'url'"),
        (b'{"url": "http://a.test/", "priority": "high"}', "'priority' must be int"),
        (b'{"url": "http://a.test/", "priority": true}', "'priority' must be int"),
        (b"[1, 2]", "not a URL"),
        (b"\xff\xfe", "not UTF-8"),
        (b"   ", "empty entry"),
    ],
)
def test_bad_entries_give_a_reason(raw, reason):
    with pytest.raises(InvalidEntry, match=reason):
        parse(raw)


def test_oversized_entry():
    with pytest.raises(InvalidEntry, match="too large"):
        parse(b"http://a.test/" + b"a" * 100, max_bytes=50)


@pytest.mark.parametrize("key", [*sorted(RESERVED_META_KEYS), "distcrawl_anything_new"])
def test_reserved_meta_key_is_refused_by_name(key):
    with pytest.raises(InvalidEntry, match=rf"reserved key\(s\) in JSON entry: meta\.{key} "):
        parse(entry(meta={key: 1, "tag": "x"}))
    # DISTCRAWL_START_META_KEYS lets exactly the named key through
    assert parse(entry(meta={key: 1}), allowed=(key,))["meta"] == {key: 1}


def test_every_refused_key_is_named():
    raw = entry(meta={"proxy": "http://127.0.0.1:1", "tag": "x", "download_slot": "s"})
    with pytest.raises(InvalidEntry, match=r"entry: meta\.download_slot, meta\.proxy \("):
        parse(raw, allowed=("cookiejar",))


def test_prefixed_key_is_shown_short_and_escaped():
    key = "distcrawl_x\nWARNING forged line" + "y" * 200
    with pytest.raises(InvalidEntry) as caught:
        parse(entry(meta={key: 1}))
    assert "meta.distcrawl_x\\nWARNING forged line" in str(caught.value)
    assert "\n" not in str(caught.value) and "y" * 100 not in str(caught.value)


def test_own_and_third_party_keys_pass():
    meta = {"tag": "x", "splash": {"args": {}}, "playwright": True, "Proxy": 1, "_mine": 2}
    assert request_from_entry(parse(entry(meta=meta))).meta == meta


def test_dont_filter_true_needs_the_setting():
    with pytest.raises(InvalidEntry, match=r"entry: dont_filter \("):
        parse(entry(dont_filter=True), allowed=("download_timeout",))
    with pytest.raises(InvalidEntry, match=r"entry: dont_filter, meta\.proxy \("):
        parse(entry(dont_filter=True, meta={"proxy": "http://127.0.0.1:1"}))
    assert request_from_entry(parse(entry(dont_filter=True), allowed=("dont_filter",))).dont_filter
    # false is what every entry gets anyway
    assert request_from_entry(parse(entry(dont_filter=False))).dont_filter is False


def test_plain_url_entries_carry_no_meta():
    assert request_from_entry(parse(b"http://a.test/?proxy=1&dont_filter=1")).meta == {}


def test_distcrawl_meta_keys_are_reserved():
    """distcrawl's own keys, by the constants its modules read them with."""
    own = {
        retry.ERRORS_META,
        retry.CALLBACK_FAILURES_META,
        RETRY_DELAY_META,
        site.SCOPE_META,
        politeness.DOWNLOAD_SLOT,
        *deadletter.ATTEMPT_META,
    }
    assert own <= RESERVED_META_KEYS


#: meta keys Scrapy's source mentions that change nothing for a start request from Redis:
#: ``scrapy parse`` bookkeeping (commands/parse.py)
NOT_ACTED_ON = {"_callback", "_depth"}
META_READ = re.compile(
    r"""meta(?:\.get|\.pop|\.setdefault)\(\s*["'](\w+)["']"""
    r"""|meta\[\s*["'](\w+)["']\s*\]"""
    r"""|["'](\w+)["']\s+(?:not\s+)?in\s+[\w.]*meta\b"""
)


def test_list_covers_every_meta_key_scrapy_reads():
    """A Scrapy upgrade that reads a new meta key fails here until the key is classified."""
    root = Path(scrapy.__file__).parent
    found = {
        key
        for path in root.rglob("*.py")
        for match in META_READ.finditer(path.read_text(encoding="utf-8"))
        for key in match.groups()
        if key
    }
    assert {"proxy", "dont_obey_robotstxt", "download_fail_on_dataloss"} <= found  # sanity
    unclassified = found - NOT_ACTED_ON - RESERVED_META_KEYS
    assert not unclassified, sorted(unclassified)


def test_a_url_with_any_unicode_space_is_not_a_url():
    """validate_url refuses a URL holding a character for which str.isspace() is true (a
    regular expression finds it): every such code point, and none other, is refused so."""
    spaces = [chr(i) for i in range(sys.maxunicode + 1) if chr(i).isspace()]
    assert len(spaces) > 20
    for c in spaces:
        with pytest.raises(InvalidEntry, match="not a URL"):
            validate_url(f"http://a.test/x{c}y", ("http",))
    others = "".join(chr(i) for i in range(sys.maxunicode + 1) if not chr(i).isspace())
    assert not any(c.isspace() for c in others) and start_urls._SPACE.search(others) is None


def test_a_bad_start_url_argument_is_dead_lettered_and_the_good_ones_crawled(
    workers, demo_site, redis_client
) -> None:
    """``scrapy crawl site -a start_urls=bad,good``. Before: "Error while reading start
    items and requests" and nothing crawled, the good URL lost with the bad one."""
    import json

    from tests.support import page_fetches

    site = demo_site(pages=5)
    worker = workers(
        1,
        spider_args={"start_urls": f"not a url,ftp://files.example/x,{site.url}/"},
        DISTCRAWL_IDLE_TIMEOUT=2,
    )
    assert worker.wait(120) == 0, worker.log()[-3000:]
    log = worker.log()
    assert "Error while reading start" not in log
    assert len(page_fetches(site)) == 6  # the start page and its 5 pages
    dead = [json.loads(raw) for raw in redis_client.lrange("site:dead", 0, -1)]
    assert sorted(d["raw"] for d in dead) == ["ftp://files.example/x", "not a url"]
    assert {d["source"] for d in dead} == {"start_urls"}  # redrive takes them back there
    assert all(d["reason"] for d in dead)
    assert log.count("Bad start URL") == 2
