"""distcrawl.celery with real processes: a Celery worker of examples/celery_app.py (its broker
on a redis-server of its own), a producer process calling ``push.delay()``, and ``scrapy
crawl site`` workers on the frontier's redis-server. Counts come from the demo site's log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from distcrawl.codec.serialize import RequestCodec
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.queue_entry import parse_entry
from distcrawl.testing.redis_server import RedisServer
from tests.support import page_fetches, wait_until

pytest.importorskip("celery")

ROOT = Path(__file__).resolve().parents[1]
SITE = FrontierKeys("site")


class CeleryWorker:
    """``celery -A examples.celery_app worker`` (or another app; solo pool), started and
    stopped by PID."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        app: str = "examples.celery_app",
        cwd: Path = ROOT,
    ) -> None:
        self.env = env
        self.log_path = log_path
        self.app = app
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> CeleryWorker:
        cmd = [sys.executable, "-m", "celery", "-A", self.app, "worker"]
        cmd += ["--pool=solo", "--loglevel=INFO", f"--logfile={self.log_path}"]
        cmd += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        cmd += ["-n", f"distcrawl-test-{os.getpid()}@localhost"]
        stderr = open(self.log_path.with_suffix(".stderr"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, cwd=str(self.cwd), env=self.env, stdout=subprocess.DEVNULL, stderr=stderr
        )
        stderr.close()
        assert wait_until(lambda: "ready." in self.log() or self.proc.poll() is not None, 60)
        assert self.proc.poll() is None, self.log() + self.stderr()
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stderr(self) -> str:
        return self.log_path.with_suffix(".stderr").read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (Celery's warm shutdown), then SIGKILL, by PID."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RedisServer]:
    """Celery's broker and result backend: a redis-server apart from the frontier's."""
    server = RedisServer(directory=tmp_path / "broker").start()
    try:
        yield server
    finally:
        server.stop()


def _env(broker: RedisServer, redis_url: str, pythonpath: list[Path]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "CELERY_BROKER_URL": broker.url,
            "REDIS_URL": redis_url,
            "SCRAPY_SETTINGS_MODULE": "distcrawl.settings",
            "TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS": "",
            "PYTHONPATH": os.pathsep.join(str(p) for p in [*pythonpath, ROOT]),
        }
    )
    return env


@pytest.fixture
def celery_worker(
    tmp_path: Path, broker: RedisServer, redis_url: str
) -> Iterator[Callable[..., CeleryWorker]]:
    """Factory of Celery worker processes; keyword arguments become Scrapy settings of the
    worker's project (a settings module over distcrawl.settings)."""
    started: list[CeleryWorker] = []

    def factory(**settings: Any) -> CeleryWorker:
        home = tmp_path / f"celery-{len(started)}"
        home.mkdir()
        lines = ["from distcrawl.settings import *  # noqa: F403"]
        lines += [f"{name} = {value!r}" for name, value in settings.items()]
        (home / "celery_project_settings.py").write_text("\n".join(lines) + "\n")
        env = _env(broker, redis_url, [home])
        env["SCRAPY_SETTINGS_MODULE"] = "celery_project_settings"
        worker = CeleryWorker(env, home / "celery.log")
        started.append(worker)
        return worker.start()

    try:
        yield factory
    finally:
        for worker in started:
            worker.stop()


def producer_process(
    broker: RedisServer, redis_url: str, tmp_path: Path, urls: list[str], priority: int, wait: float
) -> subprocess.Popen[str]:
    """``python -m tests.celery_producer``: push.delay() for each URL, from its own process."""
    path = tmp_path / f"urls-{priority}-{len(urls)}.txt"
    path.write_text("\n".join(urls) + "\n")
    cmd = [sys.executable, "-m", "tests.celery_producer", "site", str(priority), str(path)]
    return subprocess.Popen(
        [*cmd, str(wait)],
        cwd=str(ROOT),
        env=_env(broker, redis_url, []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def results_of(proc: subprocess.Popen[str], timeout: float) -> list[dict[str, Any]]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    lines = out.splitlines()
    return json.loads(lines[-1]) if len(lines) > 1 else []


def stored_urls(redis_client) -> list[str]:
    codec = RequestCodec("msgpack")
    return [
        codec.decode_dict(parse_entry(raw).payload)["u"]
        for raw in redis_client.zrange(SITE.queue, 0, -1)
    ]


def test_thousand_delays_two_workers_every_page_once_priority_nine_first(
    demo_site, workers, celery_worker, broker, redis_url, redis_client, tmp_path
):
    site = demo_site(pages=1000, links=2)
    celery = celery_worker()
    low = [site.url_for(f"/page/{n}") for n in range(50, 1000)]
    high = [site.url_for(f"/page/{n}") for n in range(50)]
    started = time.monotonic()
    first = producer_process(broker, redis_url, tmp_path, low, 0, wait=0)
    assert results_of(first, 60) == []
    assert wait_until(lambda: redis_client.zcard(SITE.queue) == 950, timeout=90)
    # priority 9 while the queue holds 950 requests of priority 0
    second = producer_process(broker, redis_url, tmp_path, high, 9, wait=60)
    outcomes = results_of(second, 90)
    pushed_in = time.monotonic() - started
    assert [r["outcome"] for r in outcomes] == ["queued"] * 50, outcomes[:3]
    assert redis_client.zcard(SITE.queue) == 1000
    assert sorted(stored_urls(redis_client)) == sorted(low + high)

    pool = [workers(i, DISTCRAWL_IDLE_TIMEOUT=3) for i in (1, 2)]
    for w in pool:
        assert w.wait(240) == 0, w.log()[-3000:]
    pages = {f"/page/{n}" for n in range(1000)}
    fetched = page_fetches(site)
    assert set(fetched) == pages  # none missing
    assert max(fetched.values()) == 1  # none twice
    order = [
        line.path
        for line in sorted(site.read_log(), key=lambda line: line.arrived)
        if line.path in pages and line.status == 200
    ]
    ranks = sorted(order.index(f"/page/{n}") for n in range(50))
    print(
        f"1000 push.delay() stored in {pushed_in:.1f}s; the 50 priority-9 pages were fetches "
        f"{ranks[0]}..{ranks[-1]} of 1000 (median {ranks[25]})"
    )
    # by chance about 5% of them would be among the first 100
    assert ranks[-1] < 100, ranks
    assert "ERROR" not in celery.log()


def test_frontier_redis_paused_celery_retries_nothing_lost_no_page_twice(
    demo_site, workers, celery_worker, broker, redis_server, redis_url, redis_client, tmp_path
):
    site = demo_site(pages=300, links=2)
    # a push waits for the frontier's Redis at most 1s, then Celery retries it later
    celery = celery_worker(DISTCRAWL_SOCKET_TIMEOUT=1)
    urls = [site.url_for(f"/page/{n}") for n in range(300)]
    proc = producer_process(broker, redis_url, tmp_path, urls, 0, wait=150)
    try:
        assert wait_until(lambda: redis_client.zcard(SITE.queue) >= 20, timeout=60)
        os.kill(redis_server.pid, signal.SIGSTOP)
        try:
            time.sleep(5)  # this process sends nothing to the stopped server meanwhile
        finally:
            os.kill(redis_server.pid, signal.SIGCONT)
        outcomes = results_of(proc, 180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    counts = Counter(r.get("outcome", repr(r)) for r in outcomes)
    print(f"outcomes after a 5s pause of the frontier's Redis: {dict(counts)}")
    assert set(counts) <= {"queued", "seen"} and sum(counts.values()) == 300, counts
    retries = celery.log().count("retry: Retry in")
    print(f"Celery retried {retries} pushes")
    assert retries >= 1, celery.log()[-3000:]
    stored = stored_urls(redis_client)
    assert len(stored) == 300 and set(stored) == set(urls)  # nothing lost, nothing twice

    worker = workers(1, DISTCRAWL_IDLE_TIMEOUT=2)
    assert worker.wait(180) == 0, worker.log()[-3000:]
    fetched = page_fetches(site)
    assert set(fetched) == {f"/page/{n}" for n in range(300)}
    assert max(fetched.values()) == 1


def test_item_notifications_one_per_stored_document_none_for_dead_letters(
    demo_site, mongo_workers, celery_worker, broker, redis_client, mongo_client
):
    from tests.notify_spider import refused

    site = demo_site(pages=50, links=3)
    celery_worker()
    redis_client.lpush("notify:start_urls", site.url + "/")
    worker = mongo_workers(
        1,
        spider="notify",
        SPIDER_MODULES="distcrawl.spiders,tests.notify_spider",
        DISTCRAWL_IDLE_TIMEOUT=2,
        DISTCRAWL_CELERY_ITEM_TASK="example.on_item",
        DISTCRAWL_CELERY_BROKER_URL=broker.url,
    )
    assert worker.wait(120) == 0, worker.log()[-3000:]
    docs = list(mongo_client.distcrawl["notify"].find({}, {"_id": 1, "url": 1}))
    stored = {d["_id"] for d in docs}
    dead = mongo_client.distcrawl["notify_dead"].count_documents({})
    expected_dead = sum(1 for path in site.expected_pages() if refused(path))
    urls = {d["url"] for d in docs}
    missing = {p for p in site.expected_pages() if not refused(p)} - {
        "/" + u.split("/", 3)[-1] for u in urls
    }
    assert not missing and dead == expected_dead, (missing, dead, worker.log()[-3000:])
    notified_key = broker.client()
    try:
        assert wait_until(lambda: notified_key.llen("example:notified") >= len(stored), 30)
        time.sleep(0.5)  # a message too many would show now
        messages = [json.loads(m) for m in notified_key.lrange("example:notified", 0, -1)]
    finally:
        notified_key.close()
    print(f"{len(messages)} notifications for {len(stored)} documents, {dead} dead-lettered")
    assert all(m[:2] == ["distcrawl", "notify"] for m in messages)
    keys = [m[2] for m in messages]
    assert sorted(keys) == sorted(stored)  # one per stored document, none for a dead letter
    assert "'distcrawl/mongo/notifications/sent': " + str(len(stored)) in worker.log()


#: a Celery app of its own, as a web app's would be: no Scrapy project anywhere near it
PLAIN_APP = """
import os

from celery import Celery

app = Celery(
    "plain",
    broker=os.environ["CELERY_BROKER_URL"],
    backend=os.environ["CELERY_BROKER_URL"],
    include=["distcrawl.celery"],
)
app.conf.update(
    distcrawl_redis_url=os.environ["FRONTIER_URL"], broker_connection_retry_on_startup=True
)
"""


def test_a_celery_app_outside_the_project_pushes_start_urls_a_worker_crawls_them(
    demo_site, workers, broker, redis_url, redis_client, tmp_path
):
    """``send_task("distcrawl.push", ["barsite", url])`` to a Celery worker whose app imports
    no Scrapy project (no SCRAPY_SETTINGS_MODULE, no scrapy.cfg, no spider ``barsite``):
    every push is a start URL entry (``accepted``), the worker says so once, and a worker of
    the spider crawls every page once."""
    from celery import Celery

    site = demo_site(pages=30, links=2)
    home = tmp_path / "plain"
    home.mkdir()
    (home / "plain_celery_app.py").write_text(PLAIN_APP)
    env = {k: v for k, v in os.environ.items() if k not in ("SCRAPY_SETTINGS_MODULE", "REDIS_URL")}
    env.update(
        CELERY_BROKER_URL=broker.url,
        FRONTIER_URL=redis_url,
        PYTHONPATH=str(home),
        TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS="",
    )
    celery = CeleryWorker(env, home / "celery.log", app="plain_celery_app", cwd=home)
    urls = [site.url_for("/")] + [site.url_for(f"/page/{n}") for n in range(19)]
    sender = Celery("sender", broker=broker.url, backend=broker.url, set_as_current=False)
    try:
        celery.start()
        first = {"priority": 5, "meta": {"source": "signup"}}
        sent = [sender.send_task("distcrawl.push", ["barsite", urls[0]], first)]
        sent += [sender.send_task("distcrawl.push", ["barsite", url]) for url in urls[1:]]
        outcomes = []
        for result in sent:
            try:
                got = result.get(timeout=30, propagate=False, interval=0.05)
                # a failed task's result is its exception
                outcomes.append(got if isinstance(got, dict) else {"error": repr(got)})
            except Exception as exc:  # a timeout: reported below
                outcomes.append({"error": repr(exc)})
    finally:
        sender.close()
        celery.stop()
    log = celery.log()
    print(f"{len(urls)} send_task(): {dict(Counter(str(o.get('outcome', o)) for o in outcomes))}")
    assert [o.get("outcome") for o in outcomes] == ["accepted"] * len(urls), (
        outcomes[:2],
        log[-2000:],
    )
    entries = redis_client.lrange("barsite:start_urls", 0, -1)
    assert len(entries) == len(urls)
    assert json.loads(entries[-1]) == {"url": urls[0], **first}  # the oldest, taken first
    assert redis_client.zcard("barsite:queue") == 0
    assert log.count("pushes start URL entries") == 1, log[-3000:]
    assert "ERROR" not in log

    worker = workers(
        1,
        spider="barsite",
        SPIDER_MODULES="distcrawl.spiders,tests.bar_spider",
        DISTCRAWL_IDLE_TIMEOUT=3,
    )
    assert worker.wait(120) == 0, worker.log()[-3000:]
    fetched = page_fetches(site)
    assert set(fetched) == site.expected_pages()  # the start URLs and what they link to
    assert max(fetched.values()) == 1
    assert redis_client.llen("barsite:start_urls") == 0


def test_the_push_target_is_the_queue_where_the_spider_imports_else_start_urls(
    redis_url, redis_client, caplog
):
    """In one process: a spider of the project (``site``) is pushed to the queue, one it
    does not have (``barsite``) as start URL entries, said once for two pushes; a target
    named in the conf is kept, and a misspelt one is refused."""
    from celery import Celery
    from scrapy.settings import Settings

    from distcrawl import celery as tasks

    app = Celery("distcrawl_test", set_as_current=False)
    app.conf.update(distcrawl_redis_url=redis_url)
    push = app.tasks["distcrawl.push"]
    try:
        with caplog.at_level("INFO", logger="distcrawl.celery"):
            run = [
                push.apply([spider, f"http://a.test/{n}"]).get()
                for n, spider in enumerate(["site", "barsite", "barsite"])
            ]
    finally:
        tasks.reset()
    assert [r["outcome"] for r in run] == ["queued", "accepted", "accepted"]
    assert redis_client.zcard(SITE.queue) == 1 and redis_client.llen("barsite:start_urls") == 2
    said = [r.getMessage() for r in caplog.records if "start URL entries" in r.getMessage()]
    assert said == [
        "distcrawl.push: spider 'barsite' is not in SPIDER_MODULES (distcrawl.spiders); this "
        "Celery worker pushes start URL entries to barsite:start_urls (the crawl's workers "
        "make the requests; give it the project's SCRAPY_SETTINGS_MODULE to store requests "
        "in the queue)"
    ]

    bare = Settings()  # no project: SPIDER_MODULES empty
    assert tasks._target(None, bare, "site")[0] == "start_urls"
    assert tasks._target("auto", bare, "site")[0] == "start_urls"
    assert tasks._target("queue", bare, "site") == ("queue", "")  # Producer then says why
    with pytest.raises(ValueError, match="distcrawl_target='queu'"):
        tasks._target("queu", bare, "site")


def test_a_push_task_retried_stores_a_dont_filter_request_once(redis_url, redis_client):
    """The ``distcrawl.push`` task run twice under one task id (what a retry or a
    re-delivery after a lost acknowledgement does) stores its dont_filter request once;
    another task's push of it is a request of its own (docs/producers.md)."""
    from celery import Celery

    from distcrawl import celery as tasks

    app = Celery("distcrawl_test", set_as_current=False)
    app.conf.update(
        distcrawl_redis_url=redis_url,
        distcrawl_settings={"DISTCRAWL_START_META_KEYS": ["dont_filter"]},
    )
    push = app.tasks["distcrawl.push"]
    try:
        run = [
            push.apply(["site", "http://a.test/x"], {"dont_filter": True}, task_id=task_id).get()
            for task_id in ("t1", "t1", "t2")
        ]
    finally:
        tasks.reset()
    assert [r["outcome"] for r in run] == ["queued", "seen", "queued"]
    assert stored_urls(redis_client) == ["http://a.test/x"] * 2


def test_notifications_spilled_at_close_are_replayed_by_the_command(
    celery_worker, broker, tmp_path, capsys
):
    """Notifications a worker spilled at close (its broker down: Notifier.deliver's real
    spill path) reach the task with `distcrawl notify replay`, with the arguments the live
    path sends; the file becomes FILE.sent, so a second run sends nothing. While the
    broker is down the command fails and keeps the file."""
    from bson import ObjectId

    from distcrawl import cli
    from distcrawl.notify import Notifier, NotifyConfig

    dead_broker = "redis://127.0.0.1:1/0"
    spill = tmp_path / "site-notify-1-1.jsonl"
    notifier = Notifier(NotifyConfig("example.on_item", dead_broker), "distcrawl", spill)
    oid = ObjectId()
    keys = [("site", oid), ("site", "https://a.test/"), ("other", 7)]
    try:
        assert notifier.deliver(keys, closing=lambda: True, close_timeout=0) == "spilled"
    finally:
        notifier.close()
    assert spill.exists()

    argv = ["notify", "replay", str(spill), "--broker"]
    assert cli.main([*argv, dead_broker]) == cli.EXIT_UNREACHABLE
    assert "cannot send to the Celery broker" in capsys.readouterr().err
    assert spill.exists()

    celery_worker()
    assert cli.main([*argv, broker.url]) == 0
    assert "sent 3 item notifications from 1 file(s)" in capsys.readouterr().out
    assert not spill.exists() and (tmp_path / "site-notify-1-1.jsonl.sent").exists()
    client = broker.client()
    try:
        assert wait_until(lambda: client.llen("example:notified") >= 3, 30)
        time.sleep(0.5)
        got = [json.loads(m) for m in client.lrange("example:notified", 0, -1)]
    finally:
        client.close()
    assert sorted(map(json.dumps, got)) == sorted(
        json.dumps(m)
        for m in [
            ["distcrawl", "site", {"$oid": str(oid)}],  # what plain_key sends for an ObjectId
            ["distcrawl", "site", "https://a.test/"],
            ["distcrawl", "other", 7],
        ]
    )
    assert cli.main([*argv, broker.url]) == cli.EXIT_USAGE  # renamed: nothing sent twice
