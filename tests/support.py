"""Helpers shared by the worker-process tests (fixtures live in conftest.py)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from distcrawl.demo.site import DemoSite


def wait_until(predicate: Callable[[], object], timeout: float, step: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds have passed (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def page_fetches(site: DemoSite, *, ok_only: bool = True) -> Counter[str]:
    """Fetches per page from the site's own log; with ok_only=False also those whose client
    went away (status 499)."""
    expected = site.expected_pages()
    return Counter(
        line.path
        for line in site.read_log()
        if line.path in expected and (line.status == 200 or not ok_only)
    )
