"""``python -m benchmarks.console``: each view of ``distcrawl web`` on a large crawl.

The console's promise is that every view reads Redis in O(page size), so that a page of a
crawl of millions renders as fast as one of a crawl of hundreds. This fills a fresh
``redis-server`` as a large crawl would leave it: ``--urls`` queued requests (1,000,000)
over ``--domains`` sites (10,000) through the frontier's own bulk path (``Frontier.commit``,
1,000 entries a script call, as the workers and the producer commit), the busiest-domains
statistic of every site, ``--dead`` dead letters (20,000), 20 workers' heartbeats and a full
day of history rollups; then starts ``distcrawl web`` on it and requests each view
``--repeat`` times (20), reporting the server's own time per view (its ``Server-Timing``
header: the handler's Redis reads and rendering) and the time the request took over
loopback, median and slowest. Target: under 1 s each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import redis

from distcrawl.codec.serialize import RequestCodec
from distcrawl.model.frontier import Frontier
from distcrawl.model.history import RESOLUTIONS, HistoryWriter
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.records import Entry, EntryKind
from distcrawl.testing.redis_server import RedisServer
from tests.web_console import Console

NAMESPACE = "site"
BATCH = 1000
#: the views measured: name -> path (a deep page too, where a page would cost its offset)
VIEWS = {
    "crawl page": "/crawl/site",
    "status JSON": "/api/crawl/site/status",
    "domains, page 1": "/crawl/site/domains",
    "domains, page 150": "/crawl/site/domains?page=149",
    "dead letters, page 1": "/crawl/site/dead",
    "dead letters, page 400": "/crawl/site/dead?page=399",
    "history, hour": "/api/crawl/site/history?span=hour",
    "history, day": "/api/crawl/site/history?span=day",
}


def fill(client: redis.Redis, urls: int, domains: int, dead: int) -> float:
    """The crawl's state; returns the seconds the queue took to fill."""
    keys = FrontierKeys(NAMESPACE)
    frontier = Frontier(client, keys)
    codec = RequestCodec("msgpack")
    rng = random.Random(1)
    started = time.perf_counter()
    batch: list[Entry] = []
    for n in range(urls):
        host = f"h{n % domains}.test"
        url = f"http://{host}/page/{n}"
        fp = hashlib.sha1(url.encode()).digest()[:12]
        batch.append(Entry(EntryKind.REQUEST, fp, 0, codec.encode_dict({"u": url}), b"", host))
        if len(batch) >= BATCH:
            frontier.commit([], batch)
            batch = []
    if batch:
        frontier.commit([], batch)
    filled = time.perf_counter() - started
    pipe = client.pipeline(transaction=False)
    for d in range(domains):
        pipe.zadd(keys.domains, {f"h{d}.test": rng.randint(1, 5000)})
    for n in range(dead):
        record = {"reason": f"HTTP {500 + n % 4}", "source": "retry", "time": time.time()}
        pipe.lpush(keys.dead, json.dumps({**record, "url": f"http://h{n % domains}.test/x/{n}"}))
        if n % 5000 == 4999:
            pipe.execute()
    for w in range(20):
        beat = {"host": "bench", "pid": w, "state": "running", "pages": 1000, "items": 900}
        pipe.hset(keys.workers, f"bench:{w}", json.dumps(beat))
    pipe.hset(keys.stats, mapping={"pages": 20_000, "items": 18_000, "errors": 30})
    pipe.execute()
    # a day of beats, one a minute, through the workers' own rollup writer
    writer = HistoryWriter()
    now = time.time()
    day = RESOLUTIONS["day"].window
    for at in range(int(now) - day, int(now), 60):
        pipe = client.pipeline(transaction=False)
        gauges = {"queue": urls}
        deltas = {"pages": rng.randint(100, 300), "items": 90, "errors": rng.randint(0, 3)}
        for op in writer.ops(keys, at, deltas, gauges):
            pipe.execute_command(*op.args)
        pipe.execute()
    return filled


def timings(web: Console, path: str, repeat: int) -> tuple[list[float], list[float]]:
    server, total = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        with urllib.request.urlopen(web.url + path, timeout=60) as resp:
            resp.read()
            header = resp.headers.get("Server-Timing", "app;dur=nan")
        total.append((time.perf_counter() - started) * 1000)
        server.append(float(header.partition("dur=")[2]))
    return server, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.console", description=__doc__)
    parser.add_argument("--urls", type=int, default=1_000_000)
    parser.add_argument("--domains", type=int, default=10_000)
    parser.add_argument("--dead", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp:
        server = RedisServer(directory=tmp).start()
        try:
            client = redis.Redis.from_url(server.url)
            filled = fill(client, args.urls, args.domains, args.dead)
            print(
                f"filled {client.zcard(FrontierKeys(NAMESPACE).queue)} queued URLs over "
                f"{client.zcard(FrontierKeys(NAMESPACE).ready)} domains in {filled:.0f} s, "
                f"{client.llen(FrontierKeys(NAMESPACE).dead)} dead letters"
            )
            with Console(server.url, Path(tmp, "web.log")) as web:
                header = f"{'view':<24} {'server median':>14} {'server max':>11}"
                print(f"{header} {'request median':>15}")
                worst = 0.0
                for name, path in VIEWS.items():
                    timings(web, path, 2)  # warm: templates compiled, connections made
                    server_ms, total_ms = timings(web, path, args.repeat)
                    worst = max(worst, *server_ms)
                    print(
                        f"{name:<24} {statistics.median(server_ms):>11.1f} ms "
                        f"{max(server_ms):>8.1f} ms {statistics.median(total_ms):>12.1f} ms"
                    )
            client.close()
        finally:
            server.stop()
    print(f"slowest server time {worst:.1f} ms: {'under' if worst < 1000 else 'OVER'} 1 s")
    return 0 if worst < 1000 else 1


if __name__ == "__main__":
    sys.exit(main())
