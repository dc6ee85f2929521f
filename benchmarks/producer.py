"""``Producer.push_many`` throughput: ``python -m benchmarks.producer [--urls 100000]``.

Starts its own redis-server on 127.0.0.1, then pushes ``--urls`` distinct URLs over 1,000
hosts with one :class:`distcrawl.Producer` (target "queue", the bundled project's settings:
the ``site`` spider's hook, Scrapy's fingerprinter, msgpack, the pending cap off), and
reports URLs per second end to end: the checks a worker makes, the fingerprints, the
encoding and the pipelined commits, with Redis' own CPU time beside it. A second pass pushes
the same URLs again (every one already seen). Target (issue 16): 20,000 URLs/s.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from typing import Any

from scrapy.settings import Settings

from distcrawl.producer import Outcome, Producer
from distcrawl.testing.redis_server import RedisServer

TARGET = 20_000


def urls(count: int) -> list[str]:
    return [f"http://h{i % 1000}.test/page/{i}" for i in range(count)]


def redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def timed_push(producer: Producer, entries: list[str], client: Any) -> dict[str, Any]:
    cpu_before = redis_cpu(client)
    own_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    results = producer.push_many(entries)
    seconds = time.perf_counter() - started
    own_after = resource.getrusage(resource.RUSAGE_SELF)
    outcomes: dict[str, int] = {}
    for result in results:
        outcomes[result.outcome.value] = outcomes.get(result.outcome.value, 0) + 1
    own = (own_after.ru_utime - own_before.ru_utime) + (own_after.ru_stime - own_before.ru_stime)
    return {
        "urls": len(entries),
        "seconds": round(seconds, 3),
        "urls_per_second": round(len(entries) / seconds),
        "producer_cpu_seconds": round(own, 2),
        "redis_cpu_seconds": round(redis_cpu(client) - cpu_before, 2),
        "outcomes": outcomes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.producer", description=__doc__)
    parser.add_argument("--urls", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500, help="DISTCRAWL_PUSH_BATCH_SIZE")
    args = parser.parse_args(argv)
    settings = Settings()
    settings.setmodule("distcrawl.settings", priority="project")
    settings.set("DISTCRAWL_PUSH_BATCH_SIZE", args.batch, priority="cmdline")
    entries = urls(args.urls)
    with tempfile.TemporaryDirectory(prefix="distcrawl-bench-") as directory:
        server = RedisServer(directory=directory).start()
        try:
            client = server.client()
            with Producer.from_url(server.url, "site", settings) as producer:
                new = timed_push(producer, entries, client)
                assert new["outcomes"] == {Outcome.QUEUED.value: args.urls}, new
                seen = timed_push(producer, entries, client)
                assert seen["outcomes"] == {Outcome.SEEN.value: args.urls}, seen
            memory = int(client.info("memory")["used_memory"])
            client.close()
        finally:
            server.stop()
    report = {"batch": args.batch, "new": new, "again_seen": seen, "redis_used_memory": memory}
    print(json.dumps(report, indent=2))
    verdict = "meets" if new["urls_per_second"] >= TARGET else "misses"
    print(
        f"push_many: {new['urls_per_second']:,} new URLs/s ({verdict} {TARGET:,}/s), "
        f"{seen['urls_per_second']:,} URLs/s already seen"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
