"""``distcrawl mongo replay``: a spill file written to MongoDB later, in batches, exactly as
the pipeline would have written it (upserts by ``_id``: replacements, or the updates the
records name, whose tracking updates are guarded; so replaying twice is harmless)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from distcrawl.mongo._documents import Doc
from distcrawl.mongo._spill import SpillFile, read_spill, record_doc
from distcrawl.mongo._writer import MongoWriter


@dataclass
class ReplayResult:
    """What a replay did: the files it read, and what became of their documents."""

    files: list[str] = field(default_factory=list)
    #: documents by what became of them, as :meth:`MongoWriter.write` says (``FlushResult``):
    #: "upserted" (new), "updated", "dead" (dead-lettered), "spilled" (not even that: in
    #: ``<file>.rejected.jsonl``), "skipped" (a tracking update already recorded, as in a file
    #: replayed twice: nothing to write)
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def documents(self) -> int:
        return self.outcomes.total()

    def count(self, outcome: str) -> int:
        """How many documents had ``outcome`` (as ``FlushResult.count``)."""
        return self.outcomes[outcome]


def replay(
    paths: Iterable[str | os.PathLike[str]],
    uri: str,
    *,
    database: str | None = None,
    batch_size: int = 500,
    timeout: float = 5.0,
) -> ReplayResult:
    """Write the documents of spill files into MongoDB (upserts by ``_id``: replaying a
    file twice changes nothing). Documents MongoDB refuses are dead-lettered again; what
    cannot even be dead-lettered goes to ``<file>.rejected.jsonl``. Raises on a failure
    of a whole batch (MongoDB unreachable): nothing is lost, run it again."""
    result = ReplayResult()
    writers: dict[str, MongoWriter] = {}
    try:
        for path in paths:
            spill = SpillFile(f"{path}.rejected.jsonl")
            batches: dict[str, list[Doc]] = {}
            for _number, record in read_spill(path):
                name = database or record["database"]
                batch = batches.setdefault(name, [])
                batch.append(record_doc(record))
                if len(batch) >= batch_size:
                    _replay_batch(writers, uri, name, batch, spill, timeout, result)
                    batches[name] = []
            for name, batch in batches.items():
                if batch:
                    _replay_batch(writers, uri, name, batch, spill, timeout, result)
            result.files.append(str(path))
    finally:
        for writer in writers.values():
            writer.close()
    return result


def _replay_batch(
    writers: dict[str, MongoWriter],
    uri: str,
    database: str,
    batch: list[Doc],
    spill: SpillFile,
    timeout: float,
    result: ReplayResult,
) -> None:
    writer = writers.get(database)
    if writer is None:
        writer = writers[database] = MongoWriter(
            uri, database, spill=spill, source="replay", timeout=timeout
        )
    writer.spill_file = spill
    result.outcomes.update(writer.write(batch).outcomes)
