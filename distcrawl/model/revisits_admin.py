"""The operator's view of revisits (``DISTCRAWL_RECRAWL_INTERVAL``): how many are scheduled,
due and late, per domain, and making chosen ones due now (``distcrawl recrawl``).

A broad crawl holds millions of revisits, so nothing here reads a key whole: the totals come
from ZCARD/ZCOUNT (O(log n)), the per-domain counts from ZSCAN pages of ``PAGE`` ids with one
HMGET of their records each, so Redis answers other clients between two pages. Ages are on
the clock of the Redis server holding the shard (TIME), as the scripts' due times are, never
on this host's. The scans run while workers lease and commit: a revisit moved or replaced
meanwhile may be counted twice or missed in the per-domain rows, never in the totals.

Due revisits that a lease already moved into ``revisit_queue`` no longer carry their due time
(lease.lua deletes their record and keeps only the queue entry), so how late the most overdue
revisit is can only be told of those still waiting in ``revisits``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from distcrawl.model.connection import execute_timed, server_ms
from distcrawl.model.frontier_admin import recorded_shards
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import TOKEN_BYTES, QueueEntryError, parse_entry

#: ids per ZSCAN page (and per HMGET of their records, per ZADD of a domain's)
PAGE = 1000
#: "due in the next hour"
HOUR_MS = 3_600_000


def crawl_parts(client: redis.Redis, keys: FrontierKeys) -> list[FrontierKeys]:
    """The keys holding the crawl's revisits: each shard's, or the crawl's own."""
    return recorded_shards(client, keys) or [keys]


def slot_of_record(record: bytes | None) -> str | None:
    """The slot of a request record (token, then the queue entry; lua/lib.lua); None when
    it cannot be parsed."""
    if record is None or len(record) <= TOKEN_BYTES:
        return None
    try:
        return parse_entry(record[TOKEN_BYTES:]).slot
    except QueueEntryError:
        return None


def _slot_of_entry(entry: bytes) -> str | None:
    try:
        return parse_entry(entry).slot
    except QueueEntryError:
        return None


def _scanned(client: redis.Redis, key: str, page: int) -> Iterator[list[tuple[bytes, float]]]:
    """ZSCAN pages of (member, score) of ``key``, about ``page`` at a time."""
    cursor = 0
    while True:
        cursor, pairs = client.zscan(key, cursor, count=page)
        if pairs:
            yield [(cast(bytes, m), float(s)) for m, s in pairs]
        if int(cursor) == 0:
            return


def _waiting(
    client: redis.Redis, keys: FrontierKeys, page: int
) -> Iterator[list[tuple[bytes, float, bytes | None]]]:
    """Pages of the shard's waiting revisits: (id, due time, record or None)."""
    for pairs in _scanned(client, keys.revisits, page):
        records = cast(list[Any], client.hmget(keys.requests, [m for m, _ in pairs]))
        yield [(m, s, r) for (m, s), r in zip(pairs, records, strict=True)]


# ---------------------------------------------------------------------- status


@dataclass
class DomainRevisits:
    domain: str
    scheduled: int = 0
    due: int = 0
    next_hour: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RevisitTotals:
    """Revisits by when they are due, all shards added up: exact (ZCARD, ZCOUNT), unlike
    the per-domain rows, which come from scans while workers lease and commit."""

    #: waiting in ``revisits`` for their due time
    waiting: int = 0
    #: due, in ``revisit_queue`` for their slot's turn
    queued: int = 0
    #: due now: waiting ones whose due time has come, and the queued ones
    due: int = 0
    #: not yet due, due within the hour
    next_hour: int = 0

    @property
    def scheduled(self) -> int:
        return self.waiting + self.queued

    def as_dict(self) -> dict[str, Any]:
        return {"scheduled": self.scheduled, **dataclasses.asdict(self)}


@dataclass
class RevisitStatus:
    """The crawl's revisits, all shards added up."""

    namespace: str
    shards: int
    #: server time of the first shard read (s)
    now: float = 0.0
    totals: RevisitTotals = field(default_factory=RevisitTotals)
    #: how late the most overdue waiting revisit is (s); None: none is
    overdue_seconds: float | None = None
    #: waiting revisits without a record, and records or queue entries that do not parse
    missing: int = 0
    unparsable: int = 0
    domains: dict[str, DomainRevisits] = field(default_factory=dict)

    def top(self, limit: int) -> list[DomainRevisits]:
        """The domains with the most revisits due now, then due within the hour."""
        rows = sorted(self.domains.values(), key=lambda d: (-d.due, -d.next_hour, d.domain))
        return rows[:limit]

    def domain(self, name: str) -> DomainRevisits:
        row = self.domains.get(name)
        if row is None:
            row = self.domains[name] = DomainRevisits(name)
        return row

    def as_dict(self, limit: int) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "shards": self.shards,
            "time": self.now,
            **self.totals.as_dict(),
            "overdue_seconds": self.overdue_seconds,
            "missing_records": self.missing,
            "unparsable": self.unparsable,
            "domain_count": len(self.domains),
            "domains": [d.as_dict() for d in self.top(limit)],
        }


def revisit_status(client: redis.Redis, keys: FrontierKeys, page: int = PAGE) -> RevisitStatus:
    """Read the crawl's revisits, shard after shard (see the module's docstring)."""
    parts = crawl_parts(client, keys)
    out = RevisitStatus(keys.namespace, len(parts))
    for n, k in enumerate(parts):
        pipe = client.pipeline(transaction=False)
        pipe.zcard(k.revisits)
        pipe.zcard(k.revisit_queue)
        pipe.zrange(k.revisits, 0, 0, withscores=True)
        waiting, queued, oldest, (seconds, micros) = execute_timed(client, pipe, k.revisits)
        now = int(seconds) * 1000 + int(micros) // 1000
        if n == 0:
            out.now = now / 1000
        pipe = client.pipeline(transaction=False)
        pipe.zcount(k.revisits, "-inf", now)
        pipe.zcount(k.revisits, f"({now}", now + HOUR_MS)
        due, next_hour = pipe.execute()
        totals = out.totals
        totals.waiting += int(waiting)
        totals.queued += int(queued)
        totals.due += int(due) + int(queued)
        totals.next_hour += int(next_hour)
        if oldest and oldest[0][1] <= now:
            late = round((now - oldest[0][1]) / 1000, 3)
            out.overdue_seconds = max(out.overdue_seconds or 0.0, late)
        _per_domain(client, k, now, out, page)
    return out


def _per_domain(
    client: redis.Redis, k: FrontierKeys, now: int, out: RevisitStatus, page: int
) -> None:
    for rows in _waiting(client, k, page):
        for _, due_at, record in rows:
            slot = slot_of_record(record)
            if slot is None:
                if record is None:
                    out.missing += 1
                else:
                    out.unparsable += 1
                continue
            row = out.domain(slot)
            row.scheduled += 1
            if due_at <= now:
                row.due += 1
            elif due_at <= now + HOUR_MS:
                row.next_hour += 1
    for pairs in _scanned(client, k.revisit_queue, page):
        for entry, _ in pairs:
            slot = _slot_of_entry(entry)
            if slot is None:
                out.unparsable += 1
                continue
            row = out.domain(slot)
            row.scheduled += 1
            row.due += 1


# ---------------------------------------------------------------------- due now


@dataclass(frozen=True)
class PageResult:
    """What ``make_page_due`` did: ``state`` is ``made_due`` (it was waiting), ``already_due``
    (its due time had come), ``not_waiting`` (the page's revisit is queued or being fetched:
    its turn comes anyway) or ``not_scheduled`` (the page has no revisit)."""

    state: str
    shard: int
    #: seconds the revisit was still to wait, for ``made_due``
    was_due_in: float | None = None


def make_page_due(client: redis.Redis, keys: FrontierKeys, fingerprint: bytes) -> PageResult:
    """Make the revisit of the page with ``fingerprint`` due now, in the shard ``keys`` (the
    shard of the page's URL). ZADD XX: a revisit that a lease or a commit took away
    meanwhile is not brought back."""
    shard = keys.shard or 0
    rid = cast("bytes | None", client.hget(keys.revisit_of, fingerprint))
    if rid is None:
        return PageResult("not_scheduled", shard)
    pipe = client.pipeline(transaction=False)
    pipe.zscore(keys.revisits, rid)
    due_at, (seconds, micros) = execute_timed(client, pipe, keys.revisits)
    now = int(seconds) * 1000 + int(micros) // 1000
    if due_at is None:
        return PageResult("not_waiting", shard)
    if due_at <= now:
        return PageResult("already_due", shard)
    if not client.zadd(keys.revisits, {rid: now}, xx=True, ch=True):
        return PageResult("not_waiting", shard)  # leased or replaced in between
    return PageResult("made_due", shard, round((due_at - now) / 1000, 3))


def under_domain(slot: str, domain: str) -> bool:
    """Whether ``slot`` is ``domain`` or one of its subdomains."""
    slot = slot.lower().rstrip(".")
    return slot == domain or slot.endswith("." + domain)


@dataclass
class DomainResult:
    made_due: int = 0
    already_due: int = 0


def make_domain_due(
    client: redis.Redis, parts: Sequence[FrontierKeys], domain: str, page: int = PAGE
) -> DomainResult:
    """Make every waiting revisit whose slot is ``domain`` or a subdomain due now, page by
    page in every shard (a domain's subdomains may be sites of their own, in other shards)."""
    domain = domain.lower().rstrip(".")
    out = DomainResult()
    for k in parts:
        now = server_ms(client, k.revisits)
        for rows in _waiting(client, k, page):
            moved: dict[bytes, int] = {}
            for rid, due_at, record in rows:
                slot = slot_of_record(record)
                if slot is None or not under_domain(slot, domain):
                    continue
                if due_at <= now:
                    out.already_due += 1
                else:
                    moved[rid] = now
            if moved:
                out.made_due += int(client.zadd(k.revisits, moved, xx=True, ch=True))  # type: ignore[arg-type]
    return out


# ---------------------------------------------------------------------- the monitor's gauges


def gauges_of(replies: Sequence[Any], shards: int, due_bound: int | None) -> dict[str, Any]:
    """The revisit gauges from the monitor's reads: per shard ZCARD of ``revisits`` and of
    ``revisit_queue``, ZCOUNT of ``revisits`` up to ``due_bound`` and ZRANGE 0 0 WITHSCORES
    of it (``GAUGE_REPLIES`` each), then TIME. ``due_bound`` is the server's time the ZCOUNT
    was sent with (None: not known yet, the first beat): without it no due count is given."""
    now = _time_ms(replies[-1])
    scheduled = due = 0
    overdue = 0.0
    for i in range(shards):
        waiting, queued, counted, oldest = replies[i * GAUGE_REPLIES : (i + 1) * GAUGE_REPLIES]
        scheduled += int(waiting) + int(queued)
        due += int(counted) + int(queued)
        score = _first_score(oldest)
        if score is not None and score <= now:
            overdue = max(overdue, round((now - score) / 1000, 3))
    gauges: dict[str, Any] = {"revisits": scheduled, "revisits_overdue_seconds": overdue}
    if due_bound is not None:
        gauges["revisits_due"] = due
    return gauges


#: replies per shard that :func:`gauges_of` reads
GAUGE_REPLIES = 4


def _time_ms(reply: Any) -> int:
    seconds, micros = reply[0], reply[1]
    return int(seconds) * 1000 + int(micros) // 1000


def _first_score(reply: Any) -> float | None:
    """The score of a ZRANGE 0 0 WITHSCORES sent as a plain command: ``[member, score]``
    (RESP2), ``[[member, score]]`` (RESP3), or pairs parsed by redis-py."""
    if not reply:
        return None
    first = reply[0]
    if isinstance(first, list | tuple):
        return float(first[1])
    return float(reply[1])
