import pickle

import pytest
from scrapy import FormRequest, Request, Spider

from distcrawl.serialize import DecodeError, RequestCodec, SerializationError


class DemoSpider(Spider):
    name = "demo"

    def parse_page(self, response):
        pass

    def on_error(self, failure):
        pass


def full_request(spider):
    return Request(
        "https://example.test/path?q=1",
        callback=spider.parse_page,
        errback=spider.on_error,
        method="POST",
        headers={"X-One": "1", "Accept": ["a", "b"]},
        body=b"\x00binary\xff",
        cookies={"session": "abc"},
        meta={"depth": 3, "nested": {"list": [1, 2.5, None, True]}, "raw": b"\x01"},
        encoding="latin-1",
        priority=-7,
        dont_filter=True,
        flags=["flag"],
        cb_kwargs={"page": 2},
    )


@pytest.mark.parametrize("serializer", ["msgpack", "json", "pickle"])
def test_round_trip_of_every_attribute(serializer):
    spider = DemoSpider()
    codec = RequestCodec(serializer, spider)
    original = full_request(spider)
    copy = codec.decode(codec.encode(original))
    assert copy.url == original.url
    assert copy.callback == spider.parse_page
    assert copy.errback == spider.on_error
    assert copy.method == "POST"
    assert copy.headers.getlist("Accept") == [b"a", b"b"]
    assert copy.headers[b"X-One"] == b"1"
    assert copy.body == original.body
    assert copy.cookies == {"session": "abc"}
    assert copy.meta == original.meta
    assert copy.encoding == "latin-1"
    assert copy.priority == -7
    assert copy.dont_filter is True
    assert copy.flags == ["flag"]
    assert copy.cb_kwargs == {"page": 2}


def test_defaults_are_not_stored():
    codec = RequestCodec("msgpack", DemoSpider())
    payload = codec.encode(Request("http://127.0.0.1:8000/page/1"))
    assert len(payload) < 40
    copy = codec.decode(payload)
    assert copy.method == "GET" and copy.priority == 0 and copy.meta == {}


def test_request_subclass_round_trip():
    codec = RequestCodec("msgpack", DemoSpider())
    request = FormRequest("http://a.test/", formdata={"a": "1"})
    copy = codec.decode(codec.encode(request))
    assert type(copy) is FormRequest
    assert copy.body == b"a=1"


def test_unserializable_meta_names_the_request():
    codec = RequestCodec("msgpack", DemoSpider())
    with pytest.raises(SerializationError, match=r"http://a.test/x"):
        codec.encode(Request("http://a.test/x", meta={"obj": object()}))


def test_callback_must_be_a_spider_method():
    codec = RequestCodec("msgpack", DemoSpider())
    with pytest.raises(SerializationError, match="not a method of the spider"):
        codec.encode(Request("http://a.test/", callback=lambda r: None))


def test_pickle_is_refused_unless_opted_in():
    payload = b"p" + pickle.dumps({"u": "http://a.test/"})
    with pytest.raises(DecodeError, match="pickled payload refused"):
        RequestCodec("msgpack").decode(payload)
    assert RequestCodec("pickle").decode(payload).url == "http://a.test/"


@pytest.mark.parametrize(
    "payload",
    [b"", b"mnot msgpack \xc1", b"j{broken", b"zunknown", b"m\x93\x01\x02\x03", b'j{"x": 1}'],
)
def test_garbage_payloads_raise_decode_error(payload):
    with pytest.raises(DecodeError):
        RequestCodec("msgpack").decode(payload)


def test_request_class_must_already_be_imported():
    import msgpack

    payload = b"m" + msgpack.packb({"u": "http://a.test/", "cls": "some_unimported_mod.Evil"})
    with pytest.raises(DecodeError, match="not loaded"):
        RequestCodec("msgpack").decode(payload)


def test_unknown_callback_is_a_decode_error():
    import msgpack

    payload = b"m" + msgpack.packb({"u": "http://a.test/", "cb": "no_such_method"})
    with pytest.raises(DecodeError, match="no_such_method"):
        RequestCodec("msgpack", DemoSpider()).decode(payload)
