"""MongoPipeline in-process, against a real MongoDB wire-protocol server (secantusd-py).

The multi-worker crawls into MongoDB are in test_mongo_crawl.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request, Spider
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.test import get_crawler
from twisted.internet import task

from distcrawl import cli
from distcrawl.addon import Addon
from distcrawl.config._convert import ConfigError
from distcrawl.mongo import MongoConfig, read_spill
from distcrawl.pipelines import MongoPipeline
from distcrawl.testing.mongo_server import MongoServer

pytestmark = pytest.mark.timeout(90)


class ItemsSpider(Spider):
    name = "items"


@dataclass
class Product:
    sku: str
    store: str
    price: float


def make_pipeline(uri: str, **settings: Any) -> MongoPipeline:
    crawler = get_crawler(ItemsSpider, {"MONGO_URI": uri, **settings})
    crawler.spider = ItemsSpider.from_crawler(crawler)
    return MongoPipeline.from_crawler(crawler)


def spilling_pipeline(uri: str, spill_dir: Any, **settings: Any) -> MongoPipeline:
    """A pipeline that gives up on MongoDB within a second and spills to ``spill_dir``."""
    return make_pipeline(
        uri,
        DISTCRAWL_MONGO_TIMEOUT=0.5,
        DISTCRAWL_MONGO_CLOSE_TIMEOUT=0.5,
        DISTCRAWL_MONGO_SPILL_DIR=str(spill_dir),
        **settings,
    )


def run(coro: Any) -> Any:
    """Scrapy's coroutines await asyncio futures: run them as asyncio tasks."""
    return deferred_from_coro(coro)


async def feed(pipe: MongoPipeline, items: list[Any]) -> list[Any]:
    return list(await asyncio.gather(*(pipe.process_item(item) for item in items)))


def stat(pipe: MongoPipeline, name: str) -> Any:
    assert pipe.crawler.stats is not None
    return pipe.crawler.stats.get_value(f"distcrawl/mongo/{name}")


def fingerprint(pipe: MongoPipeline, url: str) -> str:
    return pipe.crawler.request_fingerprinter.fingerprint(Request(url)).hex()


def sleep(seconds: float) -> Any:
    from twisted.internet import reactor

    return task.deferLater(reactor, seconds, lambda: None)


# ---------------------------------------------------------------------- URIs, settings


def test_mongo_config_defaults_and_errors_name_the_setting() -> None:
    assert not MongoConfig.from_settings(Settings()).enabled
    config = MongoConfig.from_settings(
        Settings(
            {
                "MONGO_URI": "mongodb://u:pw@db:27017/crawls?authSource=admin",
                "DISTCRAWL_MONGO_KEY_FIELDS": "sku, store",
                "DISTCRAWL_MONGO_COLLECTIONS": {"Product": "products"},
            }
        )
    )
    assert config.enabled
    assert config.database == "crawls"  # from the URI's path
    assert config.key_fields == ("sku", "store")
    assert config.collection_for(Product, "site") == "products"
    assert config.collection_for(dict, "site") == "site"
    buffering = config.buffering
    assert (buffering.batch_size, buffering.max_buffer, buffering.flush_interval) == (
        500,
        5000,
        0.1,
    )
    assert "pw" not in config.shown_uri
    assert (
        MongoConfig.from_settings(
            Settings({"MONGO_URI": "mongodb://db/crawls", "MONGO_DATABASE": "other"})
        ).database
        == "other"
    )

    bad = [
        ({"DISTCRAWL_MONGO_BATCH_SIZE": 0}, "DISTCRAWL_MONGO_BATCH_SIZE"),
        ({"DISTCRAWL_MONGO_BATCH_SIZE": "many"}, "DISTCRAWL_MONGO_BATCH_SIZE"),
        (
            {"DISTCRAWL_MONGO_BATCH_SIZE": 100, "DISTCRAWL_MONGO_MAX_BUFFER": 50},
            "DISTCRAWL_MONGO_MAX_BUFFER",
        ),
        ({"DISTCRAWL_MONGO_FLUSH_INTERVAL": -1}, "DISTCRAWL_MONGO_FLUSH_INTERVAL"),
        ({"MONGO_DATABASE": "a.b"}, "MONGO_DATABASE"),
        ({"DISTCRAWL_MONGO_COLLECTION": "a$b"}, "DISTCRAWL_MONGO_COLLECTION"),
        ({"DISTCRAWL_MONGO_COLLECTIONS": {"Product": "system.x"}}, "DISTCRAWL_MONGO_COLLECTIONS"),
        ({"DISTCRAWL_MONGO_KEY_FIELDS": ["$id"]}, "DISTCRAWL_MONGO_KEY_FIELDS"),
        ({"MONGO_URI": "http://u:s3cret@db/"}, "MONGO_URI"),
    ]
    for values, name in bad:
        settings = Settings({"MONGO_URI": "mongodb://db/", **values})
        with pytest.raises(ConfigError, match=name) as info:
            MongoConfig.from_settings(settings)
        assert "s3cret" not in str(info.value)


def test_addon_enables_the_pipeline_only_when_mongo_uri_is_set() -> None:
    def pipelines(**values: Any) -> dict[Any, Any]:
        settings = Settings(values)
        Addon().update_settings(settings)
        return settings.getwithbase("ITEM_PIPELINES").copy_to_dict()

    path = "distcrawl.pipelines.MongoPipeline"
    assert path not in pipelines()
    assert pipelines(MONGO_URI="mongodb://db/")[path] == 800
    mine = {"myproject.pipelines.Clean": 100}
    assert pipelines(MONGO_URI="mongodb://db/", ITEM_PIPELINES=mine) == {
        "myproject.pipelines.Clean": 100,
        path: 800,
    }
    # the project's own choice wins: here, the pipeline turned off
    assert pipelines(MONGO_URI="mongodb://db/", ITEM_PIPELINES={path: None})[path] is None


# ---------------------------------------------------------------------- writes


@pytest_twisted.ensureDeferred
async def test_bad_items_are_dead_lettered_with_reasons_and_the_rest_written(
    mongo_uri, mongo_client
):
    db = mongo_client.distcrawl
    # a schema validator: the server itself refuses one of the items below (error 121)
    db.create_collection(
        "items",
        validator={"$jsonSchema": {"properties": {"status": {"bsonType": "int"}}}},
    )
    pipe = make_pipeline(mongo_uri, DISTCRAWL_MONGO_BATCH_SIZE=100)
    base = "http://example.com"
    good = [{"url": f"{base}/page/{i}", "status": 200, "title": f"Page {i}"} for i in range(20)]
    bad = [
        {"url": f"{base}/dollar", "status": 200, "$where": "1 == 1"},
        {"url": f"{base}/set", "status": 200, "tags": {"a", "b"}},
        {"url": f"{base}/big", "status": 200, "text": "x" * (17 * 1024 * 1024)},
        {"url": f"{base}/huge-int", "status": 200, "count": 2**70},
        {"title": "an item without a URL"},
        {"url": f"{base}/validator", "status": "200"},
    ]
    items = good[:10] + bad + good[10:]
    await run(pipe.open_spider())
    returned = await run(feed(pipe, items))
    await run(pipe.close_spider())

    assert returned == items  # every process_item returned its item, none raised
    assert stat(pipe, "flushes") == 1  # one batch, written in one go
    assert db["items"].count_documents({}) == 20
    stored = db["items"].find_one({"_id": fingerprint(pipe, f"{base}/page/7")})
    assert stored is not None and stored["title"] == "Page 7"

    dead = list(db["items_dead"].find())
    assert len(dead) == 6
    big = [r for r in dead if r["truncated"]]
    assert len(big) == 1 and "document too large" in big[0]["reason"]
    reasons = {json.loads(r["item"]).get("url", "no url"): r for r in dead if not r["truncated"]}
    assert "'$where' starts with '$'" in reasons[f"{base}/dollar"]["reason"]
    assert "cannot be encoded as BSON" in reasons[f"{base}/set"]["reason"]
    assert "cannot be encoded as BSON" in reasons[f"{base}/huge-int"]["reason"]
    assert "no key" in reasons["no url"]["reason"]
    refused = reasons[f"{base}/validator"]
    assert refused["code"] == 121 and "refused by MongoDB" in refused["reason"]
    assert refused["_id"] == fingerprint(pipe, f"{base}/validator")
    for record in dead:
        assert record["collection"] == "items" and record["source"].startswith("items@")
    assert "distcrawl_time" in db["items_dead"].index_information()

    assert stat(pipe, "written") == stat(pipe, "upserted") == 20
    assert stat(pipe, "failed") == 6
    assert stat(pipe, "spilled") is None


@pytest_twisted.ensureDeferred
async def test_writing_again_updates_the_same_documents(mongo_uri, mongo_client):
    urls = [f"http://example.com/p/{i}" for i in range(30)]
    first = make_pipeline(mongo_uri)
    await run(first.open_spider())
    await run(feed(first, [{"url": u, "version": 1} for u in urls]))
    await run(first.close_spider())
    # a re-crawl: another pipeline (another worker, or a redelivered request)
    second = make_pipeline(mongo_uri)
    await run(second.open_spider())
    # the same page twice in one batch, and once with its URL spelled differently
    again = [{"url": u, "version": 2} for u in urls] + [
        {"url": urls[0], "version": 2},
        {"url": "http://example.com/p/1#section", "version": 2},
    ]
    await run(feed(second, again))
    await run(second.close_spider())

    items = mongo_client.distcrawl["items"]
    assert items.count_documents({}) == 30
    assert items.count_documents({"version": 2}) == 30
    assert (stat(first, "upserted"), stat(first, "updated")) == (30, None)
    assert stat(second, "upserted") is None
    assert stat(second, "updated") == stat(second, "written") == 32


@pytest_twisted.ensureDeferred
async def test_key_fields_own_ids_and_collections_per_item_type(mongo_uri, mongo_client):
    pipe = make_pipeline(
        mongo_uri,
        DISTCRAWL_MONGO_KEY_FIELDS=["sku", "store"],
        DISTCRAWL_MONGO_COLLECTIONS={f"{__name__}.Product": "products"},
    )
    items = [
        Product("A1", "berlin", 10.0),
        Product("A1", "paris", 11.0),
        Product("A1", "berlin", 9.5),  # the same product again: replaces the first
        {"_id": "own-key", "sku": "X", "store": "Y"},  # an item's own _id wins
    ]
    await run(pipe.open_spider())
    await run(feed(pipe, items))
    await run(pipe.close_spider())

    db = mongo_client.distcrawl
    products = db["products"]
    assert products.count_documents({}) == 2
    assert products.find_one({"sku": "A1", "store": "berlin"})["price"] in (10.0, 9.5)
    index = products.index_information()["distcrawl_key"]
    assert index["unique"] and index["key"] == [("sku", 1), ("store", 1)]
    assert db["items"].find_one({"_id": "own-key"}) is not None


@pytest_twisted.ensureDeferred
async def test_batches_by_size_and_by_time(mongo_uri, mongo_client):
    pipe = make_pipeline(
        mongo_uri, DISTCRAWL_MONGO_BATCH_SIZE=10, DISTCRAWL_MONGO_FLUSH_INTERVAL=0.5
    )
    await run(pipe.open_spider())
    await run(feed(pipe, [{"url": f"http://example.com/{i}"} for i in range(35)]))
    assert stat(pipe, "flushes") == 4  # 10 + 10 + 10 by size, then 5 by time
    assert stat(pipe, "batch_max") == 10
    started = time.monotonic()
    await run(feed(pipe, [{"url": "http://example.com/alone"}]))
    assert time.monotonic() - started >= 0.45  # a lone item waits for company
    await run(pipe.close_spider())
    assert mongo_client.distcrawl["items"].count_documents({}) == 36
    assert stat(pipe, "flush_time_ms") >= 0


@pytest_twisted.ensureDeferred
async def test_outage_keeps_every_item_and_bounds_the_buffer(
    mongo_server: MongoServer, mongo_client, caplog
):
    caplog.set_level(logging.INFO, logger="distcrawl")
    pipe = make_pipeline(
        mongo_server.uri,
        DISTCRAWL_MONGO_BATCH_SIZE=10,
        DISTCRAWL_MONGO_MAX_BUFFER=20,
        DISTCRAWL_MONGO_TIMEOUT=0.5,
        DISTCRAWL_MONGO_CLOSE_TIMEOUT=120,  # no engine here: "closing" from the start
    )
    await run(pipe.open_spider())
    await run(feed(pipe, [{"url": "http://example.com/first"}]))
    mongo_server.pause()
    try:
        items = [{"url": f"http://example.com/{i}"} for i in range(50)]
        pending = run(feed(pipe, items))
        await sleep(2.0)
        assert not pending.called  # nothing returns before it is written
        assert pipe._queued() <= 20  # the rest wait for room: the spider slows down
        assert stat(pipe, "waited_for_room") >= 1
        assert stat(pipe, "retries") >= 1
    finally:
        mongo_server.resume()
    assert await pending == items
    await run(pipe.close_spider())

    assert mongo_client.distcrawl["items"].count_documents({}) == 51
    assert stat(pipe, "buffer_max") <= 20
    assert stat(pipe, "written") == 51
    assert "write failed" in caplog.text and "is back after" in caplog.text


def _write_cert(directory: Path) -> tuple[str, str, str]:
    """A self-signed certificate for 127.0.0.1 (cryptography comes with Scrapy)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path), str(cert_path)


@pytest_twisted.ensureDeferred
async def test_spill_file_at_close_and_replay_command(
    mongo_server: MongoServer, mongo_client, tmp_path, caplog, capsys
):
    spill_dir = tmp_path / "spill"
    pipe = spilling_pipeline(mongo_server.uri, spill_dir)
    items: list[Any] = [{"url": f"http://example.com/{i}", "n": i} for i in range(10)]
    items.append({"url": "http://example.com/bad", "tags": {1, 2}})
    mongo_server.pause()
    try:
        await run(pipe.open_spider())
        assert await run(feed(pipe, items)) == items  # returned once spilled
        await run(pipe.close_spider())
    finally:
        mongo_server.resume()
    (path,) = spill_dir.iterdir()
    records = [r for _, r in read_spill(path)]
    assert len(records) == 11
    assert {r["collection"] for r in records} == {"items", "items_dead"}
    assert stat(pipe, "spilled") == 11
    assert f"distcrawl mongo replay {path}" in caplog.text

    uri = mongo_server.uri
    assert cli.main(["mongo", "replay", str(path), "--mongo-uri", uri]) == cli.EXIT_OK
    assert "11 documents" in capsys.readouterr().out
    db = mongo_client.distcrawl
    assert db["items"].count_documents({}) == 10
    assert db["items"].find_one({"_id": fingerprint(pipe, "http://example.com/3")})["n"] == 3
    (dead,) = db["items_dead"].find()
    assert "cannot be encoded" in dead["reason"]
    # replaying twice changes nothing
    assert cli.main(["--json", "mongo", "replay", str(path), "--mongo-uri", uri]) == 0
    assert json.loads(capsys.readouterr().out)["updated"] == 11
    assert db["items"].count_documents({}) == 10

    # usage errors and an unreachable server
    assert cli.main(["mongo", "replay", str(tmp_path / "missing.jsonl"), "--mongo-uri", uri]) == 2
    not_spill = tmp_path / "other.jsonl"
    not_spill.write_text('{"hello": 1}\n')
    assert cli.main(["mongo", "replay", str(not_spill), "--mongo-uri", uri]) == 2
    down = "mongodb://u:s3cret@127.0.0.1:1/?directConnection=true&serverSelectionTimeoutMS=300"
    assert cli.main(["mongo", "replay", str(path), "--mongo-uri", down]) == cli.EXIT_UNREACHABLE
    assert "s3cret" not in capsys.readouterr().err


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_credentials_tls_and_replica_set_options_and_no_password_in_logs(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    tls = _write_cert(tmp_path)
    password = "pa:ss@w/rd s3cret"
    server = MongoServer(directory=tmp_path / "mongo", standalone=False, tls=tls).start()
    try:
        server.enable_auth("crawler", password)
        uri = server.replica_set_uri  # user:password, tls, tlsCAFile, replicaSet, authSource
        assert "replicaSet=secantus" in uri and "tls=true" in uri
        pipe = make_pipeline(uri)
        await run(pipe.open_spider())
        await run(feed(pipe, [{"url": f"http://example.com/{i}"} for i in range(5)]))
        await run(pipe.close_spider())
        with server.client() as client:
            assert client.distcrawl["items"].count_documents({}) == 5
        assert "mongodb://crawler:***@127.0.0.1" in caplog.text

        # a wrong password: the failure is logged without it, and nothing is lost
        wrong = uri.replace("s3cret", "wr0ngpass")
        bad = make_pipeline(
            wrong,
            DISTCRAWL_MONGO_TIMEOUT=1,
            DISTCRAWL_MONGO_CLOSE_TIMEOUT=0,
            DISTCRAWL_MONGO_SPILL_DIR=str(tmp_path / "spill"),
        )
        await run(bad.open_spider())
        await run(feed(bad, [{"url": "http://example.com/x"}]))
        await run(bad.close_spider())
        assert stat(bad, "spilled") == 1
        assert "write failed" in caplog.text
        assert "MongoDB refused the credentials" in caplog.text  # not "unreachable"
    finally:
        server.stop()
    for secret in ("s3cret", "wr0ngpass", "pa%3Ass"):
        assert secret not in caplog.text
