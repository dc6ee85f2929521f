import pickle

import pytest
from scrapy import FormRequest, Request, Spider
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule

from distcrawl.codec.serialize import DecodeError, RequestCodec, SerializationError
from distcrawl.spiders import RedisCrawlSpider


class DemoSpider(Spider):
    name = "demo"

    def parse_page(self, response, page=1):
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


# ---------------------------------------------------------------- callbacks read from Redis


class GuardedSpider(Spider):
    name = "guarded"
    colour = "red"
    rules = ()

    def parse(self, response, **kwargs):
        pass

    def parse_page(self, response):
        pass

    async def parse_async(self, response, page=1):
        pass

    def on_error(self, failure):
        pass

    def _private(self, response):
        pass

    def closed(self, reason):
        pass

    def start_requests(self):
        return []

    @staticmethod
    def helper(response):
        pass

    @classmethod
    def factory(cls, response):
        pass

    @property
    def prop(self):
        return self.parse


def payload(**data):
    import msgpack

    return b"m" + msgpack.packb({"u": "http://a.test/", **data})


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("__init__", "special method"),
        ("__class__", "special method"),
        ("_private", "private method"),
        ("_parse", "private method"),
        ("_set_crawler", "lifecycle"),
        ("start", "lifecycle"),
        ("start_requests", "lifecycle"),
        ("closed", "lifecycle"),
        ("close", "lifecycle"),
        ("from_crawler", "lifecycle"),
        ("update_settings", "lifecycle"),
        ("handles_request", "lifecycle"),
        ("log", "lifecycle"),
        ("logger", "lifecycle"),
        ("make_request_from_data", "lifecycle"),
        ("name", "not a method"),
        ("colour", "not a method"),
        ("rules", "not a method"),
        ("helper", "not a method"),
        ("factory", "not a method"),
        ("prop", "not a method"),
        ("no_such_method", "no method"),
        ("parse page", "not a method name"),
    ],
)
@pytest.mark.parametrize("key", ["cb", "eb"])
def test_a_name_that_is_not_a_callback_is_refused(name, why, key):
    spider = GuardedSpider()
    with pytest.raises(DecodeError, match=why) as info:
        RequestCodec("msgpack", spider).decode(payload(**{key: name}))
    assert repr(name) in str(info.value)
    assert ("errback" if key == "eb" else "callback") in str(info.value)


def test_init_with_cb_kwargs_cannot_replace_parse():
    spider = GuardedSpider()
    original = spider.parse
    with pytest.raises(DecodeError, match="'__init__' is a special method"):
        RequestCodec("msgpack", spider).decode(payload(cb="__init__", k={"parse": "x"}))
    assert spider.parse == original


@pytest.mark.parametrize("name", ["parse", "parse_page", "parse_async", "on_error"])
def test_the_spiders_callbacks_are_resolved(name):
    spider = GuardedSpider()
    request = RequestCodec("msgpack", spider).decode(payload(cb=name, eb="on_error"))
    assert request.callback == getattr(spider, name)
    assert request.errback == spider.on_error


def test_cb_kwargs_must_fit_the_callback():
    codec = RequestCodec("msgpack", GuardedSpider())
    with pytest.raises(DecodeError, match=r"do not fit callback 'parse_page'.*'x'"):
        codec.decode(payload(cb="parse_page", k={"x": 1}))
    with pytest.raises(DecodeError, match=r"do not fit callback 'parse'.*response"):
        codec.decode(payload(cb="parse", k={"response": "x"}))
    with pytest.raises(DecodeError, match="not a map of names"):
        codec.decode(payload(cb="parse", k={1: "x"}))
    assert codec.decode(payload(cb="parse_async", k={"page": 3})).cb_kwargs == {"page": 3}
    assert codec.decode(payload(cb="parse", k={"any": 1})).cb_kwargs == {"any": 1}
    assert codec.decode(payload(k={"any": 1})).callback is None  # default callback: **kwargs


def test_a_decorated_callback_takes_what_its_wrapper_takes():
    import functools

    def with_session(func):
        @functools.wraps(func)
        def wrapper(self, response, session=None, **kwargs):
            return func(self, response, **kwargs)

        return wrapper

    class Decorated(Spider):
        name = "decorated"

        @with_session
        def parse_item(self, response):
            pass

    codec = RequestCodec("msgpack", Decorated())
    assert codec.decode(payload(cb="parse_item", k={"session": "s"})).cb_kwargs == {"session": "s"}


def test_an_instance_attribute_hiding_a_method_is_refused():
    spider = GuardedSpider()
    codec = RequestCodec("msgpack", spider)
    spider.parse_page = print
    with pytest.raises(DecodeError, match="'parse_page' is no longer its method"):
        codec.decode(payload(cb="parse_page"))


def test_a_request_with_a_private_callback_is_refused_when_stored():
    spider = GuardedSpider()
    codec = RequestCodec("msgpack", spider)
    with pytest.raises(SerializationError, match="'_private' is a private method"):
        codec.encode(Request("http://a.test/", callback=spider._private))
    with pytest.raises(SerializationError, match=r"errback refused.*'closed'"):
        codec.encode(Request("http://a.test/", errback=spider.closed))


def test_allowed_callbacks_narrow_the_spiders_callbacks(caplog):
    spider = GuardedSpider()
    with caplog.at_level("WARNING", logger="distcrawl.codec.serialize"):
        codec = RequestCodec("msgpack", spider, allowed_callbacks=("parse_page", "__init__"))
    assert "DISTCRAWL_ALLOWED_CALLBACKS lists '__init__', which is refused" in caplog.text
    assert codec.decode(payload(cb="parse_page")).callback == spider.parse_page
    for name in ("parse", "on_error"):
        with pytest.raises(DecodeError, match=f"'{name}' is not in DISTCRAWL_ALLOWED_CALLBACKS"):
            codec.decode(payload(cb=name))
    with pytest.raises(DecodeError, match="special method"):  # a listed name is no way in
        codec.decode(payload(cb="__init__"))
    with pytest.raises(SerializationError, match="DISTCRAWL_ALLOWED_CALLBACKS"):
        codec.encode(Request("http://a.test/", callback=spider.parse))
    # a request without callback still goes to the default callback
    assert codec.decode(codec.encode(Request("http://a.test/"))).callback is None


class RuleSpider(RedisCrawlSpider):
    name = "rules"
    rules = (Rule(LinkExtractor(), callback="parse_item"),)

    def parse_item(self, response):
        pass


def test_crawl_spider_rule_callbacks_but_not_its_api():
    from scrapy.link import Link

    spider = RuleSpider()
    codec = RequestCodec("msgpack", spider)
    request = spider._build_request(0, Link("http://a.test/", text="a"))
    copy = codec.decode(codec.encode(request))
    assert copy.callback == spider._callback and copy.errback == spider._errback
    assert copy.meta == {"rule": 0, "link_text": "a"}
    assert codec.decode(payload(cb="parse_start_url")).callback == spider.parse_start_url
    for name in ("parse_with_rules", "process_results", "_requests_to_follow", "_parse"):
        with pytest.raises(DecodeError, match=name):
            codec.decode(payload(cb=name))


def test_allowed_callbacks_without_the_rule_callbacks_warn(caplog):
    with caplog.at_level("WARNING", logger="distcrawl.codec.serialize"):
        RequestCodec("msgpack", RuleSpider(), allowed_callbacks=("parse_item",))
    assert "lacks _callback, _errback" in caplog.text


def test_scrapy_private_callbacks_only_where_scrapy_defines_them():
    class Own(Spider):
        name = "own"

        def _callback(self, response):
            pass

    with pytest.raises(DecodeError, match="'_callback' is a private method"):
        RequestCodec("msgpack", Own()).decode(payload(cb="_callback"))


# ---------------------------------------------------------------- Request.attributes


class TaggedRequest(Request):
    attributes = (*Request.attributes, "tag")

    def __init__(self, *args, tag="none", **kwargs):
        self.tag = tag
        super().__init__(*args, **kwargs)


TAGGED = f"{TaggedRequest.__module__}.TaggedRequest"


@pytest.mark.parametrize("serializer", ["msgpack", "json"])
def test_json_request_keeps_dumps_kwargs(serializer):
    from scrapy.http import JsonRequest

    codec = RequestCodec(serializer, DemoSpider())
    request = JsonRequest("http://a.test/", data={"b": 1, "a": [1]}, dumps_kwargs={"indent": 2})
    copy = codec.decode(codec.encode(request))
    assert type(copy) is JsonRequest
    assert copy.dumps_kwargs == {"indent": 2, "sort_keys": True}
    assert copy.body == request.body and copy.method == "POST"
    assert copy.replace(data={"c": 1}).body == b'{\n  "c": 1\n}'


def test_default_attributes_are_not_stored():
    from scrapy.http import JsonRequest

    codec = RequestCodec("msgpack", DemoSpider())
    data = codec.to_dict(JsonRequest("http://a.test/", data={"a": 1}))
    assert "a" not in data and data["cls"] == "scrapy.http.request.json_request.JsonRequest"
    assert "a" not in codec.to_dict(FormRequest("http://a.test/", formdata={"a": "1"}))
    assert codec.to_dict(TaggedRequest("http://a.test/", tag="x"))["a"] == {"tag": "x"}
    assert "a" not in codec.to_dict(TaggedRequest("http://a.test/"))
    assert codec.decode(codec.encode(TaggedRequest("http://a.test/", tag="x"))).tag == "x"


def test_an_attribute_must_be_plain_data():
    codec = RequestCodec("msgpack", DemoSpider())
    with pytest.raises(SerializationError, match="attributes of a Request subclass"):
        codec.encode(TaggedRequest("http://a.test/", tag=object()))


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"a": {"dumps_kwargs": {}}}, "Request has no attribute 'dumps_kwargs'"),
        (
            {"a": {"callback": "__init__"}, "cls": TAGGED},
            "'callback'",
        ),
        ({"a": {"url": "http://b.test/"}, "cls": TAGGED}, "'url'"),
        ({"a": {"nope": 1}, "cls": TAGGED}, "no attribute 'nope'"),
        ({"a": ["tag"], "cls": TAGGED}, "not a map"),
    ],
)
def test_only_the_attributes_the_class_declares(data, why):
    with pytest.raises(DecodeError, match=why):
        RequestCodec("msgpack", DemoSpider()).decode(payload(**data))


def test_shrink_payload_leaves_out_the_largest_parts_first():
    """What a dead letter keeps of a request too large for it (deadrecord.dead_letter)."""
    from distcrawl.codec.serialize import shrink_payload

    request = Request(
        "http://a.test/", body=b"b" * 500, meta={"big": "x" * 2000, "k": 1}, cookies={"c": "v"}
    )
    for name in ("json", "msgpack"):
        codec = RequestCodec(name)
        payload = codec.encode(request)
        assert shrink_payload(payload, len(payload)) == (payload, [])
        kept, dropped = shrink_payload(payload, 1000) or (b"", [])
        assert dropped == ["meta.big"] and len(kept) <= 1000
        assert codec.decode(kept).meta == {"k": 1} and codec.decode(kept).body == b"b" * 500
        kept, dropped = shrink_payload(payload, 300) or (b"", [])
        assert dropped == ["meta.big", "body"]
        assert codec.decode(kept).cookies == {"c": "v"}
        assert shrink_payload(payload, 10) is None  # the URL alone does not fit
    assert shrink_payload(RequestCodec("pickle").encode(request), 100) is None
