"""``distcrawl doctor`` against a real redis-server: a frontier corrupted by hand, mixed
with healthy state that must come through the repair untouched."""

from __future__ import annotations

import json

import pytest

from distcrawl.admin.doctor import Doctor, record_problem
from distcrawl.cli import main
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import entry_problem, make_entry

pytestmark = pytest.mark.timeout(60)

SITE = FrontierKeys("site")
TOKEN = b"wrk1" + b"\x01\x02\x03\x04"
ZERO = b"\0" * 8
FAR = 2**45  # a lease deadline / due time far in the future (ms)

POISON_SHORT = b"poison.example\0" + b"\x00\x01"
POISON_NO_SEP = b"no separator at all"
POISON_UTF8 = b"\xff\xfe\0" + bytes(10) + b"payload" * 10  # long: its hex is cut short


def rid(seq: int) -> bytes:
    return seq.to_bytes(6, "big").hex().encode()


def entry(slot: str, seq: int) -> bytes:
    return make_entry(slot, 0, seq, b"payload-%d" % seq)


def build(client):
    """Healthy state plus one of each problem; returns the healthy snapshot to compare."""
    k = SITE
    # healthy: queued entries of two slots, both ready
    client.zadd(k.queue, {entry("a.example", 1): 0, entry("a.example", 2): 0})
    client.zadd(k.queue, {entry("b.example", 3): 0})
    client.zadd(k.ready, {b"a.example": 1, b"b.example": 2})
    # healthy: a leased request, counted in flight
    client.hset(k.requests, rid(4), TOKEN + entry("c.example", 4))
    client.zadd(k.leases, {rid(4): FAR})
    client.hset(k.inflight, b"c.example", 1)
    # healthy: an expired lease that was requeued (record kept, entry back in the queue)
    client.hset(k.requests, rid(5), TOKEN + entry("a.example", 5))
    client.zadd(k.queue, {entry("a.example", 5): 0})
    # healthy: a retry waiting in delayed
    client.hset(k.requests, rid(6), ZERO + entry("d.example", 6))
    client.zadd(k.delayed, {rid(6): FAR})

    # unparsable queue members
    client.zadd(k.queue, {POISON_SHORT: 0, POISON_NO_SEP: 0, POISON_UTF8: 0})
    # a slot with queued entries missing from ready; its delay still runs
    client.zadd(k.queue, {entry("lost.example", 7): 0, entry("lost.example", 8): 0})
    client.hset(k.slots, b"lost.example", FAR)
    # a lease without a record
    client.zadd(k.leases, {rid(9): FAR})
    # records nothing refers to: one parses, one does not
    client.hset(k.requests, rid(10), TOKEN + entry("orphan.example", 10))
    client.hset(k.requests, rid(11), TOKEN + b"garbage")
    # a retry without a record
    client.zadd(k.delayed, {rid(12): FAR})
    # in-flight counts: too high, missing, and for a slot with no lease at all
    client.hset(k.requests, rid(13), TOKEN + entry("e.example", 13))
    client.zadd(k.leases, {rid(13): FAR})
    client.hset(k.inflight, b"e.example", 5)
    client.hset(k.requests, rid(14), TOKEN + entry("g.example", 14))
    client.zadd(k.leases, {rid(14): FAR})
    client.hset(k.inflight, b"ghost.example", 2)


EXPECTED_FOUND = {
    "lease_without_record": 1,
    "delayed_without_record": 1,
    "orphan_record": 2,
    "unparsable": 3,
    "slot_not_ready": 1,
    "inflight_mismatch": 3,
}


def found(report):
    return {kind: f.found for kind, f in report.findings.items()}


def test_entry_and_record_rules():
    assert entry_problem(entry("a.example", 1)) is None
    assert entry_problem(POISON_SHORT) == "fewer than 10 bytes after the slot"
    assert entry_problem(POISON_NO_SEP) == "no \\0 after the slot"
    assert entry_problem(POISON_UTF8) == "slot is not valid UTF-8"
    assert entry_problem(b"\0" + bytes(10)) == "empty slot"
    assert entry_problem(b"x" * 256 + b"\0" + bytes(10)) == "slot longer than 255 bytes"
    assert entry_problem(b"x" * 255 + b"\0" + bytes(10)) is None
    assert record_problem(TOKEN + entry("a.example", 1)) is None
    assert record_problem(b"short") == "record shorter than its 8-byte token"


def test_report_names_exactly_the_problems_and_changes_nothing(redis_client):
    build(redis_client)
    before = {key: redis_client.dump(key) for key in SITE.all()}
    report = Doctor(redis_client, SITE).examine()
    assert found(report) == EXPECTED_FOUND
    assert not report.clean and not report.resolved
    assert {key: redis_client.dump(key) for key in SITE.all()} == before

    f = report.findings
    assert f["lease_without_record"].samples == [{"id": rid(9).decode()}]
    assert f["delayed_without_record"].samples == [{"id": rid(12).decode()}]
    assert f["slot_not_ready"].samples == [{"slot": "lost.example", "queued": 2}]
    orphans = {s["id"]: s for s in f["orphan_record"].samples}
    assert orphans[rid(10).decode()] == {"id": rid(10).decode(), "slot": "orphan.example"}
    assert orphans[rid(11).decode()]["hex"] == (TOKEN + b"garbage").hex()
    reasons = sorted(s["reason"] for s in f["unparsable"].samples)
    assert reasons == [
        "unparsable queue entry: fewer than 10 bytes after the slot",
        "unparsable queue entry: no \\0 after the slot",
        "unparsable queue entry: slot is not valid UTF-8",
    ]
    assert {s["hex"] for s in f["unparsable"].samples} == {
        POISON_SHORT.hex(),
        POISON_NO_SEP.hex(),
        POISON_UTF8[:32].hex() + "...",
    }
    inflight = {s["slot"]: (s["stored"], s["leases"]) for s in f["inflight_mismatch"].samples}
    assert inflight == {"e.example": (5, 1), "g.example": (None, 1), "ghost.example": (2, 0)}
    assert report.scanned == {
        "leases": 4,
        "delayed": 2,
        "requests": 7,
        "queue": 9,
        "revisit_queue": 0,
    }


def test_repair_fixes_everything_and_keeps_the_healthy_state(redis_client):
    k = SITE
    build(redis_client)
    report = Doctor(redis_client, k).examine(repair=True)
    assert found(report) == EXPECTED_FOUND
    assert {kind: f.repaired for kind, f in report.findings.items()} == EXPECTED_FOUND
    assert report.resolved
    # requeued records and a re-armed slot: parked workers are woken for them
    assert redis_client.llen(k.wake) == 3

    queue = set(redis_client.zrange(k.queue, 0, -1))
    assert queue == {
        entry("a.example", 1),
        entry("a.example", 2),
        entry("b.example", 3),
        entry("a.example", 5),
        entry("lost.example", 7),
        entry("lost.example", 8),
        entry("orphan.example", 10),
    }
    ready = dict(redis_client.zrange(k.ready, 0, -1, withscores=True))
    assert (ready[b"a.example"], ready[b"b.example"]) == (1, 2)  # untouched
    assert ready[b"lost.example"] == FAR  # at its next allowed time, not now
    assert b"orphan.example" in ready
    assert set(redis_client.zrange(k.leases, 0, -1)) == {rid(4), rid(13), rid(14)}
    assert redis_client.zrange(k.delayed, 0, -1) == [rid(6)]
    assert set(redis_client.hkeys(k.requests)) == {rid(4), rid(5), rid(6), rid(13), rid(14)}
    assert redis_client.hget(k.requests, rid(6)) == ZERO + entry("d.example", 6)
    assert redis_client.hgetall(k.inflight) == {
        b"c.example": b"1",
        b"e.example": b"1",
        b"g.example": b"1",
    }
    assert redis_client.hget(k.stats, "quarantined") == b"4"
    letters = [json.loads(raw) for raw in redis_client.lrange(k.dead, 0, -1)]
    assert {d["source"] for d in letters} == {"doctor"}
    assert sorted(d["reason"] for d in letters) == [
        "unparsable queue entry: fewer than 10 bytes after the slot",
        "unparsable queue entry: no \\0 after the slot",
        "unparsable queue entry: slot is not valid UTF-8",
        "unparsable request record: no \\0 after the slot",
    ]
    assert {d["raw"] for d in letters if "queue" in d["reason"]} >= {
        POISON_SHORT.decode("latin-1"),
        POISON_NO_SEP.decode(),
    }

    again = Doctor(redis_client, k).examine()
    assert again.clean and again.problems == 0


def test_the_revisit_queue_is_examined_and_repaired_as_the_queue_is(redis_client):
    """Due revisits wait in ``revisit_queue`` for their slot's turn in ``ready``: a slot
    holding only revisits that is missing from ``ready`` would never be leased."""
    k = SITE
    redis_client.zadd(k.queue, {entry("a.example", 1): 0})
    redis_client.zadd(k.ready, {b"a.example": 1})  # not empty: lease.lua's own check is off
    redis_client.zadd(k.revisit_queue, {entry("fresh.example", 2): 0, POISON_NO_SEP: 0})
    report = Doctor(redis_client, k).examine()
    assert report.findings["slot_not_ready"].samples == [{"slot": "fresh.example", "queued": 1}]
    reasons = [s["reason"] for s in report.findings["unparsable"].samples]
    assert reasons == ["unparsable revisit queue entry: no \\0 after the slot"]
    assert report.scanned["revisit_queue"] == 2

    repaired = Doctor(redis_client, k).examine(repair=True)
    assert repaired.resolved
    assert redis_client.zrange(k.revisit_queue, 0, -1) == [entry("fresh.example", 2)]
    assert redis_client.zscore(k.ready, b"fresh.example") is not None
    (letter,) = [json.loads(raw) for raw in redis_client.lrange(k.dead, 0, -1)]
    assert (letter["reason"], letter["raw"]) == (reasons[0], POISON_NO_SEP.decode())
    assert Doctor(redis_client, k).examine().clean


def test_repairs_recheck_each_item(redis_client):
    """What a worker fixed or changed between the scan and the repair is left alone."""
    k = SITE
    doctor = Doctor(redis_client, k)
    # the lease got its record meanwhile: not removed
    redis_client.zadd(k.leases, {rid(1): FAR})
    redis_client.hset(k.requests, rid(1), TOKEN + entry("a.example", 1))
    assert doctor.scripts.unrecorded(keys=[k.leases, k.requests], args=[rid(1)]) == 0
    assert redis_client.zscore(k.leases, rid(1)) == FAR
    # the poison member was taken meanwhile: no dead letter, no count
    assert doctor.scripts.quarantine(keys=[k.queue, k.dead, k.stats], args=[b"x", b"{}"]) == 0
    assert redis_client.llen(k.dead) == 0 and redis_client.hget(k.stats, "quarantined") is None
    # the record changed (leased again) since it was read: untouched
    record = TOKEN + entry("b.example", 2)
    redis_client.hset(k.requests, rid(2), b"newtoken" + entry("b.example", 2))
    keys = [k.requests, k.leases, k.delayed, k.queue, k.ready, k.slots, k.dead, k.stats]
    assert doctor.scripts.records(keys=keys, args=[rid(2), record, b""]) == [0, 0]
    assert redis_client.zcard(k.queue) == 0
    # the slot's last entry was leased meanwhile: not made ready
    assert doctor.scripts.ready(keys=k.script_keys("doctor_ready"), args=[b"b.example"]) == 0
    assert redis_client.zcard(k.ready) == 0


def test_large_queue_is_scanned_in_batches(redis_client):
    k = SITE
    entries = {entry(f"s{i % 50}.example", i): 0 for i in range(1, 3001)}
    redis_client.zadd(k.queue, entries)
    redis_client.zadd(k.ready, {f"s{i}.example".encode(): 0 for i in range(49)})  # s49 lost
    redis_client.zadd(k.queue, {b"bad-%d" % i: 0 for i in range(250)})
    report = Doctor(redis_client, k, batch=100, samples=2).examine(repair=True)
    assert report.scanned["queue"] >= 3250
    assert report.findings["unparsable"].found == 250
    assert report.findings["unparsable"].repaired == 250
    assert len(report.findings["unparsable"].samples) == 2
    assert report.findings["slot_not_ready"].samples == [{"slot": "s49.example", "queued": 60}]
    assert redis_client.zcard(k.queue) == 3000
    assert redis_client.hget(k.stats, "quarantined") == b"250"
    assert Doctor(redis_client, k, batch=100).examine().clean


# ---------------------------------------------------------------------- the command


def run(capsys, redis_url, *argv):
    code = main(["--redis-url", redis_url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_doctor_command_end_to_end(capsys, redis_url, redis_client):
    code, out, err = run(capsys, redis_url, "doctor", "site")
    assert (code, err) == (0, "")
    assert "no problems found" in out

    build(redis_client)
    code, out, err = run(capsys, redis_url, "doctor", "site")
    assert (code, err) == (1, "")
    lines = out.splitlines()
    for kind, count in EXPECTED_FOUND.items():
        assert any(line.split()[0] == str(count) and f"[{kind}]" in line for line in lines)
    assert "slot lost.example, queued 2" in out
    assert "--repair" in out

    code, out, _ = run(capsys, redis_url, "--json", "doctor", "site", "--samples", "1")
    assert code == 1
    data = json.loads(out)
    assert data["clean"] is False and data["repair"] is False
    assert {kind: p["found"] for kind, p in data["problems"].items()} == EXPECTED_FOUND
    assert all(len(p["samples"]) <= 1 for p in data["problems"].values())

    code, out, _ = run(capsys, redis_url, "doctor", "site", "--repair", "--json")
    assert code == 0
    data = json.loads(out)
    assert {kind: p["repaired"] for kind, p in data["problems"].items()} == EXPECTED_FOUND

    code, out, _ = run(capsys, redis_url, "doctor", "site")
    assert code == 0 and "no problems found" in out

    code, out, _ = run(capsys, redis_url, "status", "site")
    assert code == 0
    assert any(line.split()[:2] == ["quarantined", "4"] for line in out.splitlines()), out
    code, out, _ = run(capsys, redis_url, "--json", "status", "site")
    assert json.loads(out)["quarantined"] == 4


def test_doctor_usage(capsys, redis_url):
    assert main(["doctor", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: distcrawl doctor")
    assert run(capsys, redis_url, "doctor", "site", "--batch", "0")[0] == 2
    assert run(capsys, "redis://:s3cret@127.0.0.1:1/0", "doctor", "site")[0] == 3
    assert "s3cret" not in capsys.readouterr().err


def test_domains_survives_a_slot_that_is_not_utf8(capsys, redis_url, redis_client):
    redis_client.zadd(SITE.ready, {b"\xff\xfe": 0})
    redis_client.zadd(SITE.queue, {b"\xff\xfe\0" + bytes(10) + b"p": 0})
    code, out, _ = run(capsys, redis_url, "--json", "domains", "site")
    assert code == 0
    assert json.loads(out)[0]["slot"] == "\\xff\\xfe"
