"""Crawl results from the demo site's own request log: the ground truth of every benchmark.

The site logs every request with its time, status and User-Agent, and each worker has its
own User-Agent, so what was fetched, how often, how fast and by whom does not depend on
anything the crawler under test reports about itself.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from distcrawl.demo.site import LogLine


@dataclass
class FetchStats:
    """Pages fetched during one crawl, as the site saw them."""

    pages: int = 0
    unique: int = 0
    expected: int = 0
    duplicates: int = 0
    missing: int = 0
    first: float = 0.0
    last: float = 0.0
    first_home: float | None = None
    first_any: float | None = None
    per_agent: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return max(self.last - self.first, 1e-9)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.seconds if self.pages > 1 else 0.0


def fetch_stats(log: list[LogLine], expected: set[str]) -> FetchStats:
    """Pages/s counts HTML pages with status 200 between the first and the last such fetch.

    robots.txt, the PDF files and redirects are not pages; they are counted in ``statuses``
    only. A duplicate is any second 200 fetch of the same page, whoever fetched it.
    """
    pages = [ln for ln in log if ln.path in expected and ln.status == 200]
    counts = Counter(ln.path for ln in pages)
    homes = [ln.time for ln in pages if ln.path == "/"]
    stats = FetchStats(
        pages=len(pages),
        unique=len(counts),
        expected=len(expected),
        duplicates=sum(n - 1 for n in counts.values()),
        missing=len(expected - set(counts)),
        first_home=min(homes) if homes else None,
        first_any=min((ln.time for ln in log), default=None),
        per_agent=dict(Counter(ln.user_agent for ln in pages)),
        statuses=dict(Counter(str(ln.status) for ln in log)),
    )
    if pages:
        stats.first = min(ln.time for ln in pages)
        stats.last = max(ln.time for ln in pages)
    return stats


def count_lines(path: str) -> int:
    """Cheap progress indicator while a crawl runs (the log is line-buffered)."""
    try:
        with open(path, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 16), b""))
    except FileNotFoundError:
        return 0
