"""``distcrawl doctor``: find, and with ``repair=True`` fix, frontier state that should never
exist.

Every script keeps the frontier consistent, but a bug, a hand edit with ``redis-cli``, a
failover that lost writes or an old worker version can still leave state the workers never
clean up: a queue member nobody can parse (every lease of its slot fails), a slot with
queued requests missing from ``ready`` (they are never leased), a lease or a retry whose
record is gone, a record nothing refers to (its request never runs again), or an
``inflight`` count that keeps a slot full for good. Each kind is a :data:`KINDS` entry.

The scan is cursor-based (ZSCAN/HSCAN in batches), so a queue of millions of members is
read in O(n) without blocking Redis; each batch's suspects are confirmed in one MULTI/EXEC
(a consistent view: a request a worker leased between the SCAN and the check is not a
problem), and every repair re-checks each item inside a Lua script, because workers may be
running while the doctor works. Synchronous and free of Scrapy state, like
:mod:`distcrawl.model.frontier`.

A sharded crawl (DISTCRAWL_SHARDS above 1) is examined shard by shard, every shard its
layout record names: each is a whole frontier, and the doctor's scripts take one shard's
keys. The findings are added up, each sample naming its ``shard``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from distcrawl.model.deadrecord import dead_letter
from distcrawl.model.frontier import wake_idle
from distcrawl.model.frontier_admin import recorded_shards
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.lua import DOCTOR_NAMES, LuaScript, ScriptMode, lua_script
from distcrawl.model.queue_entry import TOKEN_BYTES, QueueEntryError, entry_problem, split_member

logger = logging.getLogger(__name__)

#: the problems, in the order they are examined, with what they are and what repair does
KINDS: dict[str, tuple[str, str]] = {
    "lease_without_record": ("leases whose request has no record", "lease removed"),
    "delayed_without_record": ("retries whose request has no record", "retry removed"),
    "orphan_record": (
        "records neither leased, delayed nor queued",
        "requeued (dead-lettered if unparsable)",
    ),
    "unparsable": ("queue members that cannot be parsed", "moved to the dead letters"),
    "slot_not_ready": ("slots with queued entries missing from ready", "added to ready"),
    "inflight_mismatch": ("in-flight counts that disagree with the leases", "rewritten"),
}
#: how many bytes of an unparsable value a sample shows (as hex)
SAMPLE_BYTES = 32
SCRIPT_NAMES = DOCTOR_NAMES


def record_problem(record: bytes) -> str | None:
    """Why a request record (token, then queue entry) cannot be parsed, or None."""
    if len(record) < TOKEN_BYTES:
        return f"record shorter than its {TOKEN_BYTES}-byte token"
    return entry_problem(record[TOKEN_BYTES:])


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="backslashreplace")


def _hex(raw: bytes) -> str:
    """The first bytes of ``raw`` as hex, marked when cut short."""
    shown = raw[:SAMPLE_BYTES].hex()
    return shown + "..." if len(raw) > SAMPLE_BYTES else shown


@dataclass
class Finding:
    """One kind of problem: how many were found, how many the repair fixed (the others
    were gone by then, fixed by the workers or taken by them), and a few examples."""

    kind: str
    found: int = 0
    repaired: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, sample: dict[str, Any], limit: int) -> None:
        self.found += 1
        if len(self.samples) < limit:
            self.samples.append(sample)


@dataclass
class Report:
    namespace: str
    repair: bool
    findings: dict[str, Finding] = field(
        default_factory=lambda: {kind: Finding(kind) for kind in KINDS}
    )
    #: members/fields read per key
    scanned: dict[str, int] = field(default_factory=dict)
    #: a scan stopped at its round limit (the key kept growing): run the doctor again
    incomplete: bool = False

    @property
    def problems(self) -> int:
        return sum(f.found for f in self.findings.values())

    @property
    def clean(self) -> bool:
        return self.problems == 0 and not self.incomplete

    @property
    def resolved(self) -> bool:
        """Nothing left to do: clean, or repaired (an item not repaired was gone by then)."""
        return self.clean or (self.repair and not self.incomplete)

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "repair": self.repair,
            "clean": self.clean,
            "incomplete": self.incomplete,
            "scanned": dict(self.scanned),
            "problems": {
                kind: {"found": f.found, "repaired": f.repaired, "samples": f.samples}
                for kind, f in self.findings.items()
            },
        }


@dataclass(frozen=True)
class DoctorScripts:
    """The doctor's own scripts, registered apart from :class:`distcrawl.model.lua.Scripts`:
    the workers never run them."""

    quarantine: LuaScript
    ready: LuaScript
    unrecorded: LuaScript
    records: LuaScript
    inflight: LuaScript

    @classmethod
    def register(cls, client: redis.Redis) -> DoctorScripts:
        mode = ScriptMode()
        return cls(*(lua_script(client, name, mode=mode) for name in SCRIPT_NAMES))


class Doctor:
    """Examines (and repairs) one crawl's frontier. ``batch``: the COUNT of each SCAN and
    the most items per confirming transaction or repair script, so that no single command
    blocks Redis for long; ``samples``: examples kept per kind of problem."""

    def __init__(
        self, client: redis.Redis, keys: FrontierKeys, *, batch: int = 1000, samples: int = 5
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self.client = client
        self.keys = keys
        self.batch = batch
        self.samples = samples
        self.scripts = DoctorScripts.register(client)

    def examine(self, *, repair: bool = False) -> Report:
        """Examine the frontier, or each shard of a sharded one (the ``scanned`` counts are
        summed over the shards)."""
        report = Report(self.keys.namespace, repair)
        parts = recorded_shards(self.client, self.keys)
        if not parts:
            self._examine(report)
        for keys in parts:
            before = {kind: len(f.samples) for kind, f in report.findings.items()}
            shard = copy.copy(self)  # the same scripts, batch and samples
            shard.keys = keys
            shard._examine(report)
            for kind, finding in report.findings.items():
                for sample in finding.samples[before[kind] :]:
                    sample["shard"] = keys.shard
        if repair:
            # requeued records and re-armed slots are work a parked worker does not poll for
            back = ("orphan_record", "slot_not_ready")
            wake_idle(self.client, self.keys, sum(report.findings[k].repaired for k in back))
        for kind, finding in report.findings.items():
            if finding.found:
                logger.info(
                    "doctor %s: %d %s, %d repaired",
                    self.keys.namespace,
                    finding.found,
                    KINDS[kind][0],
                    finding.repaired,
                )
        return report

    def _examine(self, report: Report) -> None:
        """Examine the one frontier of ``self.keys`` (a crawl's, or one shard's)."""
        self._unrecorded(report, "lease_without_record", self.keys.leases)
        self._unrecorded(report, "delayed_without_record", self.keys.delayed)
        self._records(report)
        self._queue(report)
        self._inflight(report)

    # ------------------------------------------------------------------ scanning

    def _scan(self, report: Report, key: str, *, hash_: bool = False) -> Iterator[list[Any]]:
        """Batches of one key's members ((member, score) pairs, or (field, value) pairs
        for a HASH), cursor-based. A member present for the whole scan is returned at
        least once, possibly twice: callers deduplicate what they report.

        Bounded: a SCAN call visits at most 10 x COUNT buckets or returns COUNT members,
        and Redis shrinks a table below 10% fill, so a full pass takes about
        2 x size / COUNT calls; the limit allows for ten times that plus growth meanwhile.
        """
        size = int(self.client.hlen(key) if hash_ else self.client.zcard(key))
        rounds = 1000 + 20 * (size // self.batch + 1)
        cursor = 0
        read = 0
        for _ in range(rounds):
            if hash_:
                cursor, fields = self.client.hscan(key, cursor, count=self.batch)
                items: list[Any] = list(fields.items())  # type: ignore[union-attr]
            else:
                cursor, items = self.client.zscan(key, cursor, count=self.batch)
            read += len(items)
            if items:
                yield items
            if cursor == 0:
                break
        else:
            logger.warning(
                "doctor %s: the scan of %s stopped after %d rounds; run it again",
                self.keys.namespace,
                key,
                rounds,
            )
            report.incomplete = True
        name = key.rsplit(":", 1)[-1]
        report.scanned[name] = report.scanned.get(name, 0) + read

    def _unrecorded(self, report: Report, kind: str, key: str) -> None:
        """Ids in ``leases`` or ``delayed`` whose request has no record."""
        finding = report.findings[kind]
        found: set[bytes] = set()
        for items in self._scan(report, key):
            ids = [member for member, _ in items if member not in found]
            pipe = self.client.pipeline(transaction=True)
            for rid in ids:
                pipe.zscore(key, rid)
                pipe.hexists(self.keys.requests, rid)
            replies = pipe.execute()
            bad = [
                rid
                for i, rid in enumerate(ids)
                if replies[2 * i] is not None and not replies[2 * i + 1]
            ]
            for rid in bad:
                found.add(rid)
                finding.add({"id": _text(rid)}, self.samples)
            if bad and report.repair:
                removed = self.scripts.unrecorded(
                    keys=self.keys.script_keys("doctor_unrecorded", key), args=bad
                )
                finding.repaired += int(removed)

    def _records(self, report: Report) -> None:
        """Records not leased, not waiting (a retry, a revisit), whose entry is not queued
        either."""
        k = self.keys
        finding = report.findings["orphan_record"]
        found: set[bytes] = set()
        for items in self._scan(report, k.requests, hash_=True):
            items = [(rid, record) for rid, record in items if rid not in found]
            pipe = self.client.pipeline(transaction=True)
            for rid, record in items:
                pipe.hget(k.requests, rid)
                pipe.zscore(k.leases, rid)
                pipe.zscore(k.delayed, rid)
                pipe.zscore(k.revisits, rid)
                pipe.zscore(k.queue, record[TOKEN_BYTES:])
            replies = pipe.execute()
            args: list[bytes] = []
            for i, (rid, record) in enumerate(items):
                now, leased, delayed, revisit, queued = replies[5 * i : 5 * i + 5]
                if now != record or leased is not None or delayed is not None:
                    continue
                if revisit is not None:
                    continue
                if queued is not None:
                    continue
                found.add(rid)
                problem = record_problem(record)
                if problem is None:
                    slot = split_member(record[TOKEN_BYTES:]).slot
                    sample = {"id": _text(rid), "slot": slot}
                    letter = b""
                else:
                    reason = f"unparsable request record: {problem}"
                    sample = {"id": _text(rid), "reason": reason, "hex": _hex(record)}
                    letter = dead_letter(reason, raw=record, source="doctor", id=_text(rid))
                finding.add(sample, self.samples)
                args += [rid, record, letter]
            if args and report.repair:
                keys = k.script_keys("doctor_records")
                requeued, dead = self.scripts.records(keys=keys, args=args)
                finding.repaired += int(requeued) + int(dead)

    def _queue(self, report: Report) -> None:
        """Unparsable members, and slots with members that are missing from ``ready``, in
        the queue and in the revisit queue (due revisits share their slot's turns)."""
        missing: set[bytes] = set()
        for queue in (self.keys.queue, self.keys.revisit_queue):
            self._queue_members(report, queue, missing)

    def _queue_members(self, report: Report, queue: str, missing: set[bytes]) -> None:
        k = self.keys
        bad = report.findings["unparsable"]
        unready = report.findings["slot_not_ready"]
        found: set[bytes] = set()
        for items in self._scan(report, queue):
            poison: list[bytes] = []
            slots: set[bytes] = set()
            for member, _ in items:
                try:
                    slots.add(split_member(member).slot.encode())
                    continue
                except QueueEntryError as exc:
                    problem = str(exc)
                if member in found:
                    continue
                found.add(member)
                what = "queue" if queue == k.queue else "revisit queue"
                reason = f"unparsable {what} entry: {problem}"
                bad.add(
                    {"reason": reason, "length": len(member), "hex": _hex(member)}, self.samples
                )
                poison += [member, dead_letter(reason, raw=member, source="doctor")]
            if poison and report.repair:
                moved = self.scripts.quarantine(
                    keys=k.script_keys("doctor_quarantine", queue), args=poison
                )
                bad.repaired += int(moved)
            self._check_ready(report, sorted(slots - missing), missing, unready)

    def _check_ready(
        self, report: Report, slots: list[bytes], missing: set[bytes], finding: Finding
    ) -> None:
        if not slots:
            return
        k = self.keys
        scores = self.client.zmscore(k.ready, slots)  # type: ignore[arg-type]
        suspects = [slot for slot, score in zip(slots, scores, strict=True) if score is None]
        if not suspects:
            return
        # confirm in one transaction: the slot's last entry may have been leased since
        pipe = self.client.pipeline(transaction=True)
        for slot in suspects:
            pipe.zscore(k.ready, slot)
            for queue in (k.queue, k.revisit_queue):
                pipe.zlexcount(queue, b"[" + slot + b"\0", b"(" + slot + b"\1")
        replies = pipe.execute()
        confirmed = []
        for i, slot in enumerate(suspects):
            score, requests, revisits = replies[3 * i : 3 * i + 3]
            queued = requests + revisits
            if score is None and queued:
                missing.add(slot)
                confirmed.append(slot)
                finding.add({"slot": _text(slot), "queued": int(queued)}, self.samples)
        if confirmed and report.repair:
            added = self.scripts.ready(keys=k.script_keys("doctor_ready"), args=confirmed)
            finding.repaired += int(added)

    def _inflight(self, report: Report) -> None:
        """``inflight`` against the leases, in one script (O(leases))."""
        k = self.keys
        mode = "fix" if report.repair else "check"
        out = self.scripts.inflight(keys=k.script_keys("doctor_inflight"), args=[mode])
        finding = report.findings["inflight_mismatch"]
        for i in range(0, len(out), 3):
            slot, stored, counted = out[i : i + 3]
            sample = {
                "slot": _text(slot),
                "stored": _count(stored),
                "leases": int(counted),
            }
            finding.add(sample, self.samples)
        if report.repair:
            finding.repaired = finding.found


def _count(stored: bytes) -> int | str | None:
    """An ``inflight`` value as stored: None when absent, the text when not a number."""
    if stored == b"":
        return None
    try:
        return int(stored)
    except ValueError:
        return _text(stored)


# ---------------------------------------------------------------------- scrapy-redis leftovers

#: scrapy-redis 0.9.1 settings and what a distcrawl project writes instead
#: (docs/migrating.md). Left in a project they do nothing, or worse: a project's SCHEDULER or
#: DUPEFILTER_CLASS wins over the add-on's, and scrapy-redis' stats collector writes
#: ``<spider>:stats``, a key of distcrawl's own.
SCRAPY_REDIS_SETTINGS: dict[str, str] = {
    "SCHEDULER_PERSIST": "remove it: the frontier always persists; `distcrawl reset` clears it",
    "SCHEDULER_FLUSH_ON_START": "use DISTCRAWL_FLUSH_ON_START",
    "SCHEDULER_QUEUE_CLASS": "remove it: one queue, by priority, then in the order queued",
    "SCHEDULER_QUEUE_KEY": "use DISTCRAWL_NAMESPACE (the queue is <ns>:queue)",
    "SCHEDULER_DUPEFILTER_KEY": "use DISTCRAWL_NAMESPACE (the seen-set is <ns>:seen)",
    "SCHEDULER_DUPEFILTER_CLASS": "remove it (DISTCRAWL_SEEN picks a set or a Bloom filter)",
    "SCHEDULER_SERIALIZER": "use DISTCRAWL_SERIALIZER (msgpack or json: data, never code)",
    "SCHEDULER_IDLE_BEFORE_CLOSE": "use DISTCRAWL_IDLE_TIMEOUT (and DISTCRAWL_IDLE_POLL_MAX)",
    "MAX_IDLE_TIME_BEFORE_CLOSE": "use DISTCRAWL_IDLE_TIMEOUT (None: stay up, as 0 was)",
    "REDIS_START_URLS_KEY": "use DISTCRAWL_NAMESPACE (start URLs are <ns>:start_urls)",
    "REDIS_START_URLS_AS_SET": "remove it: start_urls is a LIST; JSON entries carry a priority",
    "REDIS_START_URLS_AS_ZSET": "remove it: start_urls is a LIST; JSON entries carry a priority",
    "REDIS_START_URLS_BATCH_SIZE": "use DISTCRAWL_START_URLS_BATCH",
    "REDIS_HOST": "use REDIS_URL",
    "REDIS_PORT": "use REDIS_URL",
    "REDIS_PARAMS": "use REDIS_URL and DISTCRAWL_SOCKET_TIMEOUT",
    "REDIS_ENCODING": "remove it: start_urls entries are UTF-8",
    "STATS_KEY": "remove it with STATS_CLASS: distcrawl keeps cluster totals in <ns>:stats",
}
#: component settings whose scrapy-redis value replaces distcrawl's add-on
SCRAPY_REDIS_COMPONENTS: dict[str, str] = {
    "SCHEDULER": "remove it: the add-on sets distcrawl's, and a project's value wins over it",
    "DUPEFILTER_CLASS": "remove it: the add-on sets distcrawl's, a project's value wins over it",
    "STATS_CLASS": "remove it: RedisStatsCollector writes <spider>:stats, a key of distcrawl's",
}


def scrapy_redis_leftovers(settings: Any) -> list[tuple[str, str]]:
    """(setting, what to do) for each scrapy-redis setting still in ``settings`` (Scrapy
    settings; only those set above Scrapy's defaults count)."""
    found: list[tuple[str, str]] = []
    for name, advice in SCRAPY_REDIS_COMPONENTS.items():
        value = settings.get(name)
        if "scrapy_redis" in str(getattr(value, "__module__", None) or value or ""):
            found.append((name, advice))
    for name, advice in SCRAPY_REDIS_SETTINGS.items():
        if settings.get(name) is not None:
            found.append((name, advice))
    return found
