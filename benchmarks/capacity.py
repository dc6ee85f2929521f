"""How many requests per second the demo site can serve on its own.

Without this number a slow crawl could be the site's fault. The load is like a crawler's:
16 keep-alive connections (CONCURRENT_REQUESTS) fetching random pages, with the request log
on, for a few seconds. The site's CPU use during the load says whether the number is the
site's limit (about one full core: it is single-threaded) or the load generator's.
"""

from __future__ import annotations

import http.client
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.procs import read_cpu_seconds
from distcrawl.demo.site import DemoSite

LOAD_AGENT = "benchmark-load"


def _fetch_loop(url: str, pages: int, deadline: float, seed: int) -> int:
    """One keep-alive connection, requests back to back until the deadline."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    rng = random.Random(seed)
    done = 0
    try:
        while time.monotonic() < deadline:
            conn.request("GET", f"/page/{rng.randrange(pages)}", headers={"User-Agent": LOAD_AGENT})
            response = conn.getresponse()
            response.read()
            done += 1
    finally:
        conn.close()
    return done


def measure_site(
    pages: int, links: int, workdir: Path, seconds: float = 3.0, connections: int = 16
) -> dict[str, Any]:
    """Requests/s of a fresh site under a bounded load, with the site's CPU utilisation."""
    workdir.mkdir(parents=True, exist_ok=True)
    with DemoSite(pages=pages, links=links, log_path=workdir / "site-capacity.log") as site:
        assert site.pid is not None
        _fetch_loop(site.url, pages, time.monotonic() + 0.3, seed=0)  # warm-up
        cpu0 = read_cpu_seconds(site.pid) or 0.0
        start = time.monotonic()
        deadline = start + seconds
        with ThreadPoolExecutor(connections, thread_name_prefix="load") as pool:
            futures = [
                pool.submit(_fetch_loop, site.url, pages, deadline, seed)
                for seed in range(1, connections + 1)
            ]
            done = sum(f.result() for f in futures)
        elapsed = time.monotonic() - start
        cpu = (read_cpu_seconds(site.pid) or cpu0) - cpu0
    return {
        "requests": done,
        "seconds": round(elapsed, 3),
        "requests_per_s": done / elapsed,
        "connections": connections,
        "site_cpu_utilisation": cpu / elapsed,
    }
