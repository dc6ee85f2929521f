"""Change tracking in MongoDB: a PageFetch as an update of its page's document.

The operation-building functions are tested without a server; the rest against the real
SecantusDB server (``mongo_server``), in-process, like tests/test_pipelines.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from twisted.internet.defer import succeed

from distcrawl import cli
from distcrawl.items import PageFetch, PageItem
from distcrawl.mongo import (
    SPILL_FORMAT,
    SPILL_FORMAT_OPS,
    DocContext,
    MongoConfig,
    SpillFile,
    check_update,
    dead_record,
    doc_record,
    document_for,
    fetch_document,
    fetch_time,
    read_spill,
    record_doc,
    spill_record,
    tracking_filter,
    tracking_update,
)
from distcrawl.pipelines import MongoPipeline, _Pending
from distcrawl.testing.mongo_server import MongoServer
from tests.test_pipelines import (
    ItemsSpider,
    feed,
    fingerprint,
    make_pipeline,
    run,
    spilling_pipeline,
    stat,
)

pytestmark = pytest.mark.timeout(90)

URL = "http://example.com/page/1"
T0 = 1_767_225_600.123456  # 2026-01-01T00:00:00.123456Z
T1 = T0 + 3600
T2 = T0 + 7200
REVISITS = {"DISTCRAWL_RECRAWL_INTERVAL": 3600}


def fp(request: Request) -> bytes:
    """A stand-in request fingerprinter for the tests without a crawler."""
    return ("fp:" + request.url).encode()


def at(epoch: float) -> datetime:
    """How a stored time comes back to a client that is not tz_aware (the fixtures')."""
    return fetch_time(epoch).replace(tzinfo=None)


def first(epoch: float = T0, signature: str = "s0") -> PageFetch:
    return PageFetch(URL, epoch, 200, changed=True, first=True, signature=signature)


def unchanged(epoch: float = T1, status: int = 304) -> PageFetch:
    return PageFetch(URL, epoch, status, changed=False, first=False, signature=None)


def changed(epoch: float = T2, signature: str = "s2") -> PageFetch:
    return PageFetch(URL, epoch, 200, changed=True, first=False, signature=signature)


# ---------------------------------------------------------------------- without a server


def test_tracking_update_of_each_kind_of_fetch() -> None:
    t0 = datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=timezone.utc)
    assert fetch_time(T0) == t0  # UTC, aware, cut to BSON's millisecond
    assert tracking_update(first()) == {
        "$set": {"last_fetched": t0, "last_changed": t0, "signature": "s0", "status": 200},
        "$min": {"first_seen": t0},
        "$inc": {"fetch_count": 1, "change_count": 0},
    }
    t2 = fetch_time(T2)
    assert tracking_update(changed()) == {
        "$set": {"last_fetched": t2, "last_changed": t2, "signature": "s2", "status": 200},
        "$min": {"first_seen": t2},
        "$inc": {"fetch_count": 1, "change_count": 1},
    }
    # unchanged: only the fetch fields, whatever the status (304, or 200 with the same
    # signature)
    t1 = fetch_time(T1)
    for status in (304, 200):
        assert tracking_update(unchanged(status=status)) == {
            "$set": {"last_fetched": t1, "status": status},
            "$inc": {"fetch_count": 1},
        }
    assert tracking_filter("k", unchanged()) == {
        "_id": "k",
        "last_fetched": {"$not": {"$gte": t1}},
    }


def test_a_fetch_updates_the_document_its_page_item_is_keyed_by() -> None:
    docs = DocContext(MongoConfig(uri="mongodb://db/"), "site", fp)
    page = document_for(PageItem(URL, 200, title="T"), docs, revisits=True)
    fetch = fetch_document(first(), docs)
    assert fetch.key == page.key == ("fp:" + URL).encode().hex()
    assert (fetch.collection, page.collection) == ("site", "site")
    assert fetch.tracking and not page.tracking
    assert fetch.update == tracking_update(first())
    assert fetch.filter == tracking_filter(fetch.key, first())
    # the page item itself: a $set of its fields, so tracking fields survive it
    assert page.update is not None and page.filter is None
    assert page.update["$set"]["title"] == "T" and "_id" not in page.update["$set"]
    # revisits off: a replacement, as always
    assert document_for(PageItem(URL, 200), docs, revisits=False).update is None

    # the collection: PageFetch's own mapping, else DISTCRAWL_MONGO_COLLECTION, else default
    mapped = MongoConfig(uri="x", collections=(("PageFetch", "pages"), ("PageItem", "pages")))
    assert fetch_document(first(), DocContext(mapped, "site", fp)).collection == "pages"
    one = MongoConfig(uri="x", collection="c")
    assert fetch_document(first(), DocContext(one, "site", fp)).collection == "c"
    # DISTCRAWL_MONGO_KEY_FIELDS does not change a fetch's key: it is always the URL's
    keyed = MongoConfig(uri="x", key_fields=("sku",))
    assert fetch_document(first(), DocContext(keyed, "site", fp)).key == fetch.key


def test_a_fetch_that_cannot_be_written_is_dead_lettered_not_lost() -> None:
    docs = DocContext(MongoConfig(uri="mongodb://db/"), "site", fp)
    for bad, reason in [
        (PageFetch("", T0, 200, True, True, "s"), "no key"),
        (PageFetch(URL, float("nan"), 200, True, True, "s"), "fetched_at"),
        (PageFetch(URL, "yesterday", 200, True, True, "s"), "fetched_at"),  # type: ignore[arg-type]
        (PageFetch(URL, T0, "200", True, True, "s"), "status"),  # type: ignore[arg-type]
        (PageFetch("not a url", T0, 200, True, True, "s"), "no key"),
    ]:
        doc = fetch_document(bad, docs)
        assert doc.error is not None and reason in doc.error, (bad, doc.error)
        assert doc.tracking and doc.key is None


def test_a_refused_fetch_has_a_dead_letter_of_its_own() -> None:
    docs = DocContext(MongoConfig(uri="mongodb://db/"), "site", fp)
    item = document_for(PageItem(URL, 200), docs, revisits=True)
    records = [
        dead_record(d, "refused", 121, database="db", source="w")["_id"]
        for d in (
            item,
            fetch_document(first(), docs),
            fetch_document(changed(), docs),
            fetch_document(changed(), docs),
        )
    ]
    assert records[0] == item.key
    # one per fetch, never the page item's; the same fetch twice is the same record
    assert len(set(records)) == 3 and records[2] == records[3]


def test_check_update_refuses_what_an_update_would_store_otherwise() -> None:
    assert isinstance(check_update({"$set": {"title": "x", "n": 1}}), bytes)
    assert "contains '.'" in str(check_update({"$set": {"og.title": "x"}}))
    assert "starts with '$'" in str(check_update({"$set": {"$where": "x"}}))
    assert "cannot be encoded" in str(check_update({"$set": {"tags": {1, 2}}}))
    assert "not an update operator" in str(check_update({"title": "x"}))
    assert "too large" in str(check_update({"$set": {"text": "x" * (17 * 1024 * 1024)}}))
    # nested field names are stored as they are: only the top level is a path
    assert isinstance(check_update({"$set": {"meta": {"og.title": "x"}}}), bytes)


def test_spill_records_say_their_operation_and_old_files_still_read(tmp_path) -> None:
    docs = DocContext(MongoConfig(uri="mongodb://db/"), "site", fp)
    page = document_for({"url": URL, "title": "T"}, docs, revisits=True)
    fetch = fetch_document(first(), docs)
    plain = document_for({"url": URL, "title": "T"}, docs, revisits=False)
    spill = SpillFile(tmp_path / "s.jsonl")
    spill.append(doc_record("db", d, "down") for d in (page, fetch, plain))
    records = [r for _, r in read_spill(spill.path)]
    assert [r["v"] for r in records] == [SPILL_FORMAT_OPS, SPILL_FORMAT_OPS, SPILL_FORMAT]
    assert [r.get("op") for r in records] == ["update", "update", None]
    assert records[1]["doc"] == {"_id": fetch.key}  # the fields are in the update, once
    back = [record_doc(r) for r in records]
    assert back[0].update == page.update and back[0].filter is None and not back[0].tracking
    assert back[1].update == fetch.update and back[1].filter == fetch.filter
    assert back[1].tracking
    assert back[2].update is None and back[2].doc == plain.doc

    # a file written before updates existed (format 1, no "op") is a file of replacements
    old = tmp_path / "old.jsonl"
    SpillFile(old).append([spill_record("db", "site", {"_id": "k", "title": "T"}, "down")])
    ((_, record),) = read_spill(old)
    assert record_doc(record).update is None
    # records that are neither are refused, not guessed at
    for bad in (
        {**records[0], "op": "delete"},
        {**records[0], "update": "x"},
        {**records[2], "op": "update"},  # format 1 never says its operation
    ):
        path = tmp_path / "bad.jsonl"
        path.unlink(missing_ok=True)
        SpillFile(path).append([bad])
        with pytest.raises(ValueError, match="not a distcrawl spill record"):
            list(read_spill(path))


def test_revisits_setting_turns_items_into_updates() -> None:
    def pipeline(**settings: Any) -> MongoPipeline:
        crawler = get_crawler(ItemsSpider, {"MONGO_URI": "mongodb://db/", **settings})
        return MongoPipeline.from_crawler(crawler)

    assert not pipeline().revisits
    assert pipeline(**REVISITS).revisits
    assert not pipeline(DISTCRAWL_RECRAWL_INTERVAL=None).revisits


def test_tracking_updates_send_no_item_notifications() -> None:
    sent: list[Any] = []

    class Notifier:
        def deliver(self, stored: list[Any], *args: Any) -> str:
            sent.extend(stored)
            return "sent"

    class SyncIO:
        def run(self, func: Any, *args: Any) -> Any:
            return succeed(func(*args))

    crawler = get_crawler(ItemsSpider, Settings({"MONGO_URI": "mongodb://db/", **REVISITS}))
    pipe = MongoPipeline.from_crawler(crawler)
    pipe._notifier = Notifier()  # type: ignore[assignment]
    pipe._io = SyncIO()  # type: ignore[assignment]
    docs = DocContext(pipe.config, "items", fp)
    batch = [
        _Pending(document_for(PageItem(URL, 200), docs, revisits=True)),
        _Pending(document_for(first(), docs, revisits=True)),
    ]
    pipe._notify(batch, ["upserted", "updated"])
    assert sent == [("items", batch[0].doc.key)]
    assert [p.done.called for p in batch] == [True, True]


# ---------------------------------------------------------------------- against SecantusDB


def page(title: str, text: str) -> PageItem:
    return PageItem(URL, 200, title=title, text=text, fetched_at=T0)


@pytest_twisted.ensureDeferred
async def test_first_unchanged_and_changed_fetches_of_a_page(mongo_uri, mongo_client):
    pipe = make_pipeline(mongo_uri, **REVISITS)
    await run(pipe.open_spider())
    pages = mongo_client.distcrawl["items"]
    key = fingerprint(pipe, URL)

    # the first fetch: the page's item, then its PageFetch, in one batch
    await run(feed(pipe, [page("Old", "old text"), first()]))
    doc = pages.find_one({"_id": key})
    assert doc["title"] == "Old" and doc["text"] == "old text"
    assert (doc["fetch_count"], doc["change_count"]) == (1, 0)
    assert doc["first_seen"] == doc["last_changed"] == doc["last_fetched"] == at(T0)
    assert (doc["signature"], doc["status"]) == ("s0", 200)

    # unchanged (a 304): no item, only the fetch fields move
    await run(feed(pipe, [unchanged()]))
    doc = pages.find_one({"_id": key})
    assert (doc["fetch_count"], doc["change_count"]) == (2, 0)
    assert doc["last_fetched"] == at(T1) and doc["status"] == 304
    assert doc["first_seen"] == doc["last_changed"] == at(T0)
    assert (doc["title"], doc["text"], doc["signature"]) == ("Old", "old text", "s0")

    # changed: the new item rewrites the content, the fetch counts a change
    await run(feed(pipe, [page("New", "new text"), changed()]))
    doc = pages.find_one({"_id": key})
    assert (doc["title"], doc["text"]) == ("New", "new text")
    assert (doc["fetch_count"], doc["change_count"]) == (3, 1)
    assert doc["last_fetched"] == doc["last_changed"] == at(T2)
    assert doc["first_seen"] == at(T0)
    assert (doc["signature"], doc["status"]) == ("s2", 200)
    assert pages.count_documents({}) == 1

    # the same fetch written again (a batch retried after it was applied, a redelivery):
    # counted once
    await run(feed(pipe, [changed()]))
    assert pages.find_one({"_id": key})["fetch_count"] == 3
    await run(pipe.close_spider())

    assert stat(pipe, "written") == 2  # the two PageItems; fetches count apart
    assert stat(pipe, "fetches/recorded") == 3
    assert stat(pipe, "fetches/skipped") == 1


@pytest_twisted.ensureDeferred
async def test_a_fetch_before_its_page_and_a_page_mapped_elsewhere(mongo_uri, mongo_client):
    pipe = make_pipeline(
        mongo_uri,
        DISTCRAWL_MONGO_COLLECTIONS={"PageItem": "pages", "PageFetch": "pages"},
        **REVISITS,
    )
    await run(pipe.open_spider())
    # the fetch first (another batch, another worker): it makes the document, the item fills
    # in its content and leaves the tracking fields alone
    await run(feed(pipe, [first()]))
    await run(feed(pipe, [page("T", "x")]))
    # an item refused by the update form: a dotted top-level field name
    await run(feed(pipe, [{"url": "http://example.com/dotted", "og.title": "x"}]))
    await run(pipe.close_spider())
    db = mongo_client.distcrawl
    doc = db["pages"].find_one({"_id": fingerprint(pipe, URL)})
    assert doc["title"] == "T" and doc["fetch_count"] == 1 and doc["first_seen"] == at(T0)
    assert "items" not in db.list_collection_names()
    (dead,) = db["items_dead"].find()
    assert "contains '.'" in dead["reason"]


@pytest_twisted.ensureDeferred
async def test_with_revisits_off_items_are_still_replacements(mongo_uri, mongo_client):
    pipe = make_pipeline(mongo_uri)
    assert not pipe.revisits
    await run(pipe.open_spider())
    await run(feed(pipe, [{"url": URL, "a": 1, "b": 2}, first()]))
    await run(feed(pipe, [{"url": URL, "a": 3}]))
    await run(pipe.close_spider())
    doc = mongo_client.distcrawl["items"].find_one({"_id": fingerprint(pipe, URL)})
    # the second item replaced the document: its old field and the tracking fields are gone
    assert doc == {"_id": fingerprint(pipe, URL), "url": URL, "a": 3}

    # with revisits on, the same items keep both (a field an item no longer has stays)
    on = make_pipeline(mongo_uri, **REVISITS)
    other = "http://example.com/page/2"
    await run(on.open_spider())
    await run(feed(on, [{"url": other, "a": 1, "b": 2}]))
    await run(feed(on, [PageFetch(other, T0, 200, True, True, "s")]))
    await run(feed(on, [{"url": other, "a": 3}]))
    await run(on.close_spider())
    doc = mongo_client.distcrawl["items"].find_one({"_id": fingerprint(on, other)})
    assert (doc["a"], doc["b"], doc["fetch_count"]) == (3, 2, 1)


@pytest_twisted.ensureDeferred
async def test_spilled_fetches_replay_as_updates_once(
    mongo_server: MongoServer, mongo_client, tmp_path, capsys
):
    # what the page's document held before the outage: content and one fetch
    before = make_pipeline(mongo_server.uri, **REVISITS)
    await run(before.open_spider())
    await run(feed(before, [page("Old", "old text"), first()]))
    await run(before.close_spider())
    key = fingerprint(before, URL)

    spill_dir = tmp_path / "spill"
    pipe = spilling_pipeline(mongo_server.uri, spill_dir, **REVISITS)
    items: list[Any] = [unchanged(), page("New", "new text"), changed()]
    mongo_server.pause()
    try:
        await run(pipe.open_spider())
        assert await run(feed(pipe, items)) == items
        await run(pipe.close_spider())
    finally:
        mongo_server.resume()
    (path,) = spill_dir.iterdir()
    records = [r for _, r in read_spill(path)]
    assert [(r["v"], r["op"], r["tracking"]) for r in records] == [
        (SPILL_FORMAT_OPS, "update", True),
        (SPILL_FORMAT_OPS, "update", False),
        (SPILL_FORMAT_OPS, "update", True),
    ]
    assert stat(pipe, "spilled") == 3

    uri = mongo_server.uri
    assert cli.main(["--json", "mongo", "replay", str(path), "--mongo-uri", uri]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["documents"], out["updated"], out["already_recorded"]) == (3, 3, 0)
    pages = mongo_client.distcrawl["items"]
    doc = pages.find_one({"_id": key})
    # updated, not replaced: the content is new and the tracking fields add up
    assert (doc["title"], doc["text"], doc["url"]) == ("New", "new text", URL)
    assert (doc["fetch_count"], doc["change_count"]) == (3, 1)
    assert doc["first_seen"] == at(T0) and doc["last_changed"] == at(T2)

    # replaying twice changes nothing: the fetches are recorded already
    assert cli.main(["mongo", "replay", str(path), "--mongo-uri", uri]) == cli.EXIT_OK
    assert "2 fetches already recorded" in capsys.readouterr().out
    assert pages.find_one({"_id": key})["fetch_count"] == 3
    assert pages.count_documents({}) == 1
