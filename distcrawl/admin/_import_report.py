"""What ``distcrawl import scrapy-redis`` did (or, with ``--dry-run``, would do): the counts
an :class:`~distcrawl.admin.importer.Importer` keeps, as text and as JSON.

Beside what the queue and the dupefilter held, a record per step of the import: what became
of the queue's requests (:class:`Requests`), what the dupefilter's fingerprints are and what
was copied of them (:class:`Conversion`), and the seen-set rebuilt from the stored pages
(:class:`Rebuild`). The JSON report is flat: a record's fields are keys of the report's own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Requests:
    """What became of the queue's requests, each counted once: skipped (an earlier run
    handled it), queued, already seen, dead-lettered, or left over the pending cap."""

    already_imported: int = 0
    queued: int = 0
    seen: int = 0
    dead: int = 0
    full: int = 0


@dataclass
class Conversion:
    """Whose fingerprints the dupefilter holds, and so what became of them: the crawl's own
    fingerprinter's are copied into the seen-set, scrapy-redis' kept as the legacy
    seen-set (the workers check scrapy-redis' fingerprint of each new request there)."""

    #: "scrapy-redis" (its own SHA1), "crawl" (this crawl's fingerprinter), "unknown"
    fingerprints: str = "unknown"
    #: queued requests whose scrapy-redis fingerprint is in the dupefilter
    queued_in_dupefilter: int = 0
    converted: int = 0
    #: scrapy-redis fingerprints kept as the crawl's legacy seen-set (none fetched again)
    legacy: int = 0


@dataclass
class Rebuild:
    """``--rebuild-seen``: the URLs of the stored pages marked seen in distcrawl's own
    seen-set (scrapy-redis' own fingerprints do not convert; they are kept as the legacy
    seen-set)."""

    seen_urls: int = 0
    seen_added: int = 0
    #: URLs marked seen whose scrapy-redis fingerprint is in the dupefilter
    stored_in_dupefilter: int = 0


@dataclass
class Report:
    queue_key: str | None = None
    queue_type: str = "none"
    #: requests the queue held
    members: int = 0
    requests: Requests = field(default_factory=Requests)
    #: fingerprints the dupefilter held
    dupefilter: int = 0
    conversion: Conversion = field(default_factory=Conversion)
    rebuild: Rebuild = field(default_factory=Rebuild)
    moved: bool = False
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def not_imported(self) -> int:
        """Requests dead-lettered or over the pending cap: what a ``--move`` keeps the
        queue for, until a run imports them."""
        return self.requests.dead + self.requests.full

    @property
    def unaccounted(self) -> int:
        """Dupefilter fingerprints neither queued nor matched to a stored page: pages
        fetched, or lost in flight; the workers fetch them again if a link leads there,
        unless they were kept as the legacy seen-set (then they are never fetched)."""
        if self.conversion.fingerprints == "crawl":
            return 0
        matched = self.conversion.queued_in_dupefilter + self.rebuild.stored_in_dupefilter
        return max(0, self.dupefilter - matched)

    def as_dict(self) -> dict[str, Any]:
        """Flat, in the order of the fields: a record's fields are keys of the report's."""
        flat: dict[str, Any] = {}
        for name, value in asdict(self).items():
            flat.update(value if isinstance(value, dict) else {name: value})
        flat["unaccounted"] = self.unaccounted
        return flat

    def text(self) -> str:
        verb = "would import" if self.dry_run else "imported"
        done, rebuild = self.requests, self.rebuild
        lines = [
            f"queue {self.queue_key} ({self.queue_type}): {self.members} requests; {verb}: "
            f"{done.queued} queued, {done.seen} already seen, {done.dead} dead-lettered, "
            f"{done.already_imported} skipped (imported before), {done.full} over the "
            "pending cap",
            f"dupefilter: {self.dupefilter} fingerprints ({self.conversion.fingerprints}); "
            f"{self.conversion.converted} copied to the seen-set, {self.conversion.legacy} "
            "kept as the legacy seen-set",
        ]
        if rebuild.seen_urls:
            lines.append(
                f"seen-set rebuilt from {rebuild.seen_urls} stored URLs: {rebuild.seen_added} "
                f"new, {rebuild.stored_in_dupefilter} of them in the dupefilter"
            )
        if self.unaccounted and not self.dry_run and self.conversion.legacy:
            lines.append(
                f"{self.unaccounted} dupefilter fingerprints match no queued or stored URL: "
                "pages scrapy-redis fetched (or lost in flight, if it was not stopped "
                "gracefully), not fetched again (the legacy seen-set)"
            )
        elif self.unaccounted and not self.dry_run:
            lines.append(
                f"{self.unaccounted} dupefilter fingerprints match no queued or stored URL: "
                "those pages are fetched again if a link leads there"
            )
        return "\n".join(lines + [f"note: {n}" for n in self.notes])
