"""Scheduler variants that worker processes load in crash tests (``-s SCHEDULER=tests.hooks.X``)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from distcrawl.scheduler import Scheduler

#: exit status of a worker ended by ExitAfterCommit
EXIT_STATUS = 3


class ExitAfterCommit(Scheduler):
    """Ends the process with ``os._exit`` (no close, no flush: as abrupt as SIGKILL) right
    after the k-th commit that stored discovered requests returned from Redis, k being the
    setting ``TEST_EXIT_AFTER_COMMIT``: a crash at a chosen point between two commits."""

    def _connect(self) -> None:
        # the Frontier is made on the Redis thread once connected (Scheduler._connect)
        super()._connect()
        target = self.crawler.settings.getint("TEST_EXIT_AFTER_COMMIT")
        frontier = self.frontier
        assert frontier is not None
        commit_op = frontier.commit_op
        done = 0

        # the Op, not Frontier.commit: a batch pipelines its commit (batch.Runner), and both
        # paths read the reply with the Op's parse
        def commit_op_then_exit(acks: Any, entries: Any, *args: Any, **kwargs: Any) -> Any:
            op = commit_op(acks, entries, *args, **kwargs)

            def parse(reply: Any) -> Any:
                nonlocal done
                result = op.parse(reply)
                if any(e.kind == "r" for e in entries):
                    done += 1
                    if done == target:
                        os._exit(EXIT_STATUS)
                return result

            return dataclasses.replace(op, parse=parse)

        frontier.commit_op = commit_op_then_exit  # type: ignore[method-assign]


class ExitAfterClaim(Scheduler):
    """Ends the process with ``os._exit`` right after the k-th claim of start_urls entries
    that returned some (``TEST_EXIT_AFTER_CLAIM``): it dies holding claims it never stored."""

    def _connect(self) -> None:
        super()._connect()
        target = self.crawler.settings.getint("TEST_EXIT_AFTER_CLAIM")
        frontier = self.frontier
        assert frontier is not None
        claim_op = frontier.claim_op
        done = 0

        # the Op, not Frontier.claim_start_urls: a batch pipelines its claim (batch.Runner)
        def claim_op_then_exit(count: int, **kwargs: Any) -> Any:
            op = claim_op(count, **kwargs)

            def parse(reply: Any) -> Any:
                nonlocal done
                entries = op.parse(reply)
                if entries:
                    done += 1
                    if done == target:
                        os._exit(EXIT_STATUS)
                return entries

            return dataclasses.replace(op, parse=parse)

        frontier.claim_op = claim_op_then_exit  # type: ignore[method-assign]


class SlowPipeline:
    """Holds every item for ``TEST_PIPELINE_DELAY`` seconds, as an item pipeline that batches
    its writes does (distcrawl's MongoPipeline waits up to DISTCRAWL_MONGO_FLUSH_INTERVAL):
    the request stays unacknowledged meanwhile, though its response has long arrived."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    @classmethod
    def from_crawler(cls, crawler: Any) -> SlowPipeline:
        return cls(crawler.settings.getfloat("TEST_PIPELINE_DELAY"))

    async def process_item(self, item: Any) -> Any:
        from scrapy.utils.defer import maybe_deferred_to_future
        from twisted.internet import reactor, task

        await maybe_deferred_to_future(task.deferLater(reactor, self.delay))
        return item
