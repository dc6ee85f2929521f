"""``distcrawl recrawl status`` and ``recrawl now`` against a real redis-server: revisits
stored through the Frontier API (commit.lua's kind 'v'), as workers store them."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from distcrawl.cli import main
from distcrawl.dupefilter import RedisDupeFilter
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import make_entry
from distcrawl.model.records import Entry, EntryKind
from distcrawl.model.revisits_admin import under_domain
from distcrawl.model.shards import shard_of_url
from tests.support import server_ms

pytestmark = pytest.mark.timeout(60)

SITE = FrontierKeys("site")
MINUTE = 60_000
#: the worker's own dupefilter, with Scrapy's fingerprinter (the project's default)
DUPEFILTER = RedisDupeFilter(RequestFingerprinter())


def fp(url: str) -> bytes:
    return DUPEFILTER.fingerprint(Request(url))


def revisit(url: str, delay_ms: int) -> Entry:
    """The page's revisit as a worker stores it: payload = the URL, for the lease to show."""
    slot = urlsplit(url).hostname or ""
    return Entry(EntryKind.REVISIT, fp(url), 0, url.encode(), str(delay_ms).encode(), slot)


def run(capsys, redis_url: str, *argv: str) -> tuple[int, str, str]:
    code = main(["--redis-url", redis_url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, redis_url: str, *argv: str) -> tuple[int, object]:
    code, out, _ = run(capsys, redis_url, "--json", *argv)
    return code, json.loads(out)


def leased_urls(frontier: Frontier) -> list[str]:
    return sorted(x.payload.decode() for x in frontier.lease(100, 60_000).items)


def test_status_counts_and_domains(redis_client, redis_url, capsys):
    frontier = Frontier(redis_client, SITE)
    frontier.commit(
        [],
        [
            *(revisit(f"http://a.test/now{i}", 0) for i in range(3)),
            revisit("http://a.test/soon", 30 * MINUTE),
            revisit("http://www.a.test/later", 120 * MINUTE),
            revisit("http://b.test/late", 0),
            *(revisit(f"http://b.test/soon{i}", 10 * MINUTE) for i in range(2)),
        ],
    )
    # b.test/late is a minute late; two due revisits of c.test wait in the revisit queue
    late = redis_client.hget(SITE.revisit_of, fp("http://b.test/late"))
    redis_client.zadd(SITE.revisits, {late: server_ms(redis_client) - MINUTE})
    redis_client.zadd(
        SITE.revisit_queue, {make_entry("c.test", 0, 900 + i, b"q"): 0 for i in range(2)}
    )
    # a revisit whose record is gone, one whose record is not a queue entry
    second_ago = server_ms(redis_client) - 1000
    redis_client.zadd(SITE.revisits, {b"00000000ff01": second_ago, b"00000000ff02": second_ago})
    redis_client.hset(SITE.requests, b"00000000ff02", b"12345678garbage")

    code, status = run_json(capsys, redis_url, "recrawl", "status", "site")
    assert code == 0
    assert isinstance(status, dict)
    assert (status["waiting"], status["queued"], status["scheduled"]) == (10, 2, 12)
    # due: 3 of a.test, b.test's late one, the 2 bad ones, the 2 queued
    assert status["due"] == 8
    assert status["next_hour"] == 3  # a.test/soon and b.test's two
    assert 59 <= status["overdue_seconds"] < 90
    assert (status["missing_records"], status["unparsable"]) == (1, 1)
    assert status["domain_count"] == 4
    rows = {r["domain"]: (r["scheduled"], r["due"], r["next_hour"]) for r in status["domains"]}
    assert rows == {
        "a.test": (4, 3, 1),
        "c.test": (2, 2, 0),
        "b.test": (3, 1, 2),
        "www.a.test": (1, 0, 0),
    }
    assert [r["domain"] for r in status["domains"]] == ["a.test", "c.test", "b.test", "www.a.test"]

    code, status = run_json(capsys, redis_url, "recrawl", "status", "site", "--limit", "1")
    assert [r["domain"] for r in status["domains"]] == ["a.test"]  # type: ignore[index]

    code, out, err = run(capsys, redis_url, "recrawl", "status", "site", "--limit", "2")
    assert code == 0
    assert "scheduled           12" in out and "due now              8" in out
    assert "records missing 1, unparsable 1" in out
    assert "a.test" in out and "www.a.test" not in out
    assert "(2 more domains; see --limit)" in err


def test_status_of_a_crawl_without_revisits(redis_url, capsys):
    code, status = run_json(capsys, redis_url, "recrawl", "status", "site")
    assert code == 0 and isinstance(status, dict)
    assert (status["scheduled"], status["due"], status["overdue_seconds"]) == (0, 0, None)
    assert status["domains"] == []


def test_status_reads_in_pages(redis_client, redis_url, capsys, monkeypatch):
    """More revisits than a page: every one is counted once."""
    from distcrawl.model import revisits_admin

    monkeypatch.setattr(revisits_admin, "PAGE", 7)
    frontier = Frontier(redis_client, SITE)
    frontier.commit([], [revisit(f"http://h{i % 5}.test/{i}", 0) for i in range(300)])
    status = revisits_admin.revisit_status(redis_client, SITE, page=7)
    assert status.totals.waiting == status.totals.due == 300
    assert sum(d.scheduled for d in status.domains.values()) == 300
    assert {d.domain: d.due for d in status.domains.values()} == {
        f"h{i}.test": 60 for i in range(5)
    }


def test_now_makes_exactly_that_page_due(redis_client, redis_url, capsys):
    frontier = Frontier(redis_client, SITE)
    urls = [f"http://a.test/p{i}" for i in range(3)]
    frontier.commit([], [revisit(url, 60 * MINUTE) for url in urls])
    assert leased_urls(frontier) == []  # none due for an hour
    redis_client.delete(SITE.wake)

    code, out, _ = run(capsys, redis_url, "recrawl", "now", "site", urls[1])
    assert code == 0
    assert f"{urls[1]}: made due now (was due in" in out
    # a parked worker waits for the revisit its last lease saw due next: woken now
    assert redis_client.lrange(SITE.wake, 0, -1) == [b"1"]
    assert leased_urls(frontier) == [urls[1]]
    assert redis_client.zcard(SITE.revisits) == 2

    # once leased, the page has no revisit waiting: nothing to do, and said so
    code, result = run_json(capsys, redis_url, "recrawl", "now", "site", urls[1])
    assert code == 1
    assert result == [{"url": urls[1], "result": "not_waiting", "shard": 0}]


def test_now_for_a_url_with_nothing_scheduled(redis_client, redis_url, capsys):
    Frontier(redis_client, SITE).commit([], [revisit("http://a.test/p", 60 * MINUTE)])
    code, out, _ = run(capsys, redis_url, "recrawl", "now", "site", "http://a.test/other")
    assert code == 1
    assert out.strip() == "http://a.test/other: no revisit scheduled"
    code, result = run_json(capsys, redis_url, "recrawl", "now", "site", "https://a.test/p")
    assert code == 1 and result[0]["result"] == "not_scheduled"  # type: ignore[index]
    assert redis_client.zcard(SITE.revisits) == 1
    # a due one is left as it is
    Frontier(redis_client, SITE).commit([], [revisit("http://a.test/due", 0)])
    code, result = run_json(capsys, redis_url, "recrawl", "now", "site", "http://a.test/due")
    assert code == 0 and result[0]["result"] == "already_due"  # type: ignore[index]


def test_now_for_a_domain_takes_its_subdomains_and_no_other(redis_client, redis_url, capsys):
    frontier = Frontier(redis_client, SITE)
    inside = ["http://a.test/1", "http://www.a.test/2", "http://x.y.a.test/3"]
    outside = ["http://aa.test/4", "http://b.test/5", "http://a.test.b.test/6"]
    frontier.commit([], [revisit(url, 60 * MINUTE) for url in inside + outside])
    frontier.commit([], [revisit("http://a.test/due", 0)])
    redis_client.delete(SITE.wake)

    code, out, _ = run(capsys, redis_url, "recrawl", "now", "site", "A.test.")
    assert code == 0
    assert out.strip() == "a.test: 3 revisits made due now, 1 due already"
    assert redis_client.llen(SITE.wake) == 3
    assert leased_urls(frontier) == sorted([*inside, "http://a.test/due"])
    assert redis_client.zcard(SITE.revisits) == len(outside)

    code, result = run_json(capsys, redis_url, "recrawl", "now", "site", "nothing.test")
    assert code == 1
    assert result == [{"domain": "nothing.test", "made_due": 0, "already_due": 0}]


def test_under_domain():
    assert under_domain("a.test", "a.test") and under_domain("x.A.test.", "a.test")
    assert not under_domain("aa.test", "a.test") and not under_domain("a.test.b", "a.test")


@pytest.mark.parametrize("bad", ["", "a.test/path", ".a.test", "http://[::1"])
def test_now_refuses_what_is_neither_url_nor_domain(redis_url, capsys, bad):
    code, _, err = run(capsys, redis_url, "recrawl", "now", "site", bad)
    assert code == 2 and "error" in err


def test_now_refuses_another_fingerprinter_than_the_crawls(redis_client, redis_url, capsys):
    redis_client.hset(SITE.meta, "fingerprinter", "project.CustomFingerprinter")
    code, _, err = run(capsys, redis_url, "recrawl", "now", "site", "http://a.test/p")
    assert code == 2 and "project.CustomFingerprinter" in err


def test_a_sharded_crawl(redis_client, redis_url, capsys):
    shards = 4
    crawl = SITE.sharded(shards)
    parts = [crawl.of_shard(i) for i in range(shards)]
    redis_client.hset(SITE.meta, "shards", shards)
    urls = [f"http://site{i}.test/p" for i in range(12)]
    due_url = "http://sub.site0.test/q"
    due_shard = shard_of_url(due_url, shards)
    for url in urls:
        part = parts[shard_of_url(url, shards)]
        Frontier(redis_client, part).commit([], [revisit(url, 90 * MINUTE)])
    Frontier(redis_client, parts[due_shard]).commit([], [revisit(due_url, 0)])

    code, status = run_json(capsys, redis_url, "recrawl", "status", "site")
    assert code == 0 and isinstance(status, dict)
    assert (status["shards"], status["scheduled"], status["due"]) == (4, 13, 1)
    assert status["next_hour"] == 0
    assert status["domains"][0] == {
        "domain": "sub.site0.test",
        "scheduled": 1,
        "due": 1,
        "next_hour": 0,
    }

    # pages in other shards than the due one, which a lease there would bring along
    others = [u for u in urls if shard_of_url(u, shards) != due_shard]
    assert len({shard_of_url(u, shards) for u in others}) > 1
    target = others[0]
    shard = shard_of_url(target, shards)
    code, result = run_json(capsys, redis_url, "recrawl", "now", "site", target)
    assert code == 0
    assert result[0]["result"] == "made_due" and result[0]["shard"] == shard  # type: ignore[index]
    assert leased_urls(Frontier(redis_client, parts[shard])) == [target]

    domain_url = next(u for u in others if shard_of_url(u, shards) != shard)
    domain = urlsplit(domain_url).hostname or ""
    code, out, _ = run(capsys, redis_url, "recrawl", "now", "site", domain)
    assert code == 0 and f"{domain}: 1 revisits made due now" in out
    in_its_shard = Frontier(redis_client, parts[shard_of_url(domain_url, shards)])
    assert leased_urls(in_its_shard) == [domain_url]
    code, status = run_json(capsys, redis_url, "recrawl", "status", "site")
    assert (status["scheduled"], status["due"]) == (11, 1)  # type: ignore[index]
