"""Items produced by the bundled ``site`` spider, and the one distcrawl itself produces."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PageItem:
    url: str
    status: int
    title: str | None = None
    description: str | None = None
    text: str = ""
    links: list[str] = field(default_factory=list)
    depth: int = 0
    fetched_at: float = 0.0
    download_latency: float | None = None


@dataclass
class PageFetch:
    """One fetch of a page while revisits are on (DISTCRAWL_RECRAWL_INTERVAL), emitted by
    distcrawl after the page's own items, or instead of them when the page is unchanged.

    It exists so that a page's history (when it was first seen, last fetched, last changed,
    how often each) can be kept without the spider's items knowing about revisits: an
    unchanged page yields no item, yet its fetch still counts. The MongoDB pipeline does not
    store it as a document of its own: it updates the page's document (the one keyed by the
    URL's request fingerprint) with the tracking fields (``distcrawl.mongo._tracking``).
    """

    url: str
    #: when the response arrived, in seconds since the epoch
    fetched_at: float
    #: the HTTP status (304 for a conditional request the server answered "not modified")
    status: int
    #: the content differs from the previous fetch (always True on the first)
    changed: bool
    #: no earlier fetch of this URL was known
    first: bool
    #: hex content signature; None for a 304, which carries no content
    signature: str | None = None
