import pytest

from distcrawl.start_urls import InvalidEntry, parse_entry, request_from_entry

SCHEMES = ("http", "https")


def parse(raw: bytes, max_bytes: int = 8192):
    return parse_entry(raw, max_bytes=max_bytes, schemes=SCHEMES).data


def test_plain_url():
    assert parse(b"  http://127.0.0.1:8000/a  ") == {"url": "http://127.0.0.1:8000/a"}


def test_json_entry_with_options():
    data = parse(
        b'{"url": "https://example.test/x", "priority": 5, "meta": {"k": 1}, "method": "POST",'
        b' "headers": {"X-A": "b"}, "body": "q=1", "dont_filter": true}'
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
