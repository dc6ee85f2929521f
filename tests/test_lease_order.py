"""A lease's order across download slots, against a real redis-server.

Scrapy's ``DownloaderAwarePriorityQueue`` (its default queue to be) takes equal priorities
from the download slots in turn (a1, b1, a2, b2), so that a broad crawl's first seconds go
to many sites, not to the first few. Its own tests (tests/test_pqueues.py
``test_tie_breaking_rotates_slots`` and
``test_tie_breaking_keeps_rotation_after_selected_slot_is_deleted``; tests/test_scheduler.py
``test_logic``) are adapted here to distcrawl's lease, whose order is
the order a worker hands its requests to the engine in (Leases.hand_out).
"""

from __future__ import annotations

import pytest

from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.records import Entry, EntryKind, Politeness

#: the frontier's scripts, on Valkey too
pytestmark = pytest.mark.valkey


def frontier_of(redis_client, **options) -> Frontier:
    return Frontier(redis_client, FrontierKeys("t"), Politeness(**options))


@pytest.fixture
def frontier(redis_client):
    return frontier_of(redis_client)


def push(frontier: Frontier, *requests: tuple[str, str] | tuple[str, str, int]) -> None:
    """(name, slot[, priority]) in the order given, in one commit; the name is the payload."""
    entries = []
    for name, slot, *priority in requests:
        prio = priority[0] if priority else 0
        entries.append(Entry(EntryKind.REQUEST, name.encode(), prio, name.encode(), b"", slot))
    assert frontier.commit([], entries).enqueued == len(entries)


def names(items) -> list[str]:
    return [x.payload.decode() for x in items]


def test_tie_breaking_rotates_slots(frontier):
    push(frontier, ("a1", "slot-a"), ("b1", "slot-b"), ("a2", "slot-a"), ("b2", "slot-b"))
    got = frontier.lease(4, 10_000).items
    assert [x.slot for x in got] == ["slot-a", "slot-b", "slot-a", "slot-b"]
    assert names(got) == ["a1", "b1", "a2", "b2"]


def test_tie_breaking_keeps_rotation_after_a_slot_runs_out(frontier):
    push(frontier, ("a1", "slot-a"), ("a2", "slot-a"), ("b1", "slot-b"), ("c1", "slot-c"))
    got = frontier.lease(4, 10_000).items
    assert [x.slot for x in got] == ["slot-a", "slot-b", "slot-c", "slot-a"]


URLS_WITH_SLOTS = [("a", "a"), ("b", "a"), ("c", "b"), ("d", "b"), ("e", "c"), ("f", "c")]


def fair(enqueued: list[str], dequeued: list[str]) -> bool:
    """Scrapy's ``_is_scheduling_fair``: each run of len(slots) dequeued requests has no slot
    twice."""
    if len(dequeued) != len(enqueued):
        return False
    width = len(set(enqueued))
    return all(
        len(set(dequeued[i : i + width])) == len(dequeued[i : i + width])
        for i in range(0, len(dequeued), width)
    )


@pytest.mark.parametrize("count", [6, 3, 2, 1])
def test_logic(frontier, count):
    """DownloaderAwarePriorityQueue's ``test_logic``: all six requests, leased ``count`` at a
    time, come out fairly over the three slots."""
    push(frontier, *URLS_WITH_SLOTS)
    dequeued: list[str] = []
    for _ in range(6 // count):
        dequeued += [x.slot for x in frontier.lease(count, 10_000).items]
    assert fair([slot for _, slot in URLS_WITH_SLOTS], dequeued), dequeued


def test_a_lease_smaller_than_the_ready_slots_takes_from_each_in_turn(redis_client):
    """Three sites of 8 pages each, 8 places per site, a worker asking for 6: two of each site,
    not six of the first."""
    frontier = frontier_of(redis_client, concurrency=8)
    push(frontier, *[(f"{s}{i}", f"{s}.test") for s in "abc" for i in range(8)])
    got = frontier.lease(6, 10_000).items
    assert [x.slot for x in got] == ["a.test", "b.test", "c.test"] * 2
    assert names(got) == ["a0", "b0", "c0", "a1", "b1", "c1"]
    # and the slots' places count what each gave
    assert redis_client.hgetall("t:inflight") == {b"a.test": b"2", b"b.test": b"2", b"c.test": b"2"}


def test_a_slot_short_of_its_turn_leaves_the_rest_to_the_others(redis_client):
    frontier = frontier_of(redis_client, concurrency=8)
    push(frontier, ("a0", "a.test"), *[(f"b{i}", "b.test") for i in range(8)])
    got = frontier.lease(6, 10_000).items
    assert names(got) == ["a0", "b0", "b1", "b2", "b3", "b4"]


def test_priority_comes_before_the_rotation_and_each_slot_keeps_its_order(frontier):
    push(
        frontier,
        ("a-low", "a", 0),
        ("a-high", "a", 5),
        ("a-high2", "a", 5),
        ("b-low", "b", 0),
        ("b-low2", "b", 0),
        ("c-high", "c", 5),
    )
    got = frontier.lease(6, 10_000).items
    assert names(got) == ["a-high", "c-high", "a-high2", "a-low", "b-low", "b-low2"]


def test_a_single_slot_is_leased_in_its_order_in_one_turn(frontier, redis_client):
    push(frontier, *[(f"{i:03d}", "one.test") for i in range(300)])
    redis_client.config_resetstat()
    got = frontier.lease(300, 10_000).items
    assert names(got) == [f"{i:03d}" for i in range(300)]
    # one range read of the slot, as before the rotation: its turn is not cut into pieces
    assert calls(redis_client, "zrangebylex") == 1


def calls(redis_client, command: str) -> int:
    return int(redis_client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_the_rotation_costs_no_more_reads_with_more_ready_slots(redis_client):
    """A lease looks at each slot it takes from, not at every ready slot: 1,000 ready slots
    and a lease of 4 read 4 slots' entries and their limits, as 4 ready slots do."""

    def reads(slots: int) -> tuple[int, int]:
        redis_client.flushdb()
        frontier = frontier_of(redis_client, concurrency=8, scan=2000)
        push(frontier, *[(f"s{i}-{j}", f"s{i:04d}") for i in range(slots) for j in range(2)])
        redis_client.config_resetstat()
        assert len(frontier.lease(4, 10_000).items) == 4
        return calls(redis_client, "zrangebylex"), calls(redis_client, "hget")

    few, many = reads(4), reads(1000)
    print(f"range reads and HGETs of a lease of 4: {few} with 4 slots, {many} with 1,000")
    assert many == few
    assert many[0] == 4


def test_a_worker_fetches_equal_priority_pages_of_several_sites_in_turn(
    demo_site, workers, redis_client
):
    """Scrapy's ``test_logic`` with a real worker: four pages of each of three sites, pushed
    site after site at one priority, all leased at once (DISTCRAWL_PREFETCH = 12) and fetched
    one at a time (CONCURRENT_REQUESTS = 1): the sites' own request logs show them taken in
    turn. Before, a lease took a site's four
    pages, then the next site's: a, a, a, a, b, b, b, b, c, c, c, c."""
    from scrapy.settings import Settings

    from distcrawl.producer import Producer

    sites = [demo_site(pages=4, links=1, host=f"127.0.0.{n}") for n in (2, 3, 4)]
    settings = Settings()
    settings.setmodule("distcrawl.settings")
    with Producer(redis_client, "site", settings) as producer:
        results = producer.push_many([f"{site.url}/page/{n}" for site in sites for n in range(4)])
    assert len(results) == 12
    settings = {"CONCURRENT_REQUESTS": 1, "DISTCRAWL_PREFETCH": 12, "ROBOTSTXT_OBEY": False}
    worker = workers(1, DISTCRAWL_IDLE_TIMEOUT=3, **settings)
    assert worker.wait(120) == 0, worker.log()[-3000:]

    host = {site.url: site.host for site in sites}
    arrivals = sorted(
        (line.arrived, host[site.url])
        for site in sites
        for line in site.read_log()
        if line.path.startswith("/page/")
    )
    dequeued = [h for _, h in arrivals]
    print(f"fetch order: {' '.join(h.rsplit('.', 1)[1] for h in dequeued)}")
    assert fair([site.host for site in sites for _ in range(4)], dequeued), dequeued
