"""The adaptive revisit schedule (distcrawl/config/recrawl.py) on a virtual clock: no sleeping."""

from __future__ import annotations

import itertools
import math

import pytest

from distcrawl.config.recrawl import DAY, Outcome, RecrawlPolicy, first_fetch, revisit

POLICY = RecrawlPolicy(interval=3600.0, min_interval=600.0, max_interval=7 * DAY)


def test_the_first_fetch_is_due_one_interval_later():
    state = first_fetch(POLICY, now=1000.0)
    assert (state.due, state.interval, state.fetch_count, state.change_count) == (
        4600.0,
        3600,
        1,
        0,
    )
    assert state.first_seen == state.last_fetched == state.last_changed == 1000.0


def test_the_interval_grows_while_unchanged_up_to_the_max():
    state, now, intervals = first_fetch(POLICY, 0.0), 0.0, []
    for _ in range(40):
        now = state.due
        state = revisit(POLICY, state, Outcome.UNCHANGED, now)
        intervals.append(state.interval)
    assert intervals[0] == pytest.approx(3600 * 1.4)
    assert all(b >= a for a, b in itertools.pairwise(intervals))  # never shrinks
    assert intervals[-1] == POLICY.max_interval  # and stops at the max
    assert state.fetch_count == 41 and state.change_count == 0 and state.last_changed == 0.0


def test_the_interval_shrinks_on_change_down_to_the_min():
    state, now = first_fetch(POLICY, 0.0), 0.0
    for _ in range(40):
        now = state.due
        state = revisit(POLICY, state, Outcome.CHANGED, now)
    assert state.interval == POLICY.min_interval
    assert state.change_count == 40 and state.last_changed == now
    once = revisit(POLICY, first_fetch(POLICY, 0.0), Outcome.CHANGED, 10.0)
    assert once.interval == pytest.approx(3600 * 0.8) and once.due == pytest.approx(10 + 2880)


def test_a_page_that_changes_often_is_fetched_more_often_than_one_that_never_does():
    often, never = first_fetch(POLICY, 0.0), first_fetch(POLICY, 0.0)
    for _ in range(10):
        often = revisit(POLICY, often, Outcome.CHANGED, often.due)
        never = revisit(POLICY, never, Outcome.UNCHANGED, never.due)
    assert often.interval < 3600 < never.interval
    assert often.due < never.due


def test_errors_keep_the_interval_and_gone_pages_may_never_come_back():
    state = revisit(POLICY, first_fetch(POLICY, 0.0), Outcome.UNCHANGED, 3600.0)
    failed = revisit(POLICY, state, Outcome.ERROR, 9000.0)
    assert failed.interval == state.interval and failed.due == 9000.0 + POLICY.error_interval
    assert failed.fetch_count == state.fetch_count + 1
    gone = revisit(POLICY, state, Outcome.GONE, 9000.0)
    assert gone.due == 9000.0 + 30 * DAY
    never = RecrawlPolicy(gone_interval=None)
    assert revisit(never, first_fetch(never, 0.0), Outcome.GONE, 5.0).due == math.inf


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"interval": 10.0, "min_interval": 60.0}, r"min \(60.0\) <= interval \(10.0\)"),
        ({"interval": 400 * DAY}, rf"interval \({400 * DAY}\) <= max"),
        ({"min_interval": 0.0}, r"0 < min \(0.0\)"),
        ({"inc_rate": -0.1}, "inc_rate -0.1 must be >= 0"),
        ({"dec_rate": 1.0}, r"dec_rate in \[0, 1\)"),
        ({"error_interval": 0.0}, "error_interval and gone_interval must be positive"),
    ],
)
def test_policies_that_break_the_bounds_are_refused(kwargs, why):
    with pytest.raises(ValueError, match=why):
        RecrawlPolicy(**kwargs)
