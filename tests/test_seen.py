"""The seen-sets against a real redis-server: the SET of 12-byte fingerprints and the
scalable Bloom filter, through the same Lua code the commit uses."""

from __future__ import annotations

import hashlib
import logging
import time

import pytest
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from distcrawl import dupefilter as dupefilter_module
from distcrawl.config import DistcrawlConfig
from distcrawl.config._convert import ConfigError
from distcrawl.dupefilter import FINGERPRINT_BYTES, RedisDupeFilter
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.records import Entry, EntryKind
from distcrawl.model.seen import BloomFilter, bytes_per_url, layer_size, nth_layer
from tests.support import page_fetches

KEYS = FrontierKeys("t")


def fingerprints(count: int, salt: str, start: int = 0) -> list[bytes]:
    """Distinct 12-byte fingerprints, SHA1-based like Scrapy's."""
    return [
        hashlib.sha1(f"{salt}{i}".encode()).digest()[:FINGERPRINT_BYTES]
        for i in range(start, start + count)
    ]


def in_batches(items: list[bytes], size: int = 20_000):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def add_all(frontier: Frontier, fps: list[bytes]) -> int:
    return sum(sum(frontier.add_seen(batch)) for batch in in_batches(fps))


def count_seen(frontier: Frontier, fps: list[bytes]) -> int:
    return sum(sum(frontier.has_seen(batch)) for batch in in_batches(fps))


def bloom(redis_client, capacity: int, error_rate: float) -> Frontier:
    return Frontier(
        redis_client, KEYS, seen="bloom", bloom_capacity=capacity, bloom_error_rate=error_rate
    )


def bloom_bytes(redis_client) -> int:
    return sum(
        int(redis_client.memory_usage(key, samples=0)) for key in redis_client.keys("t:bloom*")
    )


# ---------------------------------------------------------------------- the SET


def test_set_stores_12_byte_fingerprints_at_under_60_bytes_per_url(redis_client):
    df = RedisDupeFilter(get_crawler().request_fingerprinter)
    fp = df.fingerprint(Request("http://a.test/page/1"))
    assert len(fp) == FINGERPRINT_BYTES == 12
    frontier = Frontier(redis_client, KEYS)
    frontier.commit(
        [],
        [
            Entry(EntryKind.REQUEST, fp, 0, b"x", b"", "t.test"),
            Entry(EntryKind.REQUEST, fp, 0, b"x", b"", "t.test"),
        ],
    )
    assert redis_client.smembers(KEYS.seen) == {fp}

    count = 200_000
    pipe = redis_client.pipeline(transaction=False)
    for batch in in_batches(fingerprints(count, "set")):
        pipe.sadd(KEYS.seen, *batch)
    pipe.execute()
    per_url = redis_client.memory_usage(KEYS.seen, samples=0) / (count + 1)
    print(f"SET seen-set: {per_url:.1f} bytes per URL")
    assert per_url <= 60


def test_set_add_and_has(redis_client):
    frontier = Frontier(redis_client, KEYS)
    a, b = fingerprints(2, "x")
    assert frontier.add_seen([a, a]) == [True, False]
    assert frontier.has_seen([a, b]) == [True, False]
    assert frontier.admin.sizes()["seen"] == 1


# ---------------------------------------------------------------------- sizing


def test_bloom_at_1e6_costs_under_4_bytes_per_url(redis_client):
    assert bytes_per_url(1e-6) == pytest.approx(3.59, abs=0.01)
    frontier = bloom(redis_client, 1_000_000, 1e-6)
    frontier.add_seen(fingerprints(1, "one"))  # creates layer 0, allocated in full
    measured = bloom_bytes(redis_client) / 1_000_000
    print(f"Bloom at 1e-6: {measured:.3f} bytes per URL (MEMORY USAGE)")
    assert measured <= 4
    for capacity in (10_000_000, 100_000_000, 1_000_000_000):
        size = layer_size(capacity, 1e-6)
        assert size.k == 20
        assert size.bytes_per_url <= 4
        assert size.part_bits <= 2**32  # what one Redis string can hold
    assert layer_size(1_000_000_000, 1e-6).parts == 7  # 3.6 GB: 7 strings of 512 MB


def test_layers_grow_and_tighten_so_the_total_error_stays_below_twice_the_rate():
    layers = [nth_layer(i, 1000, 1e-3) for i in range(30)]
    assert [x.capacity for x in layers[:3]] == [1000, 2000, 4000]
    assert sum(x.error_rate for x in layers) < 2e-3


# ---------------------------------------------------------------------- the Bloom filter


def test_bloom_million_urls_false_positive_rate(redis_client):
    """A million fingerprints at capacity: the measured false-positive rate matches the
    configured one, and no inserted fingerprint is ever reported unseen."""
    capacity, rate = 1_000_000, 1e-3
    frontier = bloom(redis_client, capacity, rate)
    inserted = fingerprints(capacity, "in")
    started = time.monotonic()
    new = add_all(frontier, inserted)
    added = time.monotonic()
    # a fingerprint reported seen while being inserted is itself a false positive
    assert new >= capacity * (1 - rate)
    assert count_seen(frontier, inserted) == capacity  # no false negative
    checked = time.monotonic()
    probes = 200_000
    false_positives = count_seen(frontier, fingerprints(probes, "out"))
    measured = false_positives / probes
    per_url = bloom_bytes(redis_client) / capacity
    print(
        f"Bloom 1e6 at {rate:g}: measured false-positive rate {measured:.2e}, "
        f"{per_url:.2f} bytes per URL; insert {added - started:.1f}s, "
        f"check {checked - added:.1f}s, probe {time.monotonic() - checked:.1f}s"
    )
    assert rate / 2 <= measured <= 2 * rate
    assert per_url == pytest.approx(layer_size(capacity, rate).bytes_per_url, rel=0.01)
    assert frontier.admin.sizes()["seen"] == new


def test_capacity_exceeded_warns_and_adds_layers_through_commit(redis_client, caplog):
    capacity, rate, batch = 20_000, 1e-3, 500
    frontier = bloom(redis_client, capacity, rate)
    inserted = fingerprints(70_000, "grow")
    enqueued = 0
    with caplog.at_level(logging.INFO, logger="distcrawl.model.seen"):
        for i in range(0, len(inserted), batch):
            entries = [
                Entry(EntryKind.REQUEST, fp, 0, b"", b"", "t.test")
                for fp in inserted[i : i + batch]
            ]
            enqueued += frontier.commit([], entries).enqueued
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # 20,000 + 40,000 < 70,000: layers 1 and 2
    assert "added layer 1 for 40000 more URLs" in warnings[0]
    assert "added layer 2 for 80000 more URLs" in warnings[1]
    meta = {k.decode(): v.decode() for k, v in redis_client.hgetall(KEYS.bloom).items()}
    assert meta["layers"] == "3"
    # a full layer takes at most one commit beyond its capacity
    assert capacity <= int(meta["0:n"]) <= capacity + batch
    assert 2 * capacity <= int(meta["1:n"]) <= 2 * capacity + batch
    assert int(meta["0:n"]) + int(meta["1:n"]) + int(meta["2:n"]) == enqueued
    assert redis_client.zcard(KEYS.queue) == enqueued

    assert count_seen(frontier, inserted) == len(inserted)  # no false negative
    probes = 100_000
    measured = count_seen(frontier, fingerprints(probes, "never")) / probes
    print(f"3 layers: measured false-positive rate {measured:.2e}")
    assert measured <= 2 * rate  # the bound of the whole filter, not a silent rise
    assert redis_client.exists(KEYS.bloom_part(2, 0))


def test_layer_split_in_parts_works_like_one(redis_client, monkeypatch):
    monkeypatch.setattr(BloomFilter, "max_part_bits", 100_000)
    capacity, rate = 50_000, 1e-3
    frontier = bloom(redis_client, capacity, rate)
    inserted = fingerprints(capacity, "parts")
    add_all(frontier, inserted)
    size = layer_size(capacity, rate, 100_000)
    assert size.parts > 1
    for part in range(size.parts):
        assert redis_client.strlen(KEYS.bloom_part(0, part)) == size.part_bits // 8
    assert count_seen(frontier, inserted) == capacity
    probes = 50_000
    assert count_seen(frontier, fingerprints(probes, "none")) / probes <= 2 * rate


def test_a_worker_with_an_old_view_of_the_layers_catches_up(redis_client):
    first = bloom(redis_client, 1000, 1e-3)
    second = bloom(redis_client, 1000, 1e-3)
    early = fingerprints(10, "early")
    assert (
        second.commit(
            [], [Entry(EntryKind.REQUEST, fp, 0, b"", b"", "t.test") for fp in early]
        ).enqueued
        == 10
    )
    assert second.bloom is not None and second.bloom.script_keys() == [
        KEYS.bloom,
        KEYS.bloom_part(0, 0),
    ]
    add_all(first, fingerprints(1000, "fill"))
    add_all(first, fingerprints(10, "next"))  # layer 1 added by the first worker
    late = fingerprints(10, "late")
    result = second.commit(
        [], [Entry(EntryKind.REQUEST, fp, 0, b"", b"", "t.test") for fp in late + early]
    )
    assert (result.enqueued, result.duplicates) == (10, 10)
    assert second.bloom.script_keys()[-1] == KEYS.bloom_part(1, 0)
    assert redis_client.hget(KEYS.bloom, "1:n") == b"20"  # the new URLs went to layer 1


def test_bloom_commit_deduplicates_and_dont_filter_bypasses(redis_client):
    frontier = bloom(redis_client, 1000, 1e-6)
    a, b = fingerprints(2, "c")
    r1 = frontier.commit(
        [],
        [
            Entry(EntryKind.REQUEST, a, 0, b"x", b"", "t.test"),
            Entry(EntryKind.REQUEST, a, 0, b"x", b"", "t.test"),
            Entry(EntryKind.REQUEST, b"", 0, b"y", b"", "t.test"),
        ],
    )
    assert (r1.enqueued, r1.duplicates) == (2, 1)
    r2 = frontier.commit(
        [],
        [
            Entry(EntryKind.REQUEST, a, 0, b"x", b"", "t.test"),
            Entry(EntryKind.REQUEST, b, 0, b"z", b"", "t.test"),
        ],
    )
    assert (r2.enqueued, r2.duplicates) == (1, 1)
    assert not redis_client.exists(KEYS.seen)
    assert frontier.admin.sizes()["seen"] == 2


def test_clear_removes_every_bloom_key(redis_client, monkeypatch):
    monkeypatch.setattr(BloomFilter, "max_part_bits", 10_000)
    frontier = bloom(redis_client, 1000, 1e-3)
    add_all(frontier, fingerprints(1500, "clear"))
    assert len(redis_client.keys("t:bloom*")) > 2
    frontier.admin.clear()
    assert redis_client.keys("t:*") == []
    assert frontier.add_seen(fingerprints(1, "clear")) == [True]  # created again


# ---------------------------------------------------------------------- settings


def config(**values):
    return DistcrawlConfig.from_settings(Settings(values))


def test_seen_settings():
    c = config()
    assert (c.seen, c.bloom_capacity, c.bloom_error_rate) == ("set", 10_000_000, 1e-6)
    c = config(DISTCRAWL_SEEN="Bloom", DISTCRAWL_BLOOM_CAPACITY="1e8")
    assert (c.seen, c.bloom_capacity) == ("bloom", 100_000_000)
    assert config(DISTCRAWL_BLOOM_ERROR_RATE="0.001").bloom_error_rate == 1e-3


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DISTCRAWL_SEEN", "cuckoo"),
        ("DISTCRAWL_BLOOM_CAPACITY", 0),
        ("DISTCRAWL_BLOOM_CAPACITY", "lots"),
        ("DISTCRAWL_BLOOM_CAPACITY", 1.5),
        ("DISTCRAWL_BLOOM_ERROR_RATE", 0),
        ("DISTCRAWL_BLOOM_ERROR_RATE", 1),
    ],
)
def test_bad_seen_settings_name_the_setting(name, value):
    with pytest.raises(ConfigError, match=name):
        config(**{name: value})


# ---------------------------------------------------------------------- stats


def test_filtered_duplicates_reach_the_stats_batched_and_exact(monkeypatch):
    crawler = get_crawler()
    calls = []
    stats_class = type(crawler.stats)
    inc_value = stats_class.inc_value

    def counting(self, *args, **kwargs):
        calls.append(args)
        inc_value(self, *args, **kwargs)

    monkeypatch.setattr(stats_class, "inc_value", counting)
    now = [1000.0]
    monkeypatch.setattr(dupefilter_module.time, "monotonic", lambda: now[0])
    df = RedisDupeFilter(crawler.request_fingerprinter, crawler=crawler)
    request = Request("http://a.test/")
    for _ in range(500):
        df.log(request, None)  # type: ignore[arg-type]
    assert calls == []  # less than a second: nothing yet
    now[0] += 1.0
    df.log(request, None)  # type: ignore[arg-type]
    assert crawler.stats.get_value("dupefilter/filtered") == 501
    for _ in range(99):
        df.log(request, None)  # type: ignore[arg-type]
    now[0] += 1.0
    df.flush_stats_if_due()  # the scheduler's loop: no duplicate needed to flush
    assert crawler.stats.get_value("dupefilter/filtered") == 600
    df.log(request, None)  # type: ignore[arg-type]
    df.close("finished")
    assert crawler.stats.get_value("dupefilter/filtered") == 601
    assert len(calls) == 3


# ---------------------------------------------------------------------- fingerprints


def _fingerprints(df: RedisDupeFilter, fingerprinter, requests) -> None:
    for request in requests:
        expected = fingerprinter.fingerprint(request.copy())[:FINGERPRINT_BYTES]
        assert df.fingerprint(request) == expected, request
        assert df.fingerprint(request.replace()) == expected, request  # a new Request object


def test_url_memo_gives_the_fingerprinter_s_fingerprints(monkeypatch):
    monkeypatch.setattr(dupefilter_module, "URL_MEMO_SIZE", 3)
    fingerprinter = get_crawler().request_fingerprinter
    df = RedisDupeFilter(fingerprinter)
    requests = [
        Request("http://a.test/x?b=2&a=1"),
        Request("http://a.test/x?a=1&b=2"),  # the same canonical URL: the same fingerprint
        Request("http://a.test/x#frag", meta={"verbatim_url": True}),
        Request("http://a.test/x#frag"),
        Request("http://a.test/x", method="POST", body=b"q=1"),
        Request("http://a.test/x", method="POST"),
        Request("http://a.test/x", method="HEAD"),
        Request("http://a.test/x", body=b"q=1"),
        Request("http://a.test/x"),
        Request("http://a.test/y", headers={"Accept": "x"}),
        Request("http://a.test/y", cookies={"c": "1"}),
    ]
    _fingerprints(df, fingerprinter, requests)
    _fingerprints(df, fingerprinter, reversed(requests))
    assert len(df._url_memo or {}) <= 3
    df.close("finished")
    assert df._url_memo == {}


def test_url_memo_is_off_for_a_fingerprinter_of_the_project():
    calls = []

    class Fingerprinter:
        def fingerprint(self, request: Request) -> bytes:
            calls.append(request)
            return hashlib.sha1(request.url.encode() + request.headers.get("X", b"")).digest()

    df = RedisDupeFilter(Fingerprinter())
    assert df._url_memo is None
    first = df.fingerprint(Request("http://a.test/", headers={"X": "1"}))
    assert df.fingerprint(Request("http://a.test/", headers={"X": "2"})) != first
    assert len(calls) == 2


def test_url_memo_is_off_when_scrapy_s_fingerprinter_is_subclassed():
    from scrapy.utils.request import RequestFingerprinter

    class WithHeaders(RequestFingerprinter):
        def fingerprint(self, request: Request) -> bytes:
            extra = request.headers.get("X", b"")
            return hashlib.sha1(super().fingerprint(request) + extra).digest()

    df = RedisDupeFilter(WithHeaders())
    assert df._url_memo is None
    first = df.fingerprint(Request("http://a.test/", headers={"X": "1"}))
    assert df.fingerprint(Request("http://a.test/", headers={"X": "2"})) != first


# ---------------------------------------------------------------------- a real crawl


def test_crawl_with_the_bloom_filter_fetches_every_page_once(demo_site, workers, redis_client):
    site = demo_site(pages=800)
    redis_client.lpush("site:start_urls", site.url + "/")
    settings = {
        "DISTCRAWL_SEEN": "bloom",
        "DISTCRAWL_BLOOM_CAPACITY": 100_000,
        "DISTCRAWL_IDLE_TIMEOUT": 3,
    }
    pool = [workers(i, **settings) for i in (1, 2)]
    for w in pool:
        assert w.wait(180) == 0, w.log()[-3000:]
    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages()  # none missing
    assert max(fetched.values()) == 1  # none fetched twice
    # every page, and the few other in-scope links the site has, went through the filter
    assert int(redis_client.hget("site:bloom", "0:n")) >= 801
    assert not redis_client.exists("site:seen")
    for w in pool:
        assert "seen-set bloom" in w.log()
        assert "ERROR" not in w.log()
