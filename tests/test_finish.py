"""The crawl's lifecycle: "finished" decided once for the whole crawl (lua/finish.lua), one
completion event per run in ``<ns>:events``, and its webhook (DISTCRAWL_FINISH_WEBHOOK),
posted with retries, by another worker when the first is killed."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from scrapy.settings import Settings

from distcrawl.cli import main
from distcrawl.config import ConfigError, DistcrawlConfig
from distcrawl.engine.webhook import event_payload
from distcrawl.model.frontier import Frontier
from distcrawl.model.keys import FrontierKeys
from tests.support import page_fetches, wait_until

KEYS = FrontierKeys("t")
SITE = FrontierKeys("site")


def finish(client: Any, **options: Any) -> Any:
    frontier = Frontier(client, KEYS, tag="0a0b0c0d")
    return frontier.run(frontier.finish_op(**options))


def events(client: Any, keys: FrontierKeys = KEYS) -> list[tuple[bytes, dict[bytes, bytes]]]:
    return client.xrange(keys.events)


# ------------------------------------------------------------------ the decision, in Redis


def test_finished_once_per_run_with_one_event(redis_client):
    assert finish(redis_client) is None  # never had work: not finished
    redis_client.set(KEYS.seq, 5)
    redis_client.hset(KEYS.stats, mapping={"pages": 5, "items": 4})
    redis_client.rpush(KEYS.runnable, *[b"1"] * 8)  # the reaper's last count, mid-crawl
    done = finish(redis_client)
    assert done is not None and done.run == 1
    (entry,) = events(redis_client)
    assert entry[0].decode() == done.event
    assert entry[1][b"event"] == b"finished" and entry[1][b"stats.pages"] == b"5"
    assert redis_client.hget(KEYS.lifecycle, "state") == b"finished"
    # the autoscaling mirror, refreshed by the reaper while workers run, says 0 from the
    # finish on: a finished crawl's last count would have KEDA start workers for nothing
    assert not redis_client.exists(KEYS.runnable)
    # called again (another worker, or a reply lost and the call sent again): no new event
    assert finish(redis_client) is None
    assert len(events(redis_client)) == 1


def test_work_reopens_the_crawl_and_a_new_run_finishes_with_its_own_event(redis_client):
    redis_client.set(KEYS.seq, 5)
    assert finish(redis_client) is not None
    redis_client.lpush(KEYS.start_urls, "http://a.test/")
    assert finish(redis_client) is None
    assert redis_client.hget(KEYS.lifecycle, "state") == b"running"
    # the start URL was a duplicate: nothing numbered, the same run finishes again, no event
    redis_client.delete(KEYS.start_urls)
    assert finish(redis_client) is None
    assert redis_client.hget(KEYS.lifecycle, "state") == b"finished"
    assert len(events(redis_client)) == 1
    # new requests were stored and done: a second run, a second event
    redis_client.zadd(KEYS.queue, {b"x": 0})
    assert finish(redis_client) is None
    redis_client.delete(KEYS.queue)
    redis_client.set(KEYS.seq, 9)
    second = finish(redis_client)
    assert second is not None and second.run == 2
    assert len(events(redis_client)) == 2


@pytest.mark.parametrize(
    "work",
    ["queue", "revisit_queue", "leases", "delayed", "revisits", "start_urls", "elsewhere"],
)
def test_any_work_anywhere_keeps_it_running(work, redis_client):
    redis_client.set(KEYS.seq, 1)
    if work == "start_urls":
        redis_client.lpush(KEYS.start_urls, "http://a.test/")
    elif work != "elsewhere":
        redis_client.zadd(getattr(KEYS, work), {b"x": 1})
    assert finish(redis_client, elsewhere=1 if work == "elsewhere" else 0) is None
    assert events(redis_client) == []


def test_a_paused_crawl_is_not_finished(redis_client):
    redis_client.set(KEYS.seq, 1)
    redis_client.set(KEYS.paused, b"1")
    assert finish(redis_client) is None
    redis_client.delete(KEYS.paused)
    assert finish(redis_client) is not None


def test_sharded_signature_and_pending_webhook_mark(redis_client):
    # a sharded crawl's own keys number nothing: the caller gives the shards' signature
    assert finish(redis_client, signature=0, worked=False) is None
    done = finish(redis_client, signature=12, worked=True, webhook=True)
    assert done is not None
    assert redis_client.hget(KEYS.lifecycle, "webhook").decode() == done.event
    assert finish(redis_client, signature=12, worked=True) is None


def test_webhook_setting_and_payload():
    def parse(value: Any) -> str | None:
        return DistcrawlConfig.from_settings(
            Settings({"DISTCRAWL_FINISH_WEBHOOK": value})
        ).finish_webhook

    assert parse(None) is None
    assert parse("https://hooks.example/x") == "https://hooks.example/x"
    with pytest.raises(ConfigError, match="DISTCRAWL_FINISH_WEBHOOK") as refused:
        parse("ftp://user:hunter2@h/x")
    assert "hunter2" not in str(refused.value)
    body = event_payload(
        "site", "1-0", {b"event": b"finished", b"run": b"2", b"at": b"7", b"stats.pages": b"3"}
    )
    assert body == {
        "crawl": "site",
        "event": "finished",
        "id": "1-0",
        "run": 2,
        "at": 7,
        "by": "",
        "stats": {"pages": 3},
    }


# ------------------------------------------------------------------ real crawls


class Hook:
    """A webhook endpoint on 127.0.0.1: records every POST; answers 503 to the first
    ``fail`` of them, 200 after."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.posts: list[tuple[float, dict[str, str], dict[str, Any]]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(size))
                hook.posts.append((time.time(), dict(self.headers), body))
                status = 503 if len(hook.posts) <= hook.fail else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                return None

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/done"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Hook:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_two_workers_finish_once_within_2s_and_post_the_webhook(
    demo_site, workers, redis_client, redis_url, capsys
):
    site = demo_site(pages=60)
    with Hook(fail=1) as hook:
        settings = {"DISTCRAWL_IDLE_TIMEOUT": None, "DISTCRAWL_FINISH_WEBHOOK": hook.url}
        pool = [workers(i, **settings) for i in (1, 2)]
        redis_client.lpush("site:start_urls", site.url + "/")
        # the last commit: when the frontier was last seen going empty (Redis' clock), once
        # it had stored a request (a commit stores a page's children with its ack, so
        # nothing queued and nothing leased after that is the end)
        emptied: list[float] = []

        def finished() -> bool:
            pipe = redis_client.pipeline(transaction=True)
            pipe.zcard(SITE.queue).zcard(SITE.leases).llen(SITE.start_urls).exists(SITE.seq)
            pipe.time().xlen(SITE.events)
            queued, leased, start, numbered, (sec, usec), n = pipe.execute()
            empty = numbered and not (queued or leased or start)
            if not empty:
                emptied.clear()
            elif not emptied:
                emptied.append(sec + usec / 1e6)
            return bool(n)

        assert wait_until(finished, timeout=90), pool[0].log()[-2000:]
        assert wait_until(lambda: any(p[2].get("id") for p in hook.posts[1:]), timeout=30)
        time.sleep(2)  # no second event comes
        (entry,) = events(redis_client, SITE)
        event_id = entry[0].decode()
        finished_at = int(entry[1][b"at"]) / 1000
        assert emptied, "the frontier was never seen empty before the event"
        print(f"finish: event {finished_at - emptied[0]:.2f}s after the last commit")
        assert finished_at - emptied[0] < 2.0
        assert set(page_fetches(site)) == site.expected_pages()
        # the webhook: refused once (503), then delivered, the same id every time
        assert len(hook.posts) == 2, hook.posts
        assert {p[2]["id"] for p in hook.posts} == {event_id}
        assert {p[1]["Idempotency-Key"] for p in hook.posts} == {event_id}
        # the crawl-wide counters as the workers' beats had summed them by then
        assert isinstance(hook.posts[-1][2]["stats"], dict)
        assert wait_until(lambda: redis_client.hget(SITE.lifecycle, "webhook") is None, 10)
        # status says so
        capsys.readouterr()
        assert main(["--redis-url", redis_url, "--json", "status", "site"]) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "finished"
        for w in pool:
            assert w.alive(), w.log()[-2000:]
            assert "ERROR" not in w.log(), w.log()[-3000:]
        finishers = [w for w in pool if "Crawl finished" in w.log()]
        assert len(finishers) == 1


def test_a_worker_killed_at_finish_time_leaves_one_event_and_the_webhook_is_posted(
    demo_site, workers, redis_client
):
    """The worker that finished the crawl is SIGKILLed while its webhook is refused: the
    stream keeps its one event, and the survivor's reaper posts it."""
    site = demo_site(pages=30)
    with Hook(fail=1) as hook:
        settings = {"DISTCRAWL_IDLE_TIMEOUT": None, "DISTCRAWL_FINISH_WEBHOOK": hook.url}
        pool = [workers(i, **settings) for i in (1, 2)]
        redis_client.lpush("site:start_urls", site.url + "/")
        assert wait_until(lambda: hook.posts, timeout=90)
        finisher = next(w for w in pool if "Crawl finished" in w.log())
        survivor = next(w for w in pool if w is not finisher)
        finisher.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        assert finisher.wait(10) is not None
        # the survivor finds the dead worker and the pending event (its idle reap: 30 s)
        assert wait_until(lambda: len(hook.posts) >= 2, timeout=120), survivor.log()[-3000:]
        (entry,) = events(redis_client, SITE)
        assert {p[2]["id"] for p in hook.posts} == {entry[0].decode()}
        assert hook.posts[-1][2]["by"] == finisher_tag(finisher.log())
        assert wait_until(lambda: redis_client.hget(SITE.lifecycle, "webhook") is None, 10)
        assert "Completion event" in survivor.log()


def finisher_tag(log: str) -> str:
    return log.split("(worker ", 1)[1][:8]


def test_a_pause_outlives_worker_and_redis_restarts(demo_site, tmp_path, capsys):
    """Paused, then Redis (append-only file) and the worker restarted: still paused, nothing
    fetched; resumed, the crawl finishes with its event."""
    from distcrawl.testing.redis_server import RedisServer
    from distcrawl.testing.workers import Worker

    site = demo_site(pages=80, delay=0.1)
    with RedisServer(directory=tmp_path / "aof", appendonly=True) as server:
        client = server.client()
        client.lpush("site:start_urls", site.url + "/")

        def worker(i: int) -> Worker:
            settings = {"DISTCRAWL_DOMAIN_CONCURRENCY": 2, "DISTCRAWL_IDLE_TIMEOUT": 3}
            return Worker(
                i, redis_url=server.url, log_path=tmp_path / f"w{i}.log", settings=settings
            ).start()

        first = worker(1)
        try:
            assert wait_until(lambda: len(page_fetches(site)) >= 5, timeout=60)
            assert main(["--redis-url", server.url, "pause", "site"]) == 0
            assert wait_until(lambda: client.zcard(SITE.leases) == 0, timeout=30)
        finally:
            first.stop()
        server.restart()
        client = server.client()
        second = worker(2)
        try:
            assert second.wait_for_log("(worker ", timeout=60), second.log()[-2000:]
            before = len(site.read_log())
            time.sleep(3)
            assert len(site.read_log()) == before, "a paused crawl fetched after the restarts"
            capsys.readouterr()
            assert main(["--redis-url", server.url, "--json", "status", "site"]) == 0
            assert json.loads(capsys.readouterr().out)["state"] == "paused"
            assert second.alive()  # paused: it does not close for idleness
            assert main(["--redis-url", server.url, "resume", "site"]) == 0
            assert second.wait(120) == 0, second.log()[-3000:]
        finally:
            second.stop()
        assert set(page_fetches(site)) == site.expected_pages()
        assert len(client.xrange(SITE.events)) == 1
