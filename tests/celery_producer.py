"""A producer process for tests/test_celery.py: ``push.delay()`` for each URL of a file.

    python -m tests.celery_producer SPIDER PRIORITY URLS_FILE WAIT_SECONDS

It imports the example Celery app (CELERY_BROKER_URL from the environment), sends one
``distcrawl.push`` per line, prints ``{"sent": N}``, then, when WAIT_SECONDS > 0, waits
(bounded) for every task's result and prints them as one JSON list.
"""

from __future__ import annotations

import json
import sys
import time

from distcrawl.celery import push
from examples.celery_app import app


def main(argv: list[str]) -> int:
    spider, priority, path, wait = argv[1], int(argv[2]), argv[3], float(argv[4])
    with open(path, encoding="utf-8") as handle:
        urls = handle.read().split()
    sent = [push.delay(spider, url, priority=priority) for url in urls]
    print(json.dumps({"sent": len(sent)}), flush=True)
    if wait <= 0:
        return 0
    deadline = time.monotonic() + wait
    results = []
    for result in sent:
        left = max(0.1, deadline - time.monotonic())
        try:
            results.append(result.get(timeout=left, propagate=False, interval=0.05))
        except Exception as exc:  # a timeout: reported, the test fails on it
            results.append({"error": repr(exc)})
    print(json.dumps(results, default=repr), flush=True)
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
