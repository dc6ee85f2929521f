"""``distcrawl import scrapy-redis``: a real scrapy-redis 0.9.1 crawl (the ``baseline`` extra)
carried over to distcrawl workers, on a real redis-server and the local demo site, whose own
request log counts the fetches."""

from __future__ import annotations

import hashlib
import json
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.utils.request import fingerprint
from scrapy_redis import queue as sr_queue
from scrapy_redis.dupefilter import RFPDupeFilter

from benchmarks.spiders import SPIDER_NAME
from distcrawl.admin import importer
from distcrawl.cli import main
from distcrawl.codec.serialize import RequestCodec
from distcrawl.dupefilter import legacy_fingerprint, scrapy_redis_fingerprint
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.lua import Scripts
from distcrawl.model.queue_entry import parse_entry
from distcrawl.producer import Producer, RedriveResult
from distcrawl.testing.workers import worker_agent
from tests.support import page_fetches

pytestmark = pytest.mark.timeout(180)

SOURCE = f"{SPIDER_NAME}:requests"
DUPEFILTER = f"{SPIDER_NAME}:dupefilter"
#: the distcrawl project's spider of the same name (tests/import_spider.py)
PROJECT = ("-s", "SPIDER_MODULES=tests.import_spider")
#: what a scrapy-redis project's settings say (benchmarks/crawl.py's baseline), stopped
#: after a few pages as if its owner switched half-way
SCRAPY_REDIS = {
    "ADDONS": "{}",
    "SPIDER_MODULES": "benchmarks.spiders",
    "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
    "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
    "SCHEDULER_PERSIST": True,
    "ITEM_PIPELINES": json.dumps({"scrapy_redis.pipelines.RedisPipeline": 300}),
    "CONCURRENT_REQUESTS": 2,
    "CLOSESPIDER_PAGECOUNT": 15,
    "DISTCRAWL_DOMAIN_CONCURRENCY": None,
}


@pytest.fixture(autouse=True)
def project(monkeypatch: pytest.MonkeyPatch) -> None:
    """The import loads the project's settings as ``scrapy crawl`` would."""
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "distcrawl.settings")


def cli(capsys: pytest.CaptureFixture[str], redis_url: str, *argv: str) -> tuple[int, str, str]:
    code = main(["--redis-url", redis_url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_import(capsys: Any, redis_url: str, *options: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = cli(
        capsys, redis_url, "import", "scrapy-redis", SPIDER_NAME, *PROJECT, "--json", *options
    )
    return code, (json.loads(out) if out else {}), err


class QueueSpider(Spider):
    """The scrapy-redis spider whose requests are queued: its methods name the callbacks."""

    name = SPIDER_NAME

    def parse(self, response: Any, **kwargs: Any) -> Any:
        return None

    def parse_item(self, response: Any) -> Any:
        return None


def seed(client: redis.Redis, requests: list[Request], kind: str = "PriorityQueue") -> None:
    """Queue ``requests`` with scrapy-redis' own queue class and (pickle) serializer."""
    q = getattr(sr_queue, kind)(client, QueueSpider(), SOURCE)
    for request in requests:
        q.push(request)


class Marker:
    """A pickle that creates a file when unpickled: what anyone who can write to Redis
    could queue for a crawler that unpickles its queue."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def test_scrapy_redis_fingerprints_are_its_own_not_scrapys() -> None:
    """The finding the seen-set conversion rests on (scrapy-redis 0.9.1, Scrapy 2.13+)."""
    ours = RFPDupeFilter(server=None, key="k")
    for request in (
        Request("http://a.test/p?b=2&a=1"),
        Request("http://a.test/form", method="POST", body=b"q=1"),
    ):
        theirs = ours.request_fingerprint(request)
        assert importer.scrapy_redis_fingerprint(request.method, request.url, request.body) == (
            theirs
        )
        assert theirs != fingerprint(request).hex()  # Scrapy's hashes "headers" too


#: scrapy-redis 0.9.1's RFPDupeFilter.request_fingerprint of a few requests: the SHA1 of
#: the JSON written out here by hand (sorted keys; the canonical URL: query sorted, no
#: fragment; the body in hex; no headers), which the package itself gives too
SCRAPY_REDIS_FINGERPRINTS = [
    (
        Request("http://a.test/p?b=2&a=1"),
        '{"body": "", "method": "GET", "url": "http://a.test/p?a=1&b=2"}',
        "62bdc495fa932fad277faccf3e113df8016771f0",
    ),
    (
        Request("http://a.test/p?a=1&b=2", headers={"X-A": "1"}),
        '{"body": "", "method": "GET", "url": "http://a.test/p?a=1&b=2"}',
        "62bdc495fa932fad277faccf3e113df8016771f0",
    ),
    (
        Request("http://a.test/form", method="POST", body=b"q=1"),
        '{"body": "713d31", "method": "POST", "url": "http://a.test/form"}',
        "761fefe0ddfd7549b05071a795c2eb65e014a8a6",
    ),
    (
        Request("https://b.test/caf%C3%A9#frag"),
        '{"body": "", "method": "GET", "url": "https://b.test/caf%C3%A9"}',
        "08031d32487617c45a0c13b957a04aa7947487a0",
    ),
]


@pytest.mark.parametrize(("request_", "text", "expected"), SCRAPY_REDIS_FINGERPRINTS)
def test_the_scrapy_redis_fingerprint_is_reproduced_byte_for_byte(
    request_: Request, text: str, expected: str
) -> None:
    assert hashlib.sha1(text.encode()).hexdigest() == expected
    assert RFPDupeFilter(server=None, key="k").request_fingerprint(request_) == expected
    got = scrapy_redis_fingerprint(request_.method, request_.url, request_.body)
    assert got == expected
    assert legacy_fingerprint(request_) == bytes.fromhex(expected)[:12]


def stop_half_done(site: Any, workers: Any, redis_client: redis.Redis, **settings: Any) -> int:
    """A scrapy-redis crawl of ``site`` stopped after a few pages (CLOSESPIDER_PAGECOUNT, a
    graceful stop); the requests it left queued."""
    redis_client.lpush(f"{SPIDER_NAME}:start_urls", site.url + "/")
    before = workers(1, spider=SPIDER_NAME, **{**SCRAPY_REDIS, **settings})
    assert before.wait(90) == 0, before.log()[-3000:]
    assert "closespider_pagecount" in before.log()
    queued = int(redis_client.zcard(SOURCE))
    assert queued > 0
    assert 0 < len(page_fetches(site)) < len(site.expected_pages())
    return queued


def finish_on_distcrawl(site: Any, workers: Any) -> tuple[Counter[str], int, Counter[str]]:
    """Two distcrawl workers finish the crawl: each page's fetches, how many pages were
    fetched twice, and the pages each crawler fetched (by user agent)."""
    after = workers(
        2, spider=SPIDER_NAME, SPIDER_MODULES="tests.import_spider", DISTCRAWL_IDLE_TIMEOUT=2
    )
    assert after.wait(120) == 0, after.log()[-3000:]
    fetches = page_fetches(site)
    by = Counter(line.user_agent for line in site.read_log() if line.path in site.expected_pages())
    return fetches, sum(n - 1 for n in fetches.values()), by


def test_a_moved_crawl_fetches_nothing_scrapy_redis_crawled(
    demo_site, workers, redis_client, redis_url, capsys
):
    """The crawl stored no items anywhere (no --rebuild-seen possible): the dupefilter's
    scrapy-redis fingerprints, kept as the legacy seen-set, stop every page crawled before."""
    site = demo_site(pages=60)
    queued = stop_half_done(site, workers, redis_client, ITEM_PIPELINES="{}")
    fingerprints = redis_client.scard(DUPEFILTER)

    code, report, err = run_import(capsys, redis_url, "--trust-pickle", "--move")
    assert code == 0, err
    assert report["queued"] + report["seen"] == queued and report["dead"] == 0
    assert report["fingerprints"] == "scrapy-redis"
    assert report["legacy"] == fingerprints and report["moved"]
    keys = FrontierKeys(SPIDER_NAME)
    assert redis_client.hget(keys.meta, "legacy_seen") == b"scrapy-redis"
    assert not redis_client.exists(DUPEFILTER)

    fetches, duplicates, by = finish_on_distcrawl(site, workers)
    print(
        f"scrapy-redis fetched {by[worker_agent(1)]} pages, distcrawl {by[worker_agent(2)]}; "
        f"{duplicates} fetched twice; report {report}"
    )
    assert set(fetches) == site.expected_pages()  # none missing
    # at most what scrapy-redis had in flight at its stop (CONCURRENT_REQUESTS)
    assert duplicates <= int(SCRAPY_REDIS["CONCURRENT_REQUESTS"])
    assert by[worker_agent(2)] >= queued


def test_a_half_done_scrapy_redis_crawl_finishes_on_distcrawl(
    demo_site, workers, redis_client, redis_url, capsys
):
    site = demo_site(pages=60)
    queued = stop_half_done(site, workers, redis_client)

    # <spider>:requests is also distcrawl's own key: --move renames it out of the way
    code, report, err = run_import(capsys, redis_url, "--trust-pickle", "--move", "--rebuild-seen")
    assert code == 0, err
    assert report["members"] == queued
    assert report["queued"] + report["seen"] == queued and report["dead"] == 0
    assert report["fingerprints"] == "scrapy-redis"
    assert report["seen_added"] > 0 and report["moved"]
    assert not redis_client.exists(DUPEFILTER, FrontierKeys(SPIDER_NAME).import_queue)

    fetches, duplicates, by = finish_on_distcrawl(site, workers)
    print(
        f"scrapy-redis fetched {by[worker_agent(1)]} pages, distcrawl {by[worker_agent(2)]}; "
        f"{duplicates} fetched twice; report {report}"
    )
    assert set(fetches) == site.expected_pages()  # none missing
    assert duplicates == 0  # none fetched twice, across both crawlers
    assert by[worker_agent(2)] >= queued  # the queue was carried over, not re-found
    assert redis_client.llen(f"{SPIDER_NAME}:dead") == 0


def test_a_pickled_queue_is_refused_without_unpickling_anything(
    redis_client, redis_url, capsys, tmp_path
):
    marker = tmp_path / "unpickled"
    seed(redis_client, [Request("http://a.test/1")])
    redis_client.zadd(SOURCE, {pickle.dumps(Marker(marker)): 0})
    before = set(redis_client.keys("*"))

    code, _, err = run_import(capsys, redis_url, "--namespace", "mig")
    assert code == 1
    assert "unpickling runs whatever code" in err and "--trust-pickle" in err
    code, report, err = run_import(capsys, redis_url, "--namespace", "mig", "--dry-run")
    assert code == 0, err
    assert report["members"] == 2 and report["queued"] == 0
    assert not marker.exists()  # nothing was unpickled
    assert set(redis_client.keys("*")) == before  # nothing written


def test_the_queue_key_that_is_distcrawls_own_is_not_imported_over(redis_client, redis_url, capsys):
    seed(redis_client, [Request("http://a.test/1")])
    code, _, err = run_import(capsys, redis_url, "--trust-pickle")
    assert code == 1
    assert "--move" in err and "--namespace" in err
    assert redis_client.keys("*") == [SOURCE.encode()]


def requests_of_every_kind() -> list[Request]:
    spider = QueueSpider()
    return [
        Request("http://a.test/1"),
        Request(
            "http://a.test/2",
            priority=5,
            meta={"depth": 2},
            cb_kwargs={"page": 2},
            callback=spider.parse,
        ),
        Request("http://b.test/3", dont_filter=True),
        Request("http://b.test/4", method="POST", body=b"q=4", headers={"X-A": "1"}),
        # callbacks the distcrawl spider does not have (or allow): dead letters
        Request("http://a.test/5", callback=spider.parse_item),
    ]


def test_import_dry_run_dead_letters_and_idempotence(redis_client, redis_url, capsys):
    seed(redis_client, requests_of_every_kind())
    redis_client.zadd(SOURCE, {b"\x80\x05not a pickle": 0})
    source = redis_client.zrange(SOURCE, 0, -1, withscores=True)

    code, report, err = run_import(
        capsys, redis_url, "--namespace", "mig", "--trust-pickle", "--dry-run"
    )
    assert code == 0, err
    assert (report["members"], report["queued"], report["dead"]) == (6, 5, 1)
    assert redis_client.keys("mig:*") == []

    code, report, err = run_import(capsys, redis_url, "--namespace", "mig", "--trust-pickle")
    assert code == 1  # some requests could not be imported
    assert (report["queued"], report["seen"], report["dead"]) == (4, 0, 2)
    assert report["dupefilter"] == 0 and report["fingerprints"] == "unknown"
    keys = FrontierKeys("mig")
    reasons = sorted(json.loads(r)["reason"] for r in redis_client.lrange(keys.dead, 0, -1))
    assert "callback refused" in reasons[0] and "parse_item" in reasons[0]
    assert "undecodable" in reasons[1]
    assert all(json.loads(r)["source"] == "import" for r in redis_client.lrange(keys.dead, 0, -1))
    producer = Producer(redis_client, SPIDER_NAME, _settings(), namespace="mig")
    # not redriven as a plain GET of its URL, which would not be the request refused
    assert producer.redrive() == RedriveResult(redriven=0, not_redrivable=2)
    queued = {
        e.payload: e.priority for e in map(parse_entry, redis_client.zrange(keys.queue, 0, -1))
    }
    codec = RequestCodec("msgpack", producer._spider_objects().spider, ("parse",))
    requests = {codec.decode(p).url: (codec.decode(p), prio) for p, prio in queued.items()}
    assert set(requests) == {
        "http://a.test/1",
        "http://a.test/2",
        "http://b.test/3",
        "http://b.test/4",
    }
    second, prio = requests["http://a.test/2"]
    assert prio == 5 and second.meta["depth"] == 2 and second.cb_kwargs == {"page": 2}
    assert second.callback.__name__ == "parse"
    post, _ = requests["http://b.test/4"]
    assert (post.method, post.body, post.headers["X-A"]) == ("POST", b"q=4", b"1")
    assert requests["http://b.test/3"][0].dont_filter
    assert redis_client.zrange(SOURCE, 0, -1, withscores=True) == source  # untouched

    # again: nothing twice, not the dont_filter request; the refused ones are tried again,
    # refused again, and get no second dead letter
    code, report, err = run_import(capsys, redis_url, "--namespace", "mig", "--trust-pickle")
    assert code == 1
    assert (report["queued"], report["dead"], report["already_imported"]) == (0, 2, 4)
    assert redis_client.zcard(keys.queue) == 4 and redis_client.llen(keys.dead) == 2

    # the project now allows the callback: the request dead-lettered before is imported
    allowed = ("-s", "DISTCRAWL_ALLOWED_CALLBACKS=parse,parse_item")
    code, report, err = run_import(
        capsys, redis_url, "--namespace", "mig", "--trust-pickle", *allowed
    )
    assert (report["queued"], report["dead"], report["already_imported"]) == (1, 1, 4)
    assert redis_client.zcard(keys.queue) == 5 and redis_client.llen(keys.dead) == 2


def _settings() -> Any:
    from scrapy.utils.project import get_project_settings

    settings = get_project_settings()
    settings.set("SPIDER_MODULES", ["tests.import_spider"])
    return settings


def test_an_interrupted_import_resumes_without_queueing_twice(
    redis_client, redis_url, capsys, monkeypatch
):
    """dont_filter requests have no fingerprint for the seen-set to stop: the import's own
    record of what it handled keeps them from being queued twice."""
    seed(
        redis_client,
        [Request(f"http://a.test/{i}", dont_filter=True) for i in range(5)],
        kind="FifoQueue",
    )
    monkeypatch.setattr(importer, "PAGE", 2)
    real = Producer.push_requests
    calls = []

    def failing(self: Producer, requests: Any, once: Any = None) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise redis.ConnectionError("connection lost")
        return real(self, requests, once)

    monkeypatch.setattr(Producer, "push_requests", failing)
    code, _, err = run_import(capsys, redis_url, "--namespace", "mig", "--trust-pickle")
    assert code == 3, err
    keys = FrontierKeys("mig")
    assert redis_client.zcard(keys.queue) == 2
    monkeypatch.setattr(Producer, "push_requests", real)
    code, report, err = run_import(capsys, redis_url, "--namespace", "mig", "--trust-pickle")
    assert code == 0, err
    assert (report["queued"], report["already_imported"]) == (3, 2)
    assert redis_client.zcard(keys.queue) == 5


def test_doctor_warns_about_scrapy_redis_settings_left_in_the_project(
    redis_url, capsys, monkeypatch, tmp_path
):
    (tmp_path / "leftover_settings.py").write_text(
        "SCHEDULER = 'scrapy_redis.scheduler.Scheduler'\n"
        "SCHEDULER_PERSIST = True\n"
        "MAX_IDLE_TIME_BEFORE_CLOSE = 10\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "leftover_settings")
    code, _, err = cli(capsys, redis_url, "doctor", "site")
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning: scrapy-redis")]
    assert len(warnings) == 3, err
    assert any("SCHEDULER " in w and "add-on" in w for w in warnings)
    idle = [w for w in warnings if "MAX_IDLE_TIME_BEFORE_CLOSE" in w]
    assert idle and "DISTCRAWL_IDLE_TIMEOUT" in idle[0]

    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "distcrawl.settings")
    code, _, err = cli(capsys, redis_url, "doctor", "site")
    assert code == 0 and "scrapy-redis" not in err


def test_a_dupefilter_of_the_crawls_own_fingerprints_is_copied(redis_client, redis_url, capsys):
    """A scrapy-redis patched to use Scrapy's fingerprinter: the dupefilter converts."""
    queued = [Request(f"http://a.test/q{i}") for i in range(3)]
    crawled = [Request(f"http://a.test/c{i}") for i in range(4)]
    seed(redis_client, queued)
    redis_client.sadd(DUPEFILTER, *(fingerprint(r).hex() for r in queued + crawled))

    code, report, err = run_import(capsys, redis_url, "--namespace", "mig", "--trust-pickle")
    assert code == 0, err
    assert report["fingerprints"] == "crawl"
    assert report["queued"] == 3 and report["converted"] == 4  # the queued ones were in already
    assert report["unaccounted"] == 0
    producer = Producer(redis_client, SPIDER_NAME, _settings(), namespace="mig")
    assert producer.frontier.has_seen([producer.fingerprint(r) for r in crawled]) == [True] * 4
    assert not producer.frontier.has_seen([producer.fingerprint(Request("http://a.test/new"))])[0]


def test_the_seen_set_is_rebuilt_from_pages_stored_in_mongodb(
    redis_client, redis_url, capsys, mongo_uri, mongo_client
):
    seed(redis_client, [Request("http://a.test/queued")])
    stored = [f"http://a.test/page{i}" for i in range(3)]
    redis_client.sadd(
        DUPEFILTER,
        *(
            importer.scrapy_redis_fingerprint("GET", u, b"")
            for u in [*stored, "http://a.test/queued"]
        ),
        importer.scrapy_redis_fingerprint("GET", "http://a.test/lost-in-flight", b""),
    )
    mongo_client["old"]["pages"].insert_many([{"url": u, "title": "t"} for u in stored])

    code, report, err = run_import(
        capsys,
        redis_url,
        "--namespace",
        "mig",
        "--trust-pickle",
        "--mongo-uri",
        mongo_uri,
        "--mongo-collection",
        "old.pages",
    )
    assert code == 0, err
    assert report["fingerprints"] == "scrapy-redis"
    assert (report["seen_urls"], report["seen_added"], report["stored_in_dupefilter"]) == (3, 3, 3)
    assert report["queued_in_dupefilter"] == 1 and report["unaccounted"] == 1
    assert report["legacy"] == 5  # every fingerprint, the one lost in flight too
    producer = Producer(redis_client, SPIDER_NAME, _settings(), namespace="mig")
    assert (
        producer.frontier.has_seen([producer.fingerprint(Request(u)) for u in stored]) == [True] * 3
    )


def test_a_lost_reply_to_the_store_step_queues_nothing_twice(
    redis_proxy, redis_client, redis_url, capsys, monkeypatch
):
    """The commit that stores a page of the queue ran, but its reply was lost (the RESP
    proxy drops it), so the import never recorded that page as done: the run again must
    not queue its ``dont_filter`` requests (scrapy-redis' plain URLs) a second time."""
    seed(
        redis_client,
        [Request(f"http://a.test/{i}", dont_filter=True) for i in range(5)],
        kind="FifoQueue",
    )
    monkeypatch.setattr(importer, "PAGE", 2)
    Scripts.register(redis_client).load(redis_client)  # the first EVALSHA is the commit
    keys = FrontierKeys("mig")
    redis_proxy.drop_reply_once(lambda args: args[0].upper() == b"EVALSHA")
    code, _, err = run_import(capsys, redis_proxy.url, "--namespace", "mig", "--trust-pickle")
    assert code == 3, err  # the lost reply: Redis unreachable, as far as the import knows
    assert redis_client.zcard(keys.queue) == 2  # yet the first page was stored

    code, report, err = run_import(capsys, redis_url, "--namespace", "mig", "--trust-pickle")
    assert code == 0, err
    assert report["queued"] + report["seen"] == 5 - report["already_imported"]
    urls = Counter(
        RequestCodec("msgpack", QueueSpider(), ("parse",)).decode(parse_entry(m).payload).url
        for m in redis_client.zrange(keys.queue, 0, -1)
    )
    assert urls == Counter(f"http://a.test/{i}" for i in range(5))  # each queued once
