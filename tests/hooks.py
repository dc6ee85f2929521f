"""Scheduler variants that worker processes load in crash tests (``-s SCHEDULER=tests.hooks.X``)."""

from __future__ import annotations

import os
from typing import Any

from distcrawl.scheduler import Scheduler

#: exit status of a worker ended by ExitAfterCommit
EXIT_STATUS = 3


class ExitAfterCommit(Scheduler):
    """Ends the process with ``os._exit`` (no close, no flush: as abrupt as SIGKILL) right
    after the k-th commit that stored discovered requests returned from Redis, k being the
    setting ``TEST_EXIT_AFTER_COMMIT``: a crash at a chosen point between two commits."""

    def open(self, spider: Any) -> Any:
        opened = super().open(spider)
        target = self.crawler.settings.getint("TEST_EXIT_AFTER_COMMIT")
        frontier = self.frontier
        assert frontier is not None
        commit = frontier.commit
        done = 0

        def commit_then_exit(acks: Any, entries: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal done
            result = commit(acks, entries, *args, **kwargs)
            if any(e.kind == "r" for e in entries):
                done += 1
                if done == target:
                    os._exit(EXIT_STATUS)
            return result

        frontier.commit = commit_then_exit  # type: ignore[method-assign]
        return opened
