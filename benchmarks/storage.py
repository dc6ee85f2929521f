"""Redis memory per queued request and per seen URL, for distcrawl and for scrapy-redis.

Both frontiers are filled with the same requests, the ones a crawl of the demo site queues
(``/page/<n>`` with the ``parse`` callback, the scope meta and a depth), through the code each
crawler really uses to store them: ``Frontier.commit`` with ``RequestCodec`` payloads and
12-byte fingerprints for distcrawl; scrapy-redis' own ``PriorityQueue._encode_request`` (the
pickle its scheduler pushes), its ZADD score and its dupefilter's SHA1 fingerprints. Only the
transport differs for scrapy-redis (a pipeline instead of one round trip per request), which
changes nothing in what is stored. ``MEMORY USAGE ... SAMPLES 0`` measures each key exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from scrapy_redis.dupefilter import RFPDupeFilter
from scrapy_redis.queue import PriorityQueue

from benchmarks.spiders import ScrapyRedisSiteSpider
from distcrawl.codec.serialize import RequestCodec
from distcrawl.dupefilter import FINGERPRINT_BYTES
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.records import Entry, EntryKind
from distcrawl.model.seen import BloomState, part_keys
from distcrawl.spiders.site import SCOPE_META, SiteSpider

BATCH = 500
SITE = "http://127.0.0.1:40123"
SLOT = "127.0.0.1"  # the politeness slot each queue entry carries, as in a crawl
BLOOM_ERROR_RATE = 1e-6


def sample_requests(spider: Any, count: int) -> Iterator[Request]:
    """Requests as the site spider yields them once DepthMiddleware has set their depth."""
    for n in range(count):
        meta = {SCOPE_META: "127.0.0.1", "depth": 1 + n % 8}
        yield Request(f"{SITE}/page/{n}", callback=spider.parse, meta=meta)


def key_bytes(client: redis.Redis, key: str) -> int:
    return int(client.memory_usage(key, samples=0) or 0)


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def distcrawl_storage(client: redis.Redis, count: int, seen: str = "set") -> dict[str, Any]:
    """Fills a distcrawl frontier through ``Frontier.commit`` in batches of the default size;
    with ``seen="bloom"`` the Bloom filter is sized for exactly ``count`` URLs at 1e-6."""
    keys = FrontierKeys("bench-distcrawl")
    frontier = Frontier(
        client, keys, seen=seen, bloom_capacity=count, bloom_error_rate=BLOOM_ERROR_RATE
    )
    spider = SiteSpider()
    codec = RequestCodec("msgpack", spider)
    fingerprinter = RequestFingerprinter()
    memory0 = used_memory(client)
    batch: list[Entry] = []
    payload_bytes = 0
    for request in sample_requests(spider, count):
        payload = codec.encode(request)
        payload_bytes += len(payload)
        fp = fingerprinter.fingerprint(request)[:FINGERPRINT_BYTES]
        batch.append(Entry(EntryKind.REQUEST, fp, request.priority, payload, b"", SLOT))
        if len(batch) >= BATCH:
            frontier.commit([], batch)
            batch = []
    if batch:
        frontier.commit([], batch)
    queued = key_bytes(client, keys.queue) + key_bytes(client, keys.requests)
    bloom = BloomState.parse(client.hgetall(keys.bloom))
    seen_keys = [keys.seen] if seen == "set" else [keys.bloom, *part_keys(keys, bloom)]
    seen_bytes = sum(key_bytes(client, k) for k in seen_keys)
    result = {
        "requests": int(client.zcard(keys.queue)),
        "payload_bytes_per_request": payload_bytes / count,
        "queue_bytes_per_request": queued / count,
        "seen_bytes_per_url": seen_bytes / count,
        "used_memory_bytes_per_request": (used_memory(client) - memory0) / count,
        "keys": {k: key_bytes(client, k) for k in (keys.queue, keys.requests, *seen_keys)},
    }
    frontier.admin.clear()
    return result


def scrapy_redis_storage(client: redis.Redis, count: int) -> dict[str, Any]:
    """Fills scrapy-redis' priority queue and dupefilter with what its scheduler stores."""
    spider = ScrapyRedisSiteSpider()
    queue = PriorityQueue(server=client, spider=spider, key="bench-srsite:requests")
    dupefilter = RFPDupeFilter(client, key="bench-srsite:dupefilter")
    memory0 = used_memory(client)
    pipe = client.pipeline(transaction=False)
    payload_bytes = 0
    for n, request in enumerate(sample_requests(spider, count), 1):
        data = queue._encode_request(request)
        payload_bytes += len(data)
        pipe.execute_command("ZADD", queue.key, -request.priority, data)
        pipe.sadd(dupefilter.key, dupefilter.request_fingerprint(request))
        if n % BATCH == 0:
            pipe.execute()
    pipe.execute()
    result = {
        "requests": int(client.zcard(queue.key)),
        "payload_bytes_per_request": payload_bytes / count,
        "queue_bytes_per_request": key_bytes(client, queue.key) / count,
        "seen_bytes_per_url": key_bytes(client, dupefilter.key) / count,
        "used_memory_bytes_per_request": (used_memory(client) - memory0) / count,
        "keys": {k: key_bytes(client, k) for k in (queue.key, dupefilter.key)},
    }
    client.delete(queue.key, dupefilter.key)
    return result
