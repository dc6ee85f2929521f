"""``python -m benchmarks.import_seen``: pages fetched twice when a scrapy-redis crawl is moved
to distcrawl half-way, the scenario of issue 27's finding 7, at full size.

A real scrapy-redis 0.9.1 crawl (the ``baseline`` extra; Scrapy's default concurrency, 16) of
the demo site is stopped by ``CLOSESPIDER_PAGECOUNT`` (a graceful stop), with no item store
(so no ``--rebuild-seen``); ``distcrawl import scrapy-redis --trust-pickle --move`` carries it
over and two distcrawl workers finish it. The site's own log counts every page's fetches.
The bound: no more pages fetched twice than scrapy-redis had in flight at its stop.
Everything runs on 127.0.0.1 in a temporary directory and is stopped by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.spiders import SPIDER_NAME
from distcrawl.cli import main as distcrawl
from distcrawl.demo.site import DemoSite
from distcrawl.testing.redis_server import RedisServer
from distcrawl.testing.workers import Worker, worker_agent

SCRAPY_REDIS = {
    "ADDONS": "{}",
    "SPIDER_MODULES": "benchmarks.spiders",
    "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
    "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
    "SCHEDULER_PERSIST": True,
    "ITEM_PIPELINES": "{}",
}


def run(pages: int, stop_after: int, concurrency: int, workdir: Path) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(RedisServer(directory=workdir / "redis"))
        client = server.client()
        site = DemoSite(pages=pages, log_path=workdir / "site.log").start()
        stack.callback(site.stop)
        client.lpush(f"{SPIDER_NAME}:start_urls", site.url + "/")
        settings = {
            **SCRAPY_REDIS,
            "CONCURRENT_REQUESTS": concurrency,
            "CLOSESPIDER_PAGECOUNT": stop_after,
        }
        before = Worker(
            1,
            redis_url=server.url,
            spider=SPIDER_NAME,
            settings=settings,
            log_path=workdir / "scrapy-redis.log",
        ).start()
        stack.callback(before.stop)
        if before.wait(600) != 0:
            raise SystemExit(before.log()[-3000:])
        os.environ["SCRAPY_SETTINGS_MODULE"] = "distcrawl.settings"
        out = io.StringIO()
        started = time.monotonic()
        with contextlib.redirect_stdout(out):
            code = distcrawl(
                [
                    *("--redis-url", server.url, "import", "scrapy-redis", SPIDER_NAME),
                    *("--json", "-s", "SPIDER_MODULES=tests.import_spider"),
                    *("--trust-pickle", "--move"),
                ]
            )
        import_s = time.monotonic() - started
        if code != 0:
            raise SystemExit(f"import exited {code}: {out.getvalue()}")
        report = json.loads(out.getvalue())
        after = [
            Worker(
                2 + i,
                redis_url=server.url,
                spider=SPIDER_NAME,
                settings={
                    "SPIDER_MODULES": "tests.import_spider",
                    "DISTCRAWL_IDLE_TIMEOUT": 3,
                    "DISTCRAWL_DOMAIN_CONCURRENCY": 64,
                },
                log_path=workdir / f"distcrawl-{i}.log",
            ).start()
            for i in range(2)
        ]
        for worker in after:
            stack.callback(worker.stop)
        for worker in after:
            if worker.wait(900) != 0:
                raise SystemExit(worker.log()[-3000:])
        expected = site.expected_pages()
        lines = [line for line in site.read_log() if line.path in expected and line.status == 200]
        fetches = Counter(line.path for line in lines)
        by = Counter(line.user_agent for line in lines)
        return {
            "pages": pages,
            "scrapy_redis_fetched": by[worker_agent(1)],
            "distcrawl_fetched": by[worker_agent(2)] + by[worker_agent(3)],
            "fetched_twice": sum(n - 1 for n in fetches.values()),
            "missing": len(expected - set(fetches)),
            "in_flight_bound": concurrency,
            "import_seconds": round(import_s, 2),
            "report": {k: report.get(k) for k in ("members", "queued", "dupefilter", "legacy")},
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--stop-after", type=int, default=604)
    parser.add_argument("--concurrency", type=int, default=16, help="scrapy-redis' requests")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="distcrawl-import-") as tmp:
        print(json.dumps(run(args.pages, args.stop_after, args.concurrency, Path(tmp)), indent=2))


if __name__ == "__main__":
    main()
