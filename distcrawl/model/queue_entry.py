"""The queue entry's layout (``lua/lib.lua``) and the lease tokens, on the Python side.

A queue member is ``<slot> NUL <4-byte inverted priority> <6-byte id> <payload>``; the scripts
build and split it, and so does this module: the one Python reader of a member
(:func:`split_member`, :func:`parse_entry`, :func:`entry_problem`, one rule), for the worker
reading what it leased, ``distcrawl doctor``, ``distcrawl migrate --shards`` and the tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

#: bytes of a lease token: the holder's 4-byte worker tag, then 4 bytes that differ per lease
TOKEN_BYTES = 8
#: longest politeness slot (``meta["download_slot"]`` or a host name) a queue entry may carry
MAX_SLOT_BYTES = 255


class QueueEntryError(ValueError):
    """A queue member that is not a request entry (see ``lua/lib.lua``)."""


class LeaseRef(NamedTuple):
    """What a worker must present to acknowledge, renew or give back a lease."""

    id: str
    token: bytes
    #: the shard it was leased from (DISTCRAWL_SHARDS; 0 with one)
    shard: int = 0


class Leased(NamedTuple):
    id: str
    priority: int
    payload: bytes
    slot: str = ""
    #: taken at the start of a turn of a slot with a delay (see lease.lua)
    paced: bool = False
    token: bytes = b""
    #: leased ahead, holding no place in its slot: sent only in the place of a request of
    #: the same slot that left the downloader (see lease.lua, places.lua)
    reserve: bool = False
    shard: int = 0

    @property
    def ref(self) -> LeaseRef:
        return LeaseRef(self.id, self.token, self.shard)


def make_entry(slot: str, priority: int, seq: int, payload: bytes) -> bytes:
    """A queue entry as ``lua/lib.lua`` builds it (for tools and tests)."""
    priority = max(-(2**31) + 1, min(2**31 - 1, priority))
    key = (2**31 - priority).to_bytes(4, "big") + seq.to_bytes(6, "big")
    return slot.encode() + b"\0" + key + payload


def bad_slot(slot: str) -> str | None:
    """Why ``slot`` cannot be a politeness slot in a queue entry (None: it can); the same
    rule as ``bad_slot`` in lua/lib.lua, checked where entries are made."""
    if not slot:
        return "empty slot"
    if "\0" in slot:
        return "slot contains NUL"
    if len(slot.encode("utf-8", "surrogatepass")) > MAX_SLOT_BYTES:
        return f"slot over {MAX_SLOT_BYTES} bytes"
    return None


#: bytes after the slot's NUL: 4 of inverted priority, then 6 of id (sequence number)
ENTRY_HEAD = 10


def _slot_of(member: bytes) -> tuple[int, str]:
    """Where the slot's NUL is and the slot, or QueueEntryError with why not: the one rule
    for a queue member, which the worker (a lease's items), ``distcrawl doctor`` and
    ``distcrawl migrate --shards`` all apply. Stricter than lib.lua's ``entry_slot`` (which
    only needs the NUL and the 10 bytes) by the checks ``bad_slot`` makes where entries are
    written, so that whatever a writer could not have made is refused the same everywhere."""
    cut = member.find(b"\0")
    if cut < 0:
        raise QueueEntryError("no \\0 after the slot")
    if cut == 0:
        raise QueueEntryError("empty slot")
    if cut > MAX_SLOT_BYTES:
        raise QueueEntryError(f"slot longer than {MAX_SLOT_BYTES} bytes")
    try:
        slot = member[:cut].decode()
    except UnicodeDecodeError:
        raise QueueEntryError("slot is not valid UTF-8") from None
    if len(member) - cut - 1 < ENTRY_HEAD:
        raise QueueEntryError(f"fewer than {ENTRY_HEAD} bytes after the slot")
    return cut, slot


@dataclass(frozen=True)
class QueueMember:
    """A queue member split by :func:`split_member` (layout in ``lua/lib.lua``)."""

    slot: str
    priority: int
    #: the 6-byte id (sequence number), as lease.lua names requests: 12 hex digits
    id: str
    payload: bytes
    #: where the 6 id bytes start in the member (to renumber it: :func:`renumbered`)
    id_at: int


def split_member(member: bytes) -> QueueMember:
    """The parts of a queue member; QueueEntryError (its text: why) for one that is not."""
    cut, slot = _slot_of(member)
    prio = 2**31 - int.from_bytes(member[cut + 1 : cut + 5], "big")
    return QueueMember(slot, prio, member[cut + 5 : cut + 11].hex(), member[cut + 11 :], cut + 5)


def entry_problem(member: bytes) -> str | None:
    """Why ``member`` is not a queue entry (the reason doctor reports), None when it is."""
    try:
        _slot_of(member)
    except QueueEntryError as exc:
        return str(exc)
    return None


def renumbered(member: QueueMember, entry: bytes, new_id: int) -> bytes:
    """``entry`` (split as ``member``) with the id ``new_id``: the same slot, priority, payload."""
    return entry[: member.id_at] + new_id.to_bytes(6, "big") + entry[member.id_at + 6 :]


def parse_entry(entry: bytes) -> Leased:
    """Split a queue entry (layout in ``lua/lib.lua``) into id, priority, payload, slot;
    QueueEntryError (``malformed queue entry: <why>``) for a member that is not one."""
    try:
        cut, slot = _slot_of(entry)
    except QueueEntryError as exc:
        raise QueueEntryError(f"malformed queue entry: {exc}") from None
    prio = 2**31 - int.from_bytes(entry[cut + 1 : cut + 5], "big")
    return Leased(entry[cut + 5 : cut + 11].hex(), prio, entry[cut + 11 :], slot)


def new_tag() -> str:
    """A worker tag: 4 random bytes in hex (see ``FrontierKeys.alive``)."""
    return os.urandom(TOKEN_BYTES // 2).hex()


def worker_tags(raw: Iterable[bytes]) -> list[str]:
    """The well-formed worker tags (8 hex digits) among members read from Redis: only those
    can have a claim list (Frontier checks its tag), anything else was written by hand."""
    out = []
    for tag in raw:
        text = tag.decode("ascii", "replace")
        if len(text) == TOKEN_BYTES and all(c in "0123456789abcdefABCDEF" for c in text):
            out.append(text)
    return out


def raw_id(raw: bytes) -> str:
    """The id lease.lua gave a member (it only returns members with the full layout)."""
    cut = raw.find(b"\0")
    return raw[cut + 5 : cut + 11].hex()
