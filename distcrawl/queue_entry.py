"""The queue entry's layout (``lua/lib.lua``) and the lease tokens, on the Python side.

A queue member is ``<slot> NUL <4-byte inverted priority> <6-byte id> <payload>``; the scripts
build and split it, and so do these functions, for the worker reading what it leased and for
the tools and tests that write or read the queue directly.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
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


def parse_entry(entry: bytes) -> Leased:
    """Split a queue entry (layout in ``lua/lib.lua``) into id, priority, payload, slot;
    QueueEntryError for a member that is not one."""
    cut = entry.find(b"\0")
    if cut < 0 or len(entry) < cut + 11:
        raise QueueEntryError("malformed queue entry")
    try:
        slot = entry[:cut].decode()
    except UnicodeDecodeError:
        raise QueueEntryError("queue entry slot is not UTF-8") from None
    why = bad_slot(slot)
    if why is not None:
        raise QueueEntryError(f"queue entry: {why}")
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
