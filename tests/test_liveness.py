"""Liveness beats: the server's clock, their own thread, clean and unclean stops, a Redis
restart; against a real redis-server."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from distcrawl.engine.liveness import Liveness
from distcrawl.model.keys import FrontierKeys
from tests.support import server_ms, wait_until

pytestmark = pytest.mark.timeout(60)

KEYS = FrontierKeys("site")
TAG = "0a1b2c3d"


def score(client, tag: str = TAG) -> float | None:
    return client.zscore(KEYS.alive, tag)


@pytest.fixture
def make_liveness(redis_url: str) -> Iterator:
    """Factory; every Liveness made is stopped (uncleanly, as the test may have) at the end."""
    made: list[Liveness] = []

    def factory(
        tag: str = TAG, url: str = redis_url, interval: float = 0.05, own_after: float | None = None
    ) -> Liveness:
        liveness = Liveness(
            url, KEYS, tag, interval=interval, socket_timeout=1.0, own_after=own_after
        )
        made.append(liveness)
        return liveness

    yield factory
    for liveness in made:
        liveness.stop(clean=False)


def test_no_io_before_start(make_liveness, redis_client):
    # an unreachable URL: building one must not connect (it happens on the reactor thread)
    liveness = make_liveness(url="redis://127.0.0.1:1/0")
    assert liveness.beats == 0
    assert score(redis_client) is None


@pytest.mark.parametrize("tag", ["", "0a1b2c3", "0a1b2c3d4", "0a1b2c3g", "site:1"])
def test_a_tag_is_eight_hex_characters(redis_url, tag):
    with pytest.raises(ValueError, match="tag"):
        Liveness(redis_url, KEYS, tag, interval=1.0, socket_timeout=1.0)


def test_a_beat_is_stamped_with_the_server_clock(make_liveness, redis_client, monkeypatch):
    # a host clock a day off must not show: the score comes from Redis' TIME
    skewed = time.time() + 86400
    monkeypatch.setattr(time, "time", lambda: skewed)
    before = server_ms(redis_client)
    make_liveness().beat()
    after = server_ms(redis_client)
    assert before <= score(redis_client) <= after


def test_repeated_beats_move_the_score_forward(make_liveness, redis_client):
    liveness = make_liveness()
    liveness.beat()
    first = score(redis_client)
    # the server clock has ms resolution: wait (bounded) until it has moved on
    assert wait_until(lambda: server_ms(redis_client) > first, timeout=5, step=0.005)
    liveness.beat()
    assert score(redis_client) > first
    assert liveness.beats == 2


def test_clean_stop_removes_the_tag_and_an_unclean_one_leaves_it(make_liveness, redis_client):
    leaving, crashing = make_liveness(TAG), make_liveness("deadbeef")
    leaving.start()
    crashing.start()
    assert wait_until(lambda: redis_client.zcard(KEYS.alive) == 2, timeout=10)
    leaving.stop(clean=True)
    crashing.stop(clean=False)
    assert score(redis_client, TAG) is None
    last = score(redis_client, "deadbeef")
    assert last is not None
    # stopped means stopped: no thread re-adds or moves anything, and beat() is a no-op now
    leaving.beat()
    time.sleep(0.3)  # six intervals; a leftover thread would have beaten meanwhile
    assert score(redis_client, TAG) is None
    assert score(redis_client, "deadbeef") == last


def test_start_beats_at_once(make_liveness, redis_client):
    liveness = make_liveness(interval=30.0)  # the next tick is far away
    liveness.start()
    assert wait_until(lambda: score(redis_client) is not None, timeout=10)
    liveness.stop(clean=True)  # prompt, although the thread sleeps for 30 s
    assert score(redis_client) is None


def advanced_while(busy, liveness: Liveness, redis_client) -> None:
    """Beats go on while the main thread is held by ``busy`` (bounded)."""
    liveness.start()
    assert wait_until(lambda: score(redis_client) is not None, timeout=10)
    first, beats = score(redis_client), liveness.beats
    busy(beats)
    assert liveness.beats >= beats + 3
    assert score(redis_client) > first


def test_beats_go_on_while_the_main_thread_sleeps(make_liveness, redis_client):
    def asleep(beats: int) -> None:
        time.sleep(1.0)  # twenty intervals

    advanced_while(asleep, make_liveness(), redis_client)


def test_beats_go_on_while_the_main_thread_computes(make_liveness, redis_client):
    liveness = make_liveness()

    def computing(beats: int) -> None:
        # a pure-Python loop (it holds the GIL between switches), like a long parse on the
        # reactor; it reads only memory, and ends after three beats or 10 s
        deadline = time.monotonic() + 10
        n = 0
        while liveness.beats < beats + 3 and time.monotonic() < deadline:
            n += sum(i * i for i in range(1000))

    advanced_while(computing, liveness, redis_client)


def test_a_redis_restart_is_survived(make_liveness, redis_server, redis_client, caplog):
    caplog.set_level(logging.INFO, logger="distcrawl.engine.liveness")
    liveness = make_liveness()
    liveness.start()
    assert wait_until(lambda: score(redis_client) is not None, timeout=10)
    redis_server.kill()  # keeps port and directory, loses the (not persisted) ZSET
    assert wait_until(lambda: any(r.levelno == logging.WARNING for r in caplog.records), timeout=10)
    redis_server.restart()
    assert wait_until(lambda: score(redis_client) is not None, timeout=10)
    assert wait_until(lambda: any(r.levelno == logging.INFO for r in caplog.records), timeout=10)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # one per outage, not one per failed beat
    assert "failing" in warnings[0].getMessage()
    assert liveness._thread is not None and liveness._thread.is_alive()


@pytest.mark.integration
def test_the_password_never_reaches_the_log(caplog, tmp_path):
    from distcrawl.testing.redis_server import RedisServer

    with RedisServer(directory=tmp_path / "secret", password="s3cret") as server:
        liveness = Liveness(server.url, KEYS, TAG, interval=0.05, socket_timeout=1.0)
        liveness.start()
        try:
            with server.client() as client:
                assert wait_until(lambda: score(client) is not None, timeout=10)
            server.kill()
            assert wait_until(lambda: "failing" in caplog.text, timeout=10)
        finally:
            liveness.stop(clean=False)
    assert "s3cret" not in caplog.text
    assert ":***@127.0.0.1" in caplog.text


def test_stop_is_bounded_when_redis_hangs(caplog):
    import socket

    # a peer that completes the TCP handshake (listen backlog) and never answers
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        liveness = Liveness(url, KEYS, TAG, interval=0.05, socket_timeout=0.5)
        liveness.start()
        time.sleep(0.1)  # the first beat is now waiting for its reply
        started = time.monotonic()
        liveness.stop(clean=True)
        # one Redis call (0.5 s) plus JOIN_MARGIN, for the beat and the ZREM each; generous
        assert time.monotonic() - started < 10
    assert liveness.beats == 0


def test_the_thread_beats_only_when_no_batch_carried_a_beat(make_liveness, redis_client):
    """Beats riding with batches (noted) keep the thread quiet; once they stop, as when the
    Redis thread is stuck, the thread beats again within ``own_after``."""
    liveness = make_liveness(interval=0.2, own_after=0.8)
    liveness.start()
    deadline = time.monotonic() + 5
    while liveness.beats < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    first = score(redis_client)
    assert first is not None
    assert not liveness.due()  # just beaten
    for _ in range(8):  # a batch beat every 0.2 s (the thread would beat after 0.8 s)
        time.sleep(0.2)
        assert liveness.due()  # half an interval old: the next batch carries one
        liveness.noted()
    assert score(redis_client) == first  # the thread stayed quiet
    time.sleep(1.5)  # no batch now: the thread beats on its own
    moved = score(redis_client)
    assert moved is not None and moved > first
