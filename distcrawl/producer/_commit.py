"""How a :class:`~distcrawl.producer.Producer` stores the requests it made: through the
frontier's commit script, several batches per pipeline (the workers' sender, packed by hand
for a single server);
with DISTCRAWL_SHARDS above 1, each request in the shard of its URL's site."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from distcrawl.codec.entries import Made
from distcrawl.codec.politeness import politeness
from distcrawl.config import DistcrawlConfig
from distcrawl.engine._batch_send import pipelined
from distcrawl.model.frontier import Frontier
from distcrawl.model.records import Entry, Politeness
from distcrawl.model.shards import COMMIT_CALL_MAX, shard_of_url
from distcrawl.producer._results import Outcome, PushResult

#: how long a pending cap published by the workers (``<ns>:settings``) is trusted
CAP_TTL = 5.0
#: entries of the commits sent in one pipeline by push_many (in batches of
#: DISTCRAWL_PUSH_BATCH_SIZE): one round trip each, without holding Redis for long at a time
PIPELINE_ENTRIES = 4000


class Committer:
    """A producer's commits: made entries stored in batches of DISTCRAWL_PUSH_BATCH_SIZE,
    several batches per pipeline, a long push's pipelines sent from a thread of its own
    while the caller makes the next entries. ``frontier`` gives the producer's frontier
    (made on first use, made again after the producer is closed), ``parts`` the Frontier of
    each of the crawl's shards (``[frontier]`` with one shard)."""

    def __init__(
        self,
        config: DistcrawlConfig,
        frontier: Callable[[], Frontier],
        parts: Callable[[], list[Frontier]] | None = None,
    ) -> None:
        self.config = config
        self._frontier = frontier
        self._parts = parts or (lambda: [self._frontier()])
        self._cap: tuple[float, int] | None = None
        self._sending: ThreadPoolExecutor | None = None

    @property
    def frontier(self) -> Frontier:
        return self._frontier()

    def close(self) -> None:
        if self._sending is not None:
            self._sending.shutdown(wait=True)
            self._sending = None

    def store(self, made: Iterable[Made | PushResult]) -> list[PushResult]:
        """Commit the made entries in batches of DISTCRAWL_PUSH_BATCH_SIZE, several batches
        per pipeline; a result per input, in order (refusals are passed through)."""
        results: list[PushResult | None] = []
        batch: list[tuple[int, str, Entry]] = []
        depth = max(1, PIPELINE_ENTRIES // self.config.push_batch_size)
        pending: list[list[tuple[int, str, Entry]]] = []
        sending: Future[None] | None = None
        try:
            for one in made:
                at = len(results)
                if isinstance(one, PushResult):
                    results.append(one)
                    continue
                results.append(None)
                batch.append((at, one.url, one.entry))
                if len(batch) >= self.config.push_batch_size:
                    pending.append(batch)
                    batch = []
                    if len(pending) >= depth:
                        # Redis runs these scripts while this thread prepares the next ones
                        if sending is not None:
                            sending.result()
                        sending = self._sender().submit(self._commit, pending, results)
                        pending = []
        finally:
            if sending is not None:
                sending.result()
        if batch:
            pending.append(batch)
        if pending:
            self._commit(pending, results)
        return [r for r in results if r is not None]

    def _sender(self) -> ThreadPoolExecutor:
        """The thread that sends a long push_many's pipelines (made on first need)."""
        if self._sending is None:
            self._sending = ThreadPoolExecutor(1, thread_name_prefix="distcrawl-push")
        return self._sending

    def _politeness(self) -> Politeness:
        """The caps of the producer's commits: the crawl's pending cap (the setting, else
        what the workers published) and no per-slot cap (start URLs are not held there)."""
        cap = self.config.max_pending
        if cap is None:
            now = time.monotonic()
            if self._cap is None or now - self._cap[0] > CAP_TTL:
                published = self.frontier.client.hget(self.frontier.keys.settings, "max_pending")
                self._cap = (now, int(published or 0))
            cap = self._cap[1]
        return Politeness(
            max_pending=cap or 0,
            max_pending_per_slot=0,
            keep_priority=politeness(self.config).keep_priority,
        )

    def _commit(
        self, batches: Sequence[Sequence[tuple[int, str, Entry]]], results: list[PushResult | None]
    ) -> None:
        """One commit per batch and shard: a batch's entries grouped by the shard of their
        URL (all in one with one shard), in calls of at most COMMIT_CALL_MAX entries (a
        bounded time in Redis each), every call in one pipeline; each entry's outcome read
        at its position in its call and reported at its own."""
        parts = self._parts()
        politeness = self._politeness()
        for part in parts:
            part.politeness = politeness
        commits: list[tuple[Frontier, list[tuple[int, str, Entry]]]] = []
        for batch in batches:
            by_shard: dict[int, list[tuple[int, str, Entry]]] = {}
            for item in batch:
                by_shard.setdefault(shard_of_url(item[1], len(parts)), []).append(item)
            for shard, group in sorted(by_shard.items()):
                commits += [
                    (parts[shard], group[at : at + COMMIT_CALL_MAX])
                    for at in range(0, len(group), COMMIT_CALL_MAX)
                ]
        if parts[0].bloom is not None:
            # the Bloom filter may have to read or grow its state around each commit
            replies = [
                part.commit([], [e for _, _, e in group], positions=True) for part, group in commits
            ]
        else:
            replies = self._pipelined(
                [
                    part.commit_op([], [e for _, _, e in group], positions=True)
                    for part, group in commits
                ]
            )
        for (_, group), reply in zip(commits, replies, strict=True):
            dropped = set(reply.not_stored)
            for i, (at, url, _) in enumerate(group):
                if i in dropped:
                    results[at] = PushResult(Outcome.SEEN, url)
                elif -i - 1 in dropped:
                    results[at] = PushResult(Outcome.FULL, url, "DISTCRAWL_MAX_PENDING reached")
                else:
                    results[at] = PushResult(Outcome.QUEUED, url)

    def _pipelined(self, ops: list[Any]) -> list[Any]:
        """Commit ops in one pipeline, by the workers' sender (_batch_send.py), packed by
        hand for a single server: a commit of 500 entries has 3,000 arguments."""
        replies, _ = pipelined(self.frontier, ops, packed=True)
        out = []
        for op, reply in zip(ops, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            out.append(op.parse(reply))
        return out
