"""One parser of the queue member's layout (queue_entry.py), for the worker, doctor and
``distcrawl migrate --shards``: what the real writers produce parses, anything else is
refused with a reason, the same reason everywhere."""

from __future__ import annotations

import random
import re

import pytest
from scrapy.settings import Settings

from distcrawl.admin.doctor import record_problem
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import (
    MAX_SLOT_BYTES,
    QueueEntryError,
    entry_problem,
    make_entry,
    parse_entry,
    renumbered,
    split_member,
)
from distcrawl.model.records import Entry, EntryKind
from distcrawl.producer import Producer

REASONS = {
    "no \\0 after the slot",
    "empty slot",
    f"slot longer than {MAX_SLOT_BYTES} bytes",
    "slot is not valid UTF-8",
    "fewer than 10 bytes after the slot",
}

MALFORMED = [
    (b"", "no \\0 after the slot"),
    (b"no separator at all", "no \\0 after the slot"),
    (b"\0" + bytes(10), "empty slot"),
    (b"\0", "empty slot"),
    (b"x" * 256 + b"\0" + bytes(10), "slot longer than 255 bytes"),
    (b"\xff\xfe\0" + bytes(10), "slot is not valid UTF-8"),
    (b"\xed\xa0\x80\0" + bytes(10), "slot is not valid UTF-8"),  # a lone surrogate
    (b"a.test\0", "fewer than 10 bytes after the slot"),
    (b"a.test\0" + bytes(9), "fewer than 10 bytes after the slot"),
]


def _agree(member: bytes) -> str | None:
    """The one verdict of every entry point on ``member`` (they must not differ)."""
    why = entry_problem(member)
    try:
        parts = split_member(member)
    except QueueEntryError as exc:
        assert str(exc) == why
        with pytest.raises(
            QueueEntryError, match=f"^{re.escape(f'malformed queue entry: {why}')}$"
        ):
            parse_entry(member)
        assert record_problem(bytes(8) + member) == why
        return why
    assert why is None
    leased = parse_entry(member)
    assert (leased.slot, leased.priority, leased.id, leased.payload) == (
        parts.slot,
        parts.priority,
        parts.id,
        parts.payload,
    )
    assert record_problem(bytes(8) + member) is None
    return None


@pytest.mark.parametrize(("member", "reason"), MALFORMED)
def test_a_malformed_member_is_refused_with_its_reason(member, reason):
    assert _agree(member) == reason


def test_mutated_members_are_parsed_or_refused_alike_by_every_entry_point():
    """Truncations, byte flips and insertions of well-formed members (a bounded, seeded
    enumeration): each is accepted and split consistently, or refused with a known reason."""
    rng = random.Random(28)
    seeds = [
        make_entry("a.test", 0, 1, b"payload"),
        make_entry("ünï.test", -5, 2**40, b""),
        make_entry("x" * MAX_SLOT_BYTES, 2**31 - 1, 7, b"\0\0\0"),
    ]
    seen_reasons = set()
    for seed in seeds:
        variants = [seed[:n] for n in range(len(seed) + 1)]
        for _ in range(300):
            member = bytearray(seed)
            at = rng.randrange(len(member) + 1)
            if rng.random() < 0.5 and at < len(member):
                member[at] = rng.choice([0, 0x80, 0xFF, rng.randrange(256)])
            else:
                member[at:at] = bytes([rng.choice([0, 0xC3, 0xFF, 0x41])])
            variants.append(bytes(member))
        for member in variants:
            why = _agree(member)
            if why is not None:
                assert why in REASONS
                seen_reasons.add(why)
    assert seen_reasons >= REASONS - {"empty slot"}


def test_a_member_round_trips_and_renumbers():
    member = make_entry("ünï.test", -5, 42, b"\0payload")
    parts = split_member(member)
    assert (parts.slot, parts.priority, int(parts.id, 16), parts.payload) == (
        "ünï.test",
        -5,
        42,
        b"\0payload",
    )
    moved = split_member(renumbered(parts, member, 2**40 + 1))
    assert int(moved.id, 16) == 2**40 + 1
    assert (moved.slot, moved.priority, moved.payload) == (parts.slot, -5, b"\0payload")


def test_what_the_scripts_and_the_producer_write_parses(redis_client, redis_url):
    """The real writers: commit.lua (a worker's commit, every slot shape it accepts) and the
    producer pushing into the queue."""
    frontier = Frontier(redis_client, FrontierKeys("site"))
    slots = ["a.test", "127.0.0.1:8080", "ünï.test", "x" * MAX_SLOT_BYTES, "slot with spaces"]
    shapes = [(slot, prio) for slot in slots for prio in (-(2**31) + 1, 0, 2**31 - 1)]
    entries = [
        Entry(EntryKind.REQUEST, f"fp{i}".encode(), prio, b"\0payload%d" % i, b"", slot)
        for i, (slot, prio) in enumerate(shapes)
    ]
    frontier.commit([], entries)
    settings = Settings()
    settings.setmodule("distcrawl.settings", priority="project")
    with Producer.from_url(redis_url, "site", settings) as producer:
        for n in range(3):
            assert producer.push(f"http://b.test/page/{n}", priority=n).ok
    members = redis_client.zrange("site:queue", 0, -1)
    assert len(members) == len(entries) + 3
    for member in members:
        assert _agree(member) is None, member
    assert {split_member(m).slot for m in members} == {*slots, "b.test"}
