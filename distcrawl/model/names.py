"""What a crawl may be named, and the hash tags of a sharded crawl's shards: the rules every
key name of distcrawl/model/keys.py is made under, and that the configuration (a crawl's name
is refused when the settings are read), the CLI and the ACL's key patterns check against
without needing the keys themselves.

A crawl's name (DISTCRAWL_NAMESPACE, else the spider's name) is checked here
(:func:`check_namespace`, which every ``FrontierKeys`` runs): it may hold no ``:``, no glob
character and no brace. With ``:``, the keys of a crawl ``site:eu`` would be keys of ``site``
as well (``site:eu:queue`` is ``site:`` + something), so the worker user of ``site``
(``~site:*``) could write them and ``distcrawl reset site`` could scan them; a glob character
would make the SCAN of ``reset`` and an ACL pattern match other crawls' keys (``s?te``); a
brace would start or end a hash tag (``{site`` would reach the shards of ``site``,
``{site:0}:queue``).
"""

from __future__ import annotations

import re
from functools import lru_cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

#: the most shards a crawl may have: each costs a few Redis calls per worker per batch
MAX_SHARDS = 256

#: what a crawl's name may not hold (see the module docstring): the separator, the glob
#: characters of SCAN and ACL patterns, hash-tag braces, whitespace, quotes and control
#: characters (which an ACL file cannot hold)
_NOT_IN_NAME = re.compile(r"[:*?\[\]\\{}\s\"'\x00-\x1f\x7f]")
_GLOB = re.compile(r"([*?\[\]\\])")


class NamespaceError(ValueError):
    """A crawl name that would make its keys another crawl's too (module docstring)."""


def check_namespace(name: str, what: str = "crawl name", hint: str = "") -> str:
    """``name`` if a crawl may be named so, else NamespaceError naming ``what`` (the setting
    or the spider it comes from), the characters refused, then ``hint``."""
    if not isinstance(name, str) or not name:
        raise NamespaceError(f"invalid {what} {name!r}: a crawl name must be a non-empty string")
    bad = sorted(set(_NOT_IN_NAME.findall(name)))
    if bad:
        shown = " ".join(repr(c) for c in bad)
        raise NamespaceError(
            f"invalid {what} {name!r}: a crawl name may not contain {shown} (nor any of "
            ": * ? [ ] \\ { }, whitespace, quotes, control characters: its keys would match "
            f"another crawl's){hint}"
        )
    return name


def glob_escape(text: str) -> str:
    """``text`` as a SCAN or ACL glob that matches itself only (``*?[]\\`` escaped)."""
    return _GLOB.sub(r"\\\1", text)


@lru_cache(maxsize=1024)
def shard_tag(namespace: str, shard: int, shards: int) -> str:
    """The hash tag of shard ``shard`` of ``shards``: ``<ns>:<shard>``, with a suffix
    (``<ns>:<shard>.<n>``, the first ``n`` that fits) when needed so that the tag's cluster
    hash slot falls inside the shard's share of the 16,384 slots, a slot away from its ends.
    A cluster made by ``redis-cli --cluster create`` gives each master an equal run of slots,
    so with a shard count that is a multiple of the masters each master holds as many."""
    if not 0 <= shard < shards <= MAX_SHARDS:
        raise ValueError(f"invalid shard {shard} of {shards}")
    # a slot away from each end: redis-cli rounds the ends of the masters' runs
    low = shard * REDIS_CLUSTER_HASH_SLOTS // shards + 1
    high = (shard + 1) * REDIS_CLUSTER_HASH_SLOTS // shards - 1
    for n in range(1_000_000):
        tag = f"{namespace}:{shard}" + (f".{n}" if n else "")
        if low <= key_slot(tag.encode()) < high:
            return tag
    raise ValueError(f"no hash tag found for shard {shard} of {shards}")  # pragma: no cover
