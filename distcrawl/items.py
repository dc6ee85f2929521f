"""Items produced by the bundled ``site`` spider."""

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
    url: str
    fetched_at: float
    status: int
    changed: bool
    first: bool
    signature: str | None = None
