"""The typed records of the frontier's contract with its scripts, without Redis."""

from __future__ import annotations

import re
from pathlib import Path

import redis
from redis.connection import Connection

import distcrawl.model.lua
from distcrawl.engine._batch_send import _pack
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import LeaseRef, make_entry
from distcrawl.model.records import Entry, EntryKind, Feedback, RedriveKind
from distcrawl.model.replies import Places


def test_the_entry_kinds_are_the_ones_commit_lua_accepts():
    source = (Path(distcrawl.model.lua.__file__).parent / "commit.lua").read_text()
    kinds = re.search(r"local KINDS = \{([^}]*)\}", source)
    assert kinds is not None
    assert sorted(re.findall(r"(\w+) = true", kinds.group(1))) == sorted(k.value for k in EntryKind)


def test_a_commit_sends_each_kind_as_its_letter_byte_for_byte():
    """Both packers (redis-py's, for the batch runner and the Frontier's methods, and the
    producer's own) send an EntryKind exactly as the one-letter string it stands for."""
    frontier = Frontier(redis.Redis(), FrontierKeys("t"), tag="0a0b0c0d")
    entries = [Entry(kind, b"fp", 3, b"payload", b"raw", "t.test") for kind in EntryKind]
    letters = [Entry(e.kind.value, *e[1:]) for e in entries]  # type: ignore[arg-type]
    assert all(type(e.kind) is str for e in letters)
    acks, feedback = [LeaseRef("7", b"12345678")], [Feedback("t.test", 1, 20, 0, 0)]
    typed = frontier.commit_op(acks, entries, feedback, commit_id="c1", positions=True)
    plain = frontier.commit_op(acks, letters, feedback, commit_id="c1", positions=True)
    commands = [("EVALSHA", "0" * 40, len(op.keys), *op.keys, *op.args) for op in (typed, plain)]

    connection = Connection()
    mine = [_pack(command, connection.encoder) for command in commands]
    theirs = [b"".join(connection.pack_command(*command)) for command in commands]
    assert mine[0] == mine[1] == theirs[0] == theirs[1]
    for kind in EntryKind:
        entry = b"$1\r\n%s\r\n$2\r\nfp\r\n$6\r\nt.test\r\n$1\r\n3\r\n" % kind.value.encode()
        assert entry in mine[0]
    assert b"EntryKind" not in mine[0]


def test_replies_read_by_name():
    from distcrawl.model.replies import parse_lease, parse_places

    assert parse_places([2, 1]) == Places(freed=2, taken=1) == (2, 1)
    entry = make_entry("a.test", 5, 42, b"payload")
    lease = parse_lease([3, 1, 2, 250, 1000, 0, 0, 0, 1, b"12345678", entry])
    assert (lease.queue_size, lease.delayed, lease.released, lease.wait) == (3, 1, 2, 0.25)
    assert (lease.leased_at, lease.quarantined, lease.missing_retries, lease.rearmed) == (
        1000,
        0,
        0,
        0,
    )
    (item,) = lease.items
    assert (item.slot, item.priority, item.payload, item.paced, item.reserve) == (
        "a.test",
        5,
        b"payload",
        True,
        False,
    )
    assert item.ref == LeaseRef((42).to_bytes(6, "big").hex(), b"12345678")


def test_commits_added_up_keep_the_later_queue_size():
    """A batch's commits run one after the other on one queue: the later reply's size is
    the queue's, not the sum of two readings of it."""
    from distcrawl.model.replies import CommitResult

    first = CommitResult(enqueued=3, duplicates=1, queue_size=40)
    second = CommitResult(enqueued=2, late=1, queue_size=42)
    total = first + second
    assert (total.enqueued, total.duplicates, total.late, total.queue_size) == (5, 1, 1, 42)


def test_a_redrive_kind_is_sent_as_its_letter():
    source = (Path(distcrawl.model.lua.__file__).parent / "redrive.lua").read_text()
    for kind in RedriveKind:
        assert f"'{kind.value}' back into" in source
        command = ("EVALSHA", "0" * 40, 0, -1, b"{}", kind, "a.test", 0, b"p")
        plain = (*command[:5], kind.value, *command[6:])
        connection = Connection()
        assert _pack(command, connection.encoder) == _pack(plain, connection.encoder)
        assert connection.pack_command(*command) == connection.pack_command(*plain)
