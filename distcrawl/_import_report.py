"""What ``distcrawl import scrapy-redis`` did (or, with ``--dry-run``, would do): the counts
an :class:`~distcrawl.importer.Importer` keeps, as text and as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Report:
    queue_key: str | None = None
    queue_type: str = "none"
    members: int = 0
    already_imported: int = 0
    queued: int = 0
    seen: int = 0
    dead: int = 0
    full: int = 0
    dupefilter: int = 0
    #: "scrapy-redis" (its own SHA1), "crawl" (this crawl's fingerprinter), "unknown"
    fingerprints: str = "unknown"
    #: queued requests whose scrapy-redis fingerprint is in the dupefilter
    queued_in_dupefilter: int = 0
    converted: int = 0
    seen_urls: int = 0
    seen_added: int = 0
    #: URLs marked seen whose scrapy-redis fingerprint is in the dupefilter
    stored_in_dupefilter: int = 0
    moved: bool = False
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def unaccounted(self) -> int:
        """Dupefilter fingerprints neither queued nor matched to a stored page: pages
        (fetched, or lost in flight) that workers fetch again if a link leads there."""
        if self.fingerprints == "crawl":
            return 0
        return max(0, self.dupefilter - self.queued_in_dupefilter - self.stored_in_dupefilter)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "unaccounted": self.unaccounted}

    def text(self) -> str:
        verb = "would import" if self.dry_run else "imported"
        lines = [
            f"queue {self.queue_key} ({self.queue_type}): {self.members} requests; {verb}: "
            f"{self.queued} queued, {self.seen} already seen, {self.dead} dead-lettered, "
            f"{self.already_imported} skipped (imported before), {self.full} over the "
            "pending cap",
            f"dupefilter: {self.dupefilter} fingerprints ({self.fingerprints}); "
            f"{self.converted} copied to the seen-set",
        ]
        if self.seen_urls:
            lines.append(
                f"seen-set rebuilt from {self.seen_urls} stored URLs: {self.seen_added} new, "
                f"{self.stored_in_dupefilter} of them in the dupefilter"
            )
        if self.unaccounted and not self.dry_run:
            lines.append(
                f"{self.unaccounted} dupefilter fingerprints match no queued or stored URL: "
                "those pages are fetched again if a link leads there"
            )
        return "\n".join(lines + [f"note: {n}" for n in self.notes])
