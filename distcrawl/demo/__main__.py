"""The quick start: ``python -m distcrawl.demo`` (or ``bash .ci/demo``).

Starts a throwaway Redis, a MongoDB (secantusd-py) and the bundled demo site on 127.0.0.1,
runs two real ``scrapy crawl site`` workers that share the frontier and store their items in
MongoDB, pushes the start URL the way any producer would, and prints what the site itself
saw (pages per worker, duplicates, missing pages and time) and what MongoDB holds.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from distcrawl import cli
from distcrawl.demo.site import DemoSite
from distcrawl.model.redact import redact_url
from distcrawl.testing.mongo_server import MongoServer
from distcrawl.testing.redis_server import RedisServer
from distcrawl.testing.workers import Worker, worker_agent

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m distcrawl.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--pages", type=int, default=3000, help="pages of the demo site")
    p.add_argument("--workers", type=int, default=2, help="worker processes")
    p.add_argument("--dir", type=Path, default=ROOT / ".demo", help="logs and Redis data")
    p.add_argument("--timeout", type=float, default=600, help="give up after this many seconds")
    p.add_argument("--no-mongo", action="store_true", help="do not store the items in MongoDB")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    (args.dir / "redis").mkdir()
    redis_server = RedisServer(directory=args.dir / "redis").start()
    site = DemoSite(pages=args.pages, log_path=args.dir / "site.log").start()
    pool: list[Worker] = []
    mongo: MongoServer | None = None
    try:
        if not args.no_mongo:
            mongo = MongoServer(directory=args.dir / "mongo").start()
        print(
            f"Redis       {redact_url(redis_server.url)}   (watch it live from another "
            f"terminal: .venv/bin/distcrawl --redis-url {redact_url(redis_server.url)} watch site)"
        )
        if mongo is not None:
            print(
                f"MongoDB     {redact_url(mongo.uri)}   (secantusd-py; items go to distcrawl.site)"
            )
        print(f"Demo site   {site.url}/ ({args.pages} pages, 17 links each)")
        for i in range(1, args.workers + 1):
            pool.append(
                Worker(
                    i,
                    redis_url=redis_server.url,
                    log_path=args.dir / f"worker-{i}.log",
                    settings={"DISTCRAWL_IDLE_TIMEOUT": 5},
                    mongo_uri=mongo.uri if mongo is not None else None,
                ).start()
            )
        print(f"Workers     {args.workers} x `scrapy crawl site` (logs in {args.dir}/)")
        for w in pool:
            w.wait_for_log("Frontier: ", timeout=60)
        started = time.time()
        client = redis_server.client()
        client.lpush("site:start_urls", site.url + "/")
        print(f"Pushed      LPUSH site:start_urls {site.url}/")
        expected = site.expected_pages()
        last_report = 0.0
        while any(w.alive() for w in pool) and time.time() - started < args.timeout:
            time.sleep(0.2)
            if time.time() - last_report >= 2:
                last_report = time.time()
                done = len({ln.path for ln in site.read_log() if ln.path in expected})
                print(
                    f"  {time.time() - started:5.1f}s  {done:5d}/{len(expected)} pages  "
                    f"queue {client.zcard('site:queue')}  leased {client.zcard('site:leases')}"
                )
        elapsed = time.time() - started
        code = summary(site, pool, client, expected, elapsed)
        if mongo is not None:
            code = mongo_summary(mongo, site) or code
        print("\n$ distcrawl status site")
        cli.main(["--redis-url", redis_server.url, "status", "site"])
        return code
    finally:
        for w in pool:
            w.stop()
        site.stop()
        redis_server.stop()
        if mongo is not None:
            mongo.stop()  # its data stays in --dir/mongo/data


def summary(
    site: DemoSite,
    pool: list[Worker],
    client: Any,
    expected: set[str],
    elapsed: float,
) -> int:
    log = [ln for ln in site.read_log() if ln.path in expected and ln.status == 200]
    fetched = Counter(ln.path for ln in log)
    per_worker = Counter(ln.user_agent for ln in log)
    duplicates = sum(n - 1 for n in fetched.values())
    missing = len(expected - set(fetched))
    # the crawl ends when the workers have been idle for DISTCRAWL_IDLE_TIMEOUT
    last = max((ln.time for ln in log), default=time.time())
    first = min((ln.time for ln in log), default=last)
    crawl_time = max(last - first, 1e-9)
    print("\nSummary (from the demo site's own request log)")
    for w in pool:
        print(f"  worker {w.index}: {per_worker[worker_agent(w.index)]:6d} pages")
    print(f"  pages fetched: {len(fetched)} of {len(expected)}")
    print(f"  duplicates:    {duplicates}")
    print(f"  missing:       {missing}")
    print(
        f"  crawl time:    {crawl_time:.1f}s ({len(log) / crawl_time:.0f} pages/s); "
        f"{elapsed:.1f}s including the idle wait"
    )
    print(f"  dead letters:  {client.llen('site:dead')}")
    ok = missing == 0 and duplicates == 0
    print("OK: every page fetched exactly once" if ok else "PROBLEM: see the worker logs")
    return 0 if ok else 1


def mongo_summary(mongo: MongoServer, site: DemoSite) -> int:
    """What the item pipeline stored, and a few queries to show how to read it."""
    with mongo.client() as client:
        db = client.distcrawl
        urls = db.site.distinct("url")
        count = db.site.count_documents({})
        dead = db.site_dead.count_documents({})
        missing = len(site.expected_urls() - set(urls))
        print("\nMongoDB (what the workers' item pipeline stored)")
        print(f"  documents in distcrawl.site: {count} ({len(urls)} distinct URLs)")
        print(f"  missing pages:               {missing}")
        print(f"  dead letters (site_dead):    {dead}")
        url = site.url_for("/page/42")
        queries: list[tuple[str, Any]] = [
            (
                f'db.site.find_one({{"url": "{url}"}}, {{"title": 1, "depth": 1}})',
                lambda: db.site.find_one({"url": url}, {"title": 1, "depth": 1}),
            ),
            (
                'db.site.count_documents({"depth": {"$lte": 2}})',
                lambda: db.site.count_documents({"depth": {"$lte": 2}}),
            ),
            (
                f'db.site.count_documents({{"links": "{url}"}})  # pages linking to it',
                lambda: db.site.count_documents({"links": url}),
            ),
        ]
        print("\nQuerying it with pymongo (db = MongoClient(MONGO_URI).distcrawl):")
        for shown, query in queries:
            print(f">>> {shown}\n{query()}")
    ok = count == len(urls) == len(site.expected_urls()) and missing == 0
    print("OK: one document per page" if ok else "PROBLEM: see the worker logs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
