"""A crawl's frontier split into shards (``DISTCRAWL_SHARDS``), and which shard is whose.

One Redis core and one node's memory cap a crawl whose every worker leases from one ZSET.
With shards, each shard is a whole frontier of its own (queue, records, leases, retries,
slot state, seen-set, its own dead-letter quarantine and stats) under one hash tag, so every
script still touches one shard and stays atomic, and the shards spread over a cluster's
masters. A request belongs to the shard of its host's registered domain (public suffix + 1,
from the suffix list bundled with tldextract, never fetched): every host of a site, its
politeness slots and the seen check of its URLs live in one shard, so dedup stays exact and
per-host limits hold. Slots that are not host names (an IP address with
CONCURRENT_REQUESTS_PER_IP, a ``download_slot`` meta key) are coordinated within a shard: the
same IP reached through hosts of two shards has a slot in each.

The crawl's own keys (``FrontierKeys`` with no shard) keep start URLs and their claims, the
crawl's dead letters and stats, the workers, settings and pause: what producers and operators
address by name. With one shard the crawl's own keys are the shard's, exactly as before.

What crosses shards keeps the crawl's rule that nothing is lost (see batch.py): a page's
children are stored in their shards before the page is acknowledged in its own, so a crash in
between crawls the page again (at least once) and its children are deduplicated by their
shard's seen-set; dead letters a shard's scripts meet wait in that shard's quarantine until a
worker moves them to the crawl's dead letters (:meth:`Shards.move_dead`), copied before they
are removed, so a crash in between can copy a record twice but never lose one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import redis
import tldextract

from distcrawl.model.frontier import Frontier
from distcrawl.model.ops import Op
from distcrawl.model.queue_entry import LeaseRef
from distcrawl.model.records import Entry, EntryKind, Feedback
from distcrawl.model.replies import CommitResult, Drained

T = TypeVar("T")

#: slots whose shard is not the one their name gives, remembered per worker (an IP or
#: ``download_slot`` slot); the oldest are forgotten past this
SLOT_MEMORY = 100_000
#: dead letters moved from a shard's quarantine per call
MOVE_DEAD_BATCH = 100
#: how long (ms) one worker holds a shard's quarantine while it moves it
MOVE_DEAD_LOCK_MS = 10_000
#: entries and acknowledgements one commit script call handles at most. Each costs a few
#: Redis calls, O(log N) in the queue (12-25 us at a million queued requests): a call stays
#: within a few milliseconds, however many links a page has or however large
#: DISTCRAWL_START_URLS_BATCH is, and Redis serves the other workers in between
COMMIT_CALL_MAX = 100

# the suffix list bundled with tldextract: no download, no cache directory
_extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


@lru_cache(maxsize=65_536)
def site_of(host: str) -> str:
    """The registered domain of ``host`` (``a.b.example.co.uk`` -> ``example.co.uk``), or the
    host itself when it has none (an IP address, ``localhost``)."""
    host = host.lower().rstrip(".")
    parts = _extract(host)
    domain = getattr(parts, "top_domain_under_public_suffix", None)
    if domain is None:  # tldextract before 5.3
        domain = parts.registered_domain
    return str(domain or host)


def shard_of_site(site: str, shards: int) -> int:
    """A stable hash, the same in every process and Python version (never ``hash()``)."""
    if shards == 1:
        return 0
    digest = hashlib.blake2b(site.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def shard_of_url(url: str, shards: int) -> int:
    """The shard of a request for ``url``: that of its host's registered domain."""
    if shards == 1:
        return 0
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        host = ""
    return shard_of_site(site_of(host), shards)


@dataclass(frozen=True)
class Fan(Generic[T]):
    """One step sent to several shards: an Op per shard, and how their replies combine."""

    ops: list[Op[Any]]
    merge: Callable[[list[Any]], T]


def _one(values: list[Any]) -> Any:
    return values[0]


def _summed(values: list[Any]) -> int:
    return sum(int(v) for v in values)


@dataclass(frozen=True)
class CommitPart:
    """The part of a commit one shard stores: its acknowledgements, feedback and entries, with
    the entries' positions in the whole commit (to report what was not stored)."""

    shard: int
    id: str
    acks: list[LeaseRef]
    entries: list[Entry]
    feedback: list[Feedback]
    positions: list[int]


class Shards:
    """The frontiers of a crawl's shards and of the crawl's own keys, for one worker.

    ``crawl`` runs what is crawl-wide (start URL claims, the idle wait, dead letters);
    ``parts[i]`` is shard ``i``. With one shard both are the same Frontier.
    """

    def __init__(self, crawl: Frontier, parts: Sequence[Frontier]) -> None:
        if not parts:
            raise ValueError("a crawl has at least one shard")
        self.crawl = crawl
        self.parts = list(parts)
        self.count = len(self.parts)
        #: slots whose shard is not their name's (see SLOT_MEMORY)
        self._slots: OrderedDict[str, int] = OrderedDict()

    @classmethod
    def single(cls, frontier: Frontier) -> Shards:
        return cls(frontier, [frontier])

    @property
    def sharded(self) -> bool:
        return self.count > 1

    @property
    def frontiers(self) -> list[Frontier]:
        """Every Frontier whose keys hold requests or workers' state: the crawl's own keys
        first when they are not a shard's."""
        return self.parts if not self.sharded else [self.crawl, *self.parts]

    # -- which shard ----------------------------------------------------------------------

    def of_url(self, url: str) -> int:
        return shard_of_url(url, self.count)

    def of_entry(self, entry: Entry, default: int) -> int:
        """The shard that stores ``entry``: a request's by its URL; a dead letter goes to
        ``default`` (the quarantine of the shard acknowledging, moved on from there)."""
        url = getattr(entry.request, "url", None)
        if isinstance(url, str):
            return self.of_url(url)
        return default

    def learn(self, slot: str, shard: int) -> None:
        """A request of ``slot`` was leased from ``shard``: reports about the slot go there."""
        if not self.sharded or shard == shard_of_site(site_of(slot), self.count):
            return
        self._slots[slot] = shard
        self._slots.move_to_end(slot)
        while len(self._slots) > SLOT_MEMORY:
            self._slots.popitem(last=False)

    def of_slot(self, slot: str) -> int:
        if not self.sharded:
            return 0
        known = self._slots.get(slot)
        if known is not None:
            return known
        return shard_of_site(site_of(slot), self.count)

    def by_shard(self, refs: Iterable[LeaseRef]) -> dict[int, list[LeaseRef]]:
        out: dict[int, list[LeaseRef]] = {}
        for ref in refs:
            out.setdefault(ref.shard, []).append(ref)
        return out

    # -- steps fanned out -----------------------------------------------------------------

    def refs_fan(
        self,
        refs: Iterable[LeaseRef],
        make: Callable[[Frontier, list[LeaseRef]], Op[Any]],
        merge: Callable[[list[Any]], T],
    ) -> Fan[T]:
        groups = self.by_shard(refs)
        return Fan([make(self.parts[s], g) for s, g in sorted(groups.items())], merge)

    def sent_fan(self, paced: Sequence[tuple[str, int]]) -> Fan[int]:
        groups: dict[int, list[tuple[str, int]]] = {}
        for slot, at in paced:
            groups.setdefault(self.of_slot(slot), []).append((slot, at))
        return Fan([self.parts[s].sent_op(g) for s, g in sorted(groups.items())], _summed)

    def every_fan(
        self, make: Callable[[Frontier], Op[Any]], merge: Callable[[list[Any]], T]
    ) -> Fan[T]:
        return Fan([make(f) for f in self.frontiers], merge)

    # -- commits across shards --------------------------------------------------------------

    def plan(
        self,
        commit_id: str,
        acks: Sequence[LeaseRef],
        entries: Sequence[Entry],
        feedback: Sequence[Feedback],
    ) -> list[list[CommitPart]]:
        """The commit as phases of per-shard parts; each phase runs only once the one before
        succeeded in every shard. Entries stored in a shard that acknowledges nothing, or in
        one while other shards acknowledge, go first: a request is acknowledged only once
        everything it produced is stored, in whatever shard. With everything in one shard
        (a site's links stay in its shard) it is one part, as unsharded. With one shard the
        commit is the one part, under its own id, its entries as they are: the crawl's own
        keys are the shard's, so the commit script takes stored start URLs out of the claim
        list itself."""
        if not self.sharded:
            positions = list(range(len(entries)))
            whole = CommitPart(0, commit_id, list(acks), list(entries), list(feedback), positions)
            return bounded([[whole]])
        refs = self.by_shard(acks)
        default = min(refs) if refs else 0
        routed: dict[int, list[tuple[int, Entry]]] = {}
        for at, entry in enumerate(entries):
            routed.setdefault(self.of_entry(entry, default), []).append((at, in_shard(entry)))
        fed: dict[int, list[Feedback]] = {}
        for f in feedback:
            fed.setdefault(self.of_slot(f.slot), []).append(f)
        # entries ride with the acknowledgements only when one shard acknowledges: then no
        # other shard's request waits on them
        with_acks = set(refs) if len(refs) == 1 else set()
        first: list[CommitPart] = []
        last: list[CommitPart] = []
        for shard in sorted(set(routed) | set(refs) | set(fed)):
            pairs = routed.get(shard, [])
            if pairs and shard not in with_acks:
                first.append(_part(shard, f"{commit_id}:{shard}:a", [], pairs, []))
                pairs = []
            if shard in refs or shard in fed or pairs:
                part = _part(
                    shard, f"{commit_id}:{shard}", refs.get(shard, []), pairs, fed.get(shard, [])
                )
                last.append(part)
        return bounded([phase for phase in (first, last) if phase])

    # -- the whole crawl --------------------------------------------------------------------

    def drained(self) -> Drained:
        """Whether the whole crawl is out of work. Shards are read one after another, so a
        commit moving work between two of them could slip between the reads: leases are
        read before queues, and again after, because a child is stored before its parent's
        acknowledgement, so a parent seen gone has its children seen queued or leased."""
        if not self.sharded:
            return self.crawl.drained()
        head = self.crawl.drained()
        before = self._leased()
        waits = [f.drained() for f in self.parts]
        after = self._leased()
        retries = [d.next_retry_ms for d in waits if d.next_retry_ms is not None]
        return Drained(
            head.start_urls,
            sum(d.queued for d in waits) + head.queued,
            max(before, sum(d.leased for d in waits), after) + head.leased,
            min(retries) if retries else head.next_retry_ms,
            head.claimants,
            head.worked or any(d.worked for d in waits),
        )

    def _leased(self) -> int:
        """Leases held in all shards, read in one pipeline."""
        pipe = self.crawl.client.pipeline(transaction=False)
        for f in self.parts:
            pipe.zcard(f.keys.leases)
        return sum(int(n) for n in pipe.execute())

    def sizes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.frontiers:
            for name, value in f.admin.sizes().items():
                if name == "start_urls" and f is not self.crawl:
                    continue  # the crawl's, read once
                out[name] = out.get(name, 0) + value
        return out

    def clear(self) -> int:
        """Remove the crawl's keys, every shard's included (FrontierAdmin.clear)."""
        return self.crawl.admin.clear(shards=[f.keys for f in self.parts if f is not self.crawl])

    def move_dead(self, shard: int, limit: int = MOVE_DEAD_BATCH) -> int:
        """Move up to ``limit`` of the oldest dead letters from shard ``shard``'s quarantine
        to the crawl's dead letters: copied, then removed, under a lock so that two workers
        never copy the same records; a crash in between copies them again (at least once)."""
        part = self.parts[shard]
        source, target = part.keys.dead, self.crawl.keys.dead
        client = part.client
        lock = f"{part.keys.prefix}dead:moving"
        if not client.set(lock, part.tag, nx=True, px=MOVE_DEAD_LOCK_MS):
            return 0
        try:
            records = client.lrange(source, -limit, -1)
            if not records:
                return 0
            # the list is newest first: the oldest (rightmost) go in first, to stay in order
            client.lpush(target, *reversed(records))
            client.ltrim(source, 0, -len(records) - 1)
            return len(records)
        finally:
            with contextlib.suppress(redis.RedisError):  # else it expires
                client.delete(lock)


def in_shard(entry: Entry) -> Entry:
    """The entry as a shard stores it: a start URL's claim is the crawl's, not the shard's
    (commit.lua's kind 'S'; a bad start entry is a plain dead letter)."""
    if entry.kind is EntryKind.START_REQUEST:
        return entry._replace(kind=EntryKind.SHARD_START)
    if entry.kind is EntryKind.BAD_START:
        return entry._replace(kind=EntryKind.DEAD_LETTER)
    return entry


def bounded(phases: list[list[CommitPart]], limit: int = COMMIT_CALL_MAX) -> list[list[CommitPart]]:
    """``phases`` with every part of more than ``limit`` entries and acknowledgements cut
    into pieces of at most ``limit``, each piece a script call of its own and in a phase of
    its own, before what it was cut from: entries go first, acknowledgements after the last
    of them and the feedback with the last piece, so a request is still acknowledged only
    once everything it produced is stored (a crash in between crawls it again, its children
    deduplicated). A shard has one piece per phase: a phase's round trip loses at most the
    reply of one call per shard, which the commit id then recognises (commit.lua keeps the
    last id per worker). The pieces of a phase's parts end together, with the phase."""
    out: list[list[CommitPart]] = []
    for phase in phases:
        cut = [_pieces(part, limit) for part in phase]
        depth = max((len(pieces) for pieces in cut), default=0)
        for step in range(depth):
            out.append(
                [
                    pieces[step - depth + len(pieces)]
                    for pieces in cut
                    if step >= depth - len(pieces)
                ]
            )
    return out


def _pieces(part: CommitPart, limit: int) -> list[CommitPart]:
    """``part`` as calls of at most ``limit`` entries and acknowledgements, in order; the
    last keeps the part's id (a part that fits is itself)."""
    if len(part.entries) + len(part.acks) <= limit:
        return [part]
    pairs = list(zip(part.positions, part.entries, strict=True))
    acks = list(part.acks)
    pieces: list[CommitPart] = []
    while len(pairs) + len(acks) > limit:
        piece_id = f"{part.id}:p{len(pieces)}"
        if pairs:
            pieces.append(_part(part.shard, piece_id, [], pairs[:limit], []))
            pairs = pairs[limit:]
        else:
            pieces.append(CommitPart(part.shard, piece_id, acks[:limit], [], [], []))
            acks = acks[limit:]
    pieces.append(_part(part.shard, part.id, acks, pairs, part.feedback))
    return pieces


def _part(
    shard: int,
    part_id: str,
    acks: list[LeaseRef],
    pairs: list[tuple[int, Entry]],
    feedback: list[Feedback],
) -> CommitPart:
    return CommitPart(
        shard, part_id, acks, [e for _, e in pairs], feedback, [at for at, _ in pairs]
    )


def merge_commits(parts: Sequence[CommitPart], results: Sequence[CommitResult]) -> CommitResult:
    """One CommitResult for the parts of a commit: counts summed, the queue size as the
    shards' queues add up (each shard's last reading: a shard can have a part in two
    phases), positions of the entries not stored mapped back to the whole commit's."""
    total = CommitResult()
    sizes: dict[int, int] = {}
    not_stored: list[int] = []
    for part, result in zip(parts, results, strict=True):
        total += result
        sizes[part.shard] = result.queue_size
        for p in result.not_stored:
            # p for a duplicate, -p - 1 for one dropped at the cap (commit.lua)
            not_stored.append(part.positions[p] if p >= 0 else -part.positions[-p - 1] - 1)
    total = dataclasses.replace(total, queue_size=sum(sizes.values()))
    return CommitResult.of(
        total.counts(), sorted(not_stored, key=lambda p: p if p >= 0 else -p - 1)
    )
