"""What the MongoDB pipeline tells the operator: its stats (``distcrawl/mongo/*``) and the log
lines that say where items went.

Kept apart from :mod:`distcrawl.pipelines` so that the pipeline reads as the path of a batch
(buffer, write, retry, spill) and the wording of each outcome, which operators grep their
logs for, stays in one place."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from distcrawl.mongo import DEAD_SUFFIX, Doc, FlushResult, MongoConfig, SpillFile, error_reason
from distcrawl.mongo import auth_refusal as mongo_auth_refusal

if TYPE_CHECKING:
    from pathlib import Path

    from scrapy.crawler import Crawler
    from twisted.python.failure import Failure

#: the pipeline's logger: these records were always "distcrawl.pipelines"
logger = logging.getLogger("distcrawl.pipelines")

STATS = "distcrawl/mongo"


class PipelineReport:
    """The pipeline's counts, kept twice: in the crawl's stats (which the stats collector may
    discard at close) and here, for the summary line the pipeline logs as it closes."""

    def __init__(self, crawler: Crawler, config: MongoConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.counts = {
            "written": 0,
            "upserted": 0,
            "updated": 0,
            "failed": 0,
            "spilled": 0,
            "fetches/recorded": 0,
            "fetches/skipped": 0,
        }

    def inc(self, name: str, value: int = 1) -> None:
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value(f"{STATS}/{name}", value)

    def max(self, name: str, value: int) -> None:
        if self.crawler.stats is not None:
            self.crawler.stats.max_value(f"{STATS}/{name}", value)

    def count(self, result: FlushResult, docs: Sequence[Doc]) -> None:
        """Items stored count as ``written``; a PageFetch's tracking update, which stores no
        item, counts apart (``fetches/recorded``, or ``fetches/skipped`` when written already),
        so that ``written`` still says how many items reached MongoDB."""
        stored = {"upserted": 0, "updated": 0, "fetches/recorded": 0, "fetches/skipped": 0}
        for outcome, doc in zip(result.outcomes, docs, strict=True):
            if outcome in ("upserted", "updated"):
                stored["fetches/recorded" if doc.tracking else outcome] += 1
            elif outcome == "skipped":
                stored["fetches/skipped"] += 1
        upserted, updated = stored["upserted"], stored["updated"]
        for name, value in (
            ("written", upserted + updated),
            ("upserted", upserted),
            ("updated", updated),
            ("failed", result.count("dead")),
            ("spilled", result.count("spilled")),
            ("fetches/recorded", stored["fetches/recorded"]),
            ("fetches/skipped", stored["fetches/skipped"]),
        ):
            self.counts[name] += value
            if value:
                self.inc(name, value)

    def flushed(self, result: FlushResult, docs: Sequence[Doc], elapsed: float) -> None:
        """A batch written: its timing and outcomes, and a warning for each item MongoDB
        refused, since a dead letter is otherwise only seen by whoever reads the collection."""
        self.inc("flushes")
        self.inc("flush_time_ms", round(elapsed * 1000))
        self.max("flush_time_max_ms", round(elapsed * 1000))
        self.max("batch_max", len(docs))
        self.count(result, docs)
        for i, reason in sorted(result.reasons.items()):
            doc = docs[i]
            logger.warning(
                "MongoDB: an item of %s (key %r) was dead-lettered to %s.%s%s: %s",
                doc.item_type,
                doc.key,
                self.config.database,
                doc.collection,
                DEAD_SUFFIX,
                reason,
            )

    def spilled(self, count: int, path: Path) -> None:
        """Items in the spill file are in no database: the line says how to get them there."""
        logger.error(
            "MongoDB at %s was unreachable at close: %d items are in the spill file %s. "
            'Write them to MongoDB with: distcrawl mongo replay %s --mongo-uri "$MONGO_URI"',
            self.config.shown_uri,
            count,
            path.resolve(),
            path.resolve(),
        )

    def unreachable_at_open(self, failure: Failure) -> None:
        exc = failure.value
        assert exc is not None  # a Failure is only made from an exception
        logger.warning(
            "MongoDB at %s is not %s yet (%s); items will wait for it",
            self.config.shown_uri,
            "usable" if mongo_auth_refusal(exc) else "reachable",
            error_reason(exc, self.config.uri or ""),
        )

    def closed(self, spill: SpillFile | None) -> None:
        """The summary line; and again where the spilled items are, since a worker's last
        lines are the ones an operator reads."""
        counts = self.counts
        logger.info(
            "MongoDB: %d items written to %s (%d new, %d updated), %d dead-lettered, %d spilled",
            counts["written"],
            self.config.database,
            counts["upserted"],
            counts["updated"],
            counts["failed"],
            counts["spilled"],
        )
        if counts["fetches/recorded"] or counts["fetches/skipped"]:
            logger.info(
                "MongoDB: %d page fetches recorded on their pages' documents (%d already were)",
                counts["fetches/recorded"],
                counts["fetches/skipped"],
            )
        if counts["spilled"] and spill is not None:
            self.spilled(spill.records, spill.path)
