"""DISTCRAWL_ALLOWED_SCHEMES for every request, Scrapy's non-web download handlers off, and
no remote-control listener: a crawled page or a queue entry cannot make a worker read local
files, and a worker opens no port it was not asked to."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from scrapy import Request, signals
from scrapy.crawler import AsyncCrawlerRunner
from scrapy.settings import Settings
from scrapy.utils.conf import build_component_list
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.python import without_none_values

from distcrawl import Addon
from distcrawl.codec.serialize import RequestCodec
from distcrawl.demo.site import HOSTILE_PAGE, SiteConfig, route
from distcrawl.engine.batch import refused_scheme
from distcrawl.model.queue_entry import make_entry
from distcrawl.spiders import RedisSpider
from tests.support import crawl_settings, page_fetches, wait_until

HREF = re.compile(r'href="([^"]+)"')
SCRAPY_HANDLERS = {"http", "https", "file", "s3", "ftp", "data"}


def stat(log: str, name: str) -> int | None:
    """A counter from the stats a worker dumps when it closes."""
    found = re.search(rf"'{re.escape(name)}': (\d+)", log)
    return int(found.group(1)) if found else None


def redis_dump(client: Any) -> bytes:
    """Every key and value in Redis, to look for what must not be stored anywhere."""
    out = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"string":
            values = [client.get(key)]
        elif kind == b"list":
            values = client.lrange(key, 0, -1)
        elif kind == b"hash":
            values = [b"%s=%s" % kv for kv in client.hgetall(key).items()]
        elif kind == b"set":
            values = list(client.smembers(key))
        elif kind == b"zset":
            values = client.zrange(key, 0, -1)
        else:
            values = [client.dump(key) or b""]
        out.append(key + b"\n" + b"\n".join(v or b"" for v in values))
    return b"\n".join(out)


class FifoWatch:
    """Tries, until stopped, to open the FIFO's write end without blocking: that fails with
    ENXIO as long as nobody has its read end open, so a success means somebody opened it
    (then the write end is closed at once, so that reader sees the end of the file)."""

    def __init__(self, path: Path, timeout: float = 180.0) -> None:
        self.path = path
        self.timeout = timeout
        self.opened = 0
        self.refused = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    self.refused += 1
                else:
                    self.errors.append(repr(exc))
            else:
                self.opened += 1
                os.close(fd)
            self._stop.wait(0.02)

    def __enter__(self) -> FifoWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


# ------------------------------------------------------------------ units


def test_refused_scheme_looks_at_what_precedes_the_first_colon():
    schemes = ("http", "https")
    for url in ("http://a.test/", "HTTPS://a.test/x", "https://user:pw@a.test/"):
        assert refused_scheme(url, schemes) is None, url
    for url in ("file:///etc/passwd", "FILE://h/x", " http://a.test/", "data:,x", "s3://b/k"):
        why = refused_scheme(url, schemes)
        assert why is not None and "DISTCRAWL_ALLOWED_SCHEMES" in why, url
    assert "'ftp'" in (refused_scheme("ftp://user:secret-pw@h/x", schemes) or "")
    assert "secret-pw" not in (refused_scheme("ftp://user:secret-pw@h/x", schemes) or "")
    assert refused_scheme("data:,x", ("http", "data")) is None


def handlers(**project: Any) -> dict[str, Any]:
    settings = Settings(project, priority="project")
    Addon().update_settings(settings)
    return without_none_values(settings.getwithbase("DOWNLOAD_HANDLERS"))


def test_addon_keeps_only_the_download_handlers_of_allowed_schemes():
    assert set(handlers()) == {"http", "https"}
    assert set(handlers(DISTCRAWL_ALLOWED_SCHEMES=["http", "https", "ftp"])) == {
        "http",
        "https",
        "ftp",
    }
    assert set(handlers(DISTCRAWL_ALLOWED_SCHEMES="https,DATA")) == {"http", "https", "data"}
    # a project's own handler for a scheme wins, whatever the add-on turns off
    mine = handlers(DOWNLOAD_HANDLERS={"file": "my.project.FileHandler"})
    assert mine["file"] == "my.project.FileHandler" and "ftp" not in mine
    assert set(handlers(DOWNLOAD_HANDLERS={"ftp": None}, DISTCRAWL_ALLOWED_SCHEMES="ftp")) == {
        "http",
        "https",
    }


def test_addon_turns_the_remote_control_server_off_unless_the_project_wants_it():
    settings = Settings()
    Addon().update_settings(settings)
    assert settings.getbool("REMOTE_CONTROL_ENABLED") is False
    assert "scrapy.extensions.remote_control.RemoteControl" in build_component_list(
        settings.getwithbase("EXTENSIONS")
    )  # still listed: the extension itself reads the setting and stays off
    assert settings.getbool("TELNETCONSOLE_ENABLED") is False
    wanted = Settings(
        {"REMOTE_CONTROL_ENABLED": True, "TELNETCONSOLE_ENABLED": True}, priority="project"
    )
    Addon().update_settings(wanted)
    assert wanted.getbool("REMOTE_CONTROL_ENABLED") is True
    assert wanted.getbool("TELNETCONSOLE_ENABLED") is True


def test_demo_site_hostile_page_only_when_asked_for():
    plain = SiteConfig(5, 3, 1, 0.0, None)
    assert HOSTILE_PAGE not in route("/", plain).body.decode()
    assert route(HOSTILE_PAGE, plain).status == 404
    links = ("file://127.0.0.1/tmp/x", 'data:text/html,<a href="/page/1">x</a>')
    cfg = SiteConfig(5, 3, 1, 0.0, None, hostile_links=links)
    assert HREF.findall(route("/", cfg).body.decode())[-1] == HOSTILE_PAGE
    page = route(HOSTILE_PAGE, cfg)
    assert page.status == 200
    assert HREF.findall(page.body.decode()) == [
        "file://127.0.0.1/tmp/x",
        "data:text/html,&lt;a href=&quot;/page/1&quot;&gt;x&lt;/a&gt;",
        "/hostile/redirect/0",
        "/hostile/redirect/1",
    ]
    assert route("/hostile/redirect/0", cfg).location == links[0].encode()
    assert route("/hostile/redirect/1", cfg).location == links[1].encode()
    for path in ("/hostile/redirect/2", "/hostile/redirect/01", "/hostile/other"):
        assert route(path, cfg).status == 404, path


# ------------------------------------------------------------------ in-process scheduler


class SchemeSpider(RedisSpider):
    """Yields requests of every scheme Scrapy has a handler for, twice (from two pages)."""

    name = "schemes"
    hostile: list[str] = []

    def parse(self, response: Any, **kwargs: Any) -> Any:
        for url in self.hostile:
            yield Request(url, meta={"download_slot": "elsewhere"})
        yield Request(response.urljoin("/page/1"))


@pytest_twisted.ensureDeferred
async def test_scheduler_refuses_schemes_not_allowed(redis_url, redis_client, demo_site, tmp_path):
    site = demo_site(pages=5)
    secret = tmp_path / "secret.txt"
    secret.write_text("in-process-secret-" + uuid.uuid4().hex)
    SchemeSpider.hostile = [
        f"file://127.0.0.1{secret}",
        f"FILE://127.0.0.1{secret}",
        "ftp://127.0.0.1/x",
        "s3://bucket/key",
        "data:text/html,<p>inline</p>",
    ]
    # what someone with write access to Redis queues: refused again on the way out
    codec = RequestCodec()
    payload = codec.encode(Request(f"file://127.0.0.1{secret}#queued"))
    redis_client.zadd("schemes:queue", {make_entry("127.0.0.1", 0, 10**9, payload): 0})
    redis_client.zadd("schemes:ready", {"127.0.0.1": 0})
    redis_client.lpush("schemes:start_urls", site.url + "/")

    runner = AsyncCrawlerRunner(crawl_settings(redis_url))
    crawler = runner.create_crawler(SchemeSpider)
    dropped: list[str] = []

    def on_dropped(request: Request, spider: Any) -> None:
        dropped.append(request.url)

    crawler.signals.connect(on_dropped, signal=signals.request_dropped)
    messages: list[tuple[int, str]] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append((record.levelno, record.getMessage()))

    handler = Grab(level=logging.DEBUG)
    logging.getLogger().addHandler(handler)
    try:
        await deferred_from_coro(crawler.crawl_async())
    finally:
        logging.getLogger().removeHandler(handler)

    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "finished"
    # two pages yielded each request: all refused, before the duplicate filter
    assert stats["distcrawl/refused/scheme"] == 10
    # request_dropped for each (the second /page/1 is dropped too, as a duplicate)
    assert len([u for u in dropped if not u.startswith("http")]) == 10
    refusals = [m for level, m in messages if m.startswith("Refused ")]
    assert len(refusals) == 4, refusals  # once per scheme: file, ftp, s3, data
    assert {m.split(":", 1)[0] for m in refusals} == {
        "Refused file",
        "Refused ftp",
        "Refused s3",
        "Refused data",
    }
    assert all(level == logging.WARNING for level, m in messages if m.startswith("Refused "))
    assert {line.path for line in site.read_log()} - {"/robots.txt"} == {"/", "/page/1"}
    assert "downloader/exception_count" not in stats
    (record,) = [json.loads(r) for r in redis_client.lrange("schemes:dead", 0, -1)]
    assert record["source"] == "queue" and "scheme 'file'" in record["reason"]
    assert redis_client.zcard("schemes:queue") == 0
    assert redis_client.zcard("schemes:leases") == 0
    assert secret.read_text() not in "\n".join(m for _, m in messages)


# ------------------------------------------------------------------ real workers


def test_hostile_links_are_neither_fetched_nor_stored(demo_site, workers, redis_client, tmp_path):
    secret = tmp_path / "secret.txt"
    secret_text = "worker-secret-" + uuid.uuid4().hex
    secret.write_text(secret_text)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    jobs = tmp_path / "jobs"
    links = [
        f"file://127.0.0.1{secret}",
        f"file://127.0.0.1{fifo}",
        "ftp://127.0.0.1/x",
        "data:text/html,<a href='/page/1'>inline</a>",
    ]
    site = demo_site(pages=5, hostile_links=links)
    redis_client.lpush("site:start_urls", site.url + "/")
    with FifoWatch(fifo) as watch:
        worker = workers(1, DISTCRAWL_IDLE_TIMEOUT=3, REMOTE_CONTROL_JOBS_DIR=jobs)
        code = worker.wait(120)
    log = worker.log()
    assert code == 0, log[-3000:]

    # the page and the redirects were served, so the links were seen
    served = {line.path: line.status for line in site.read_log()}
    assert served[HOSTILE_PAGE] == 200
    assert all(served[f"/hostile/redirect/{i}"] == 302 for i in range(len(links)))
    assert set(page_fetches(site)) == site.expected_pages()  # and the crawl went on
    # none was fetched: no file read, the FIFO never opened, nothing stored
    assert watch.opened == 0 and watch.refused > 0 and not watch.errors
    refused = stat(log, "distcrawl/refused/scheme")
    assert refused is not None and refused >= 3  # file (x2) and ftp; the extractor skips data:
    assert "Refused file://127.0.0.1" in log and "Refused ftp://127.0.0.1/x" in log
    stderr = worker.log_path.with_suffix(".stderr").read_text(errors="replace")
    assert secret_text not in log + stderr
    assert secret_text.encode() not in redis_dump(redis_client)
    assert stat(log, "downloader/exception_count") is None
    assert "ERROR" not in log
    # no listener nobody asked for
    assert "Remote control" not in log and "RemoteControl" not in log
    assert not jobs.exists() or not list(jobs.iterdir())


def queue(redis_client: Any, url: str, seq: int, slot: str, **meta: Any) -> None:
    """A queue entry written straight into Redis, as anyone with write access could."""
    payload = RequestCodec().encode(Request(url, meta=meta))
    redis_client.zadd("site:queue", {make_entry(slot, 0, seq, payload): 0})
    redis_client.zadd("site:ready", {slot: 0})


@pytest.mark.parametrize("allow_data", [False, True], ids=["default", "data-allowed"])
def test_queue_entries_with_other_schemes(demo_site, workers, redis_client, tmp_path, allow_data):
    """file:// in the queue is dead-lettered; data: too, unless allowed: then Scrapy's data
    handler, kept by the add-on, fetches it."""
    secret = tmp_path / "secret.txt"
    secret_text = "queued-secret-" + uuid.uuid4().hex
    secret.write_text(secret_text)
    site = demo_site(pages=2)
    queue(redis_client, f"file://127.0.0.1{secret}", 10**9, "127.0.0.1")
    queue(redis_client, "data:text/plain,inline", 10**9 + 1, "inline-data")
    redis_client.lpush("site:start_urls", site.url + "/")
    settings: dict[str, Any] = {"DISTCRAWL_IDLE_TIMEOUT": 3}
    if allow_data:
        settings["DISTCRAWL_ALLOWED_SCHEMES"] = "http,https,data"
    worker = workers(1, **settings)
    code = worker.wait(120)
    log = worker.log()
    assert code == 0, log[-3000:]

    records = [json.loads(r) for r in redis_client.lrange("site:dead", 0, -1)]
    reasons = sorted(r["reason"] for r in records)
    assert all(r["source"] == "queue" for r in records)
    expected = ["scheme 'file' not in DISTCRAWL_ALLOWED_SCHEMES"]
    if not allow_data:
        expected.insert(0, "scheme 'data' not in DISTCRAWL_ALLOWED_SCHEMES")
    assert [r.split(" (")[0] for r in reasons] == expected
    assert "cannot be crawled: scheme 'file'" in log
    # the data: URL reached the spider's callback (a text/plain page), or never left Redis
    assert stat(log, "site/non_html") == (1 if allow_data else None)
    assert set(page_fetches(site)) == site.expected_pages()
    assert wait_until(lambda: redis_client.zcard("site:leases") == 0, timeout=5)
    assert redis_client.zcard("site:queue") == 0
    assert secret_text not in log
    assert secret_text.encode() not in redis_dump(redis_client)


def test_remote_control_starts_only_when_enabled(workers, redis_client, tmp_path):
    off_jobs, on_jobs = tmp_path / "jobs-off", tmp_path / "jobs-on"
    off = workers(1, REMOTE_CONTROL_JOBS_DIR=off_jobs)
    on = workers(2, REMOTE_CONTROL_ENABLED=True, REMOTE_CONTROL_JOBS_DIR=on_jobs)
    assert on.wait_for_log("Remote control HTTP server listening"), on.log()[-3000:]
    assert wait_until(lambda: on_jobs.exists() and list(on_jobs.iterdir()), timeout=10)
    assert off.wait_for_log("Frontier: "), off.log()[-3000:]
    assert not off_jobs.exists() or not list(off_jobs.iterdir())
    for w in (off, on):
        w.stop()
        assert w.proc is not None and w.proc.returncode == 0
    assert "Remote control" not in off.log() and "RemoteControl" not in off.log()
    assert "scrapy.extensions.remote_control.RemoteControl" in on.log()  # enabled extensions
    assert not list(on_jobs.iterdir())  # removed on a clean stop
