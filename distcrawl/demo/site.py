"""A deterministic demo website for the quick start, the tests and the benchmarks.

Run it standalone::

    python -m distcrawl.demo.site --host 127.0.0.1 --port 0 --pages 2000 --links 17 \
        --seed 1 --delay 0 --log /tmp/site.log

It prints exactly one ``READY http://HOST:PORT`` line once listening. Every page is a pure
function of ``(seed, n)`` so tests can compute the expected crawl without fetching anything
(:func:`page_links`, :func:`expected_pages`), and the request log (:func:`read_log`) lets them
check what a crawler really fetched, how often and with which User-Agent.

The pages and their routes are pages.py's (re-exported here), the pages that change with time
fresh.py's; this module serves them over HTTP, writes and reads the request log, and runs the
site as a process (:class:`DemoSite`).
"""

from __future__ import annotations

import argparse
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from email.utils import formatdate
from pathlib import Path
from typing import IO, Any, NamedTuple

from distcrawl.demo.fresh import FreshPages, FreshStats, add_arguments, read_stats
from distcrawl.demo.pages import (
    HOME_LINKS,
    HOSTILE_PAGE,
    HOSTILE_REDIRECT,
    HTML_TYPE,
    PDF_BODY,
    SPECIAL_EVERY,
    SPECIAL_REMAINDER,
    Faults,
    SiteConfig,
    bfs_from_home,
    expected_pages,
    extra_links,
    fails_first,
    home_links,
    is_special,
    leaf_links,
    page_links,
    render_home,
    render_hostile,
    render_leaf,
    render_not_found,
    render_page,
    render_private,
    robots_txt,
    route,
)
from distcrawl.testing.process import ManagedProcess

logger = logging.getLogger(__name__)

DISCONNECTED_STATUS = 499  # nginx's "client closed request": logged, never sent
DROPPED_STATUS = 0  # the site dropped the connection on purpose (--fail-mode drop)


class LogLine(NamedTuple):
    """One request as recorded by the demo site."""

    time: float
    method: str
    path: str
    status: int
    user_agent: str
    #: when the request arrived (``time`` is when it was answered)
    arrived: float = 0.0
    #: requests the site was serving when this one arrived, itself included
    in_flight: int = 0


def read_log(path: str | os.PathLike[str]) -> list[LogLine]:
    """Parse the request log; tolerant of a partially written last line (site still running)."""
    out: list[LogLine] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.endswith("\n"):
                    break
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 5:
                    parts += [parts[0], "0"]
                if len(parts) != 7:
                    continue
                out.append(
                    LogLine(
                        float(parts[0]),
                        parts[1],
                        parts[2],
                        int(parts[3]),
                        parts[4],
                        float(parts[5]),
                        int(parts[6]),
                    )
                )
    except FileNotFoundError:
        pass
    return out


class RequestLog:
    """Line-buffered appends, so tests can read the log while the site is running."""

    def __init__(self, path: str | None) -> None:
        self._fh: IO[str] | None = None
        if path:
            self._fh = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def write(
        self,
        method: str,
        path: str,
        status: int,
        user_agent: str,
        arrived: float = 0.0,
        in_flight: int = 0,
    ) -> None:
        if self._fh is None:
            return
        ua = user_agent.replace("\t", " ").replace("\n", " ").replace("\r", " ")
        now = time.time()
        self._fh.write(
            f"{now:.6f}\t{method}\t{path}\t{status}\t{ua}\t{arrived or now:.6f}\t{in_flight}\n"
        )

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _reactor() -> Any:
    """Imported lazily so importing the pure helpers never installs a reactor in tests.

    Typed ``Any`` because the reactor's zope interfaces confuse mypy without its plugin.
    """
    from twisted.internet import reactor

    return reactor


def _retry_after(faults: Faults) -> bytes:
    """The 429's Retry-After: seconds, or the date that many seconds from now on this host's
    clock, which is also the clock of the Date header Twisted sends with it."""
    if faults.retry_after_date:
        return formatdate(time.time() + faults.retry_after, usegmt=True).encode()
    return b"%d" % faults.retry_after


def _build_site(cfg: SiteConfig, request_log: RequestLog) -> Any:
    """Twisted is imported lazily so importing the pure helpers stays cheap for tests."""
    from twisted.web import http, resource, server

    reactor = _reactor()
    attempts: dict[str, int] = {}  # failures served so far, per path
    fresh = FreshPages(cfg.fresh_pages, cfg.fresh_fast, cfg.fresh_slow)
    counters = {"in_flight": 0, "pages": 0}

    def arrive(request: Any) -> None:
        counters["in_flight"] += 1
        request.distcrawl_arrival = (time.time(), counters["in_flight"])

    def leave(request: Any) -> tuple[float, int]:
        arrival: tuple[float, int] | None = getattr(request, "distcrawl_arrival", None)
        if arrival is None:  # never arrived, or already logged (dropped, disconnected)
            return 0.0, 0
        request.distcrawl_arrival = None
        counters["in_flight"] -= 1
        return arrival

    def describe(request: http.Request) -> tuple[str, str, str]:
        method = request.method.decode("latin-1")
        uri = request.uri.decode("utf-8", "replace")
        ua = (request.getHeader(b"user-agent") or b"-").decode("utf-8", "replace")
        return method, uri, ua

    class DemoResource(resource.Resource):
        isLeaf = True

        def render_GET(self, request: server.Request) -> bytes | int:
            arrive(request)
            path = request.path.decode("utf-8", "replace")
            if path.startswith("/page/"):
                counters["pages"] += 1
                if counters["pages"] == cfg.faults.throttle_at:
                    request.setResponseCode(429)
                    request.setHeader(b"retry-after", _retry_after(cfg.faults))
                    return b"<html><body>slow down</body></html>"
            if fails_first(path, cfg) and attempts.get(path, 0) < cfg.faults.fail_times:
                attempts[path] = attempts.get(path, 0) + 1
                if cfg.faults.fail_mode == "drop":
                    # the connection dies in the middle of the answer: the client sees data
                    # loss (a reset before any byte would make Twisted's HTTP client re-send
                    # the request at once by itself, hiding the failure from the crawler)
                    method, uri, ua = describe(request)
                    request_log.write(method, uri, DROPPED_STATUS, ua, *leave(request))
                    request.setHeader(b"content-length", b"100000")
                    request.write(b"<html><body>partial")
                    transport: Any = request.channel.transport
                    transport.loseConnection()
                    return server.NOT_DONE_YET
                request.setResponseCode(503)
                return b"<html><body>try again</body></html>"
            answer = fresh.answer_request(request) or route(path, cfg)
            request.setResponseCode(answer.status)
            if answer.content_type:
                request.setHeader(b"content-type", answer.content_type)
            if answer.location is not None:
                request.setHeader(b"location", answer.location)
            for name, value in answer.headers:
                request.setHeader(name, value)
            if cfg.delay <= 0 or request.path == b"/robots.txt":
                _finish(request, answer.body)  # not by Twisted, which gives a 304 a length
                return server.NOT_DONE_YET
            call = reactor.callLater(cfg.delay, _finish, request, answer.body)
            request.notifyFinish().addErrback(_disconnected, request, call)
            return server.NOT_DONE_YET

    def _finish(request: server.Request, body: bytes) -> None:
        if request._disconnected:  # connection lost but errback not yet run
            return
        if request.code not in http.NO_BODY_CODES:  # a 304 has no Content-Length of its own
            request.setHeader(b"content-length", b"%d" % len(body))
        if request.method != b"HEAD":
            request.write(body)
        request.finish()

    def _disconnected(_failure: object, request: server.Request, call: Any) -> None:
        if call.active():
            call.cancel()
        method, uri, ua = describe(request)
        request_log.write(method, uri, DISCONNECTED_STATUS, ua, *leave(request))

    class DemoSite(server.Site):
        def log(self, request: http.Request) -> None:
            method, uri, ua = describe(request)
            request_log.write(method, uri, request.code, ua, *leave(request))
            fresh.count(uri, request.code)

    # Site's and Resource's __init__ are unannotated, and untyped_calls_exclude does not
    # reach a subclass's constructor
    site = DemoSite(DemoResource())  # type: ignore[no-untyped-call]
    site.displayTracebacks = False
    site.noisy = False
    return site


def serve(host: str, port: int, cfg: SiteConfig, log_path: str | None) -> None:
    """Run until SIGTERM/SIGINT; Twisted's default signal handlers stop the reactor."""
    reactor = _reactor()
    request_log = RequestLog(log_path)
    listener = reactor.listenTCP(port, _build_site(cfg, request_log), interface=host)
    real = listener.getHost()
    sys.stdout.write(f"READY http://{real.host}:{real.port}\n")
    sys.stdout.flush()
    try:
        reactor.run()
    finally:
        request_log.close()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m distcrawl.demo.site", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--pages", type=int, default=2000)
    p.add_argument("--links", type=int, default=17)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--delay", type=float, default=0.0, help="seconds added to each response")
    p.add_argument("--crawl-delay", type=float, default=None, help="Crawl-delay in robots.txt")
    p.add_argument("--log", default=None, help="request log path (appended)")
    p.add_argument(
        "--fail-rate",
        type=float,
        default=0.0,
        help="share of pages that fail their first --fail-times requests",
    )
    p.add_argument("--fail-times", type=int, default=2)
    p.add_argument(
        "--fail-mode",
        choices=("503", "drop"),
        default="503",
        help="answer 503, or drop the connection without an answer",
    )
    p.add_argument(
        "--throttle-at",
        type=int,
        default=0,
        help="answer the n-th page request with 429 and Retry-After (0: never)",
    )
    p.add_argument("--retry-after", type=float, default=3.0, help="seconds, for --throttle-at")
    p.add_argument(
        "--retry-after-date",
        action="store_true",
        help="send --retry-after as an HTTP date (this host's clock plus the seconds)",
    )
    p.add_argument(
        "--leaves",
        type=int,
        default=0,
        help="the home page also links to /leaf/0 .. /leaf/N-1, tiny pages without links",
    )
    p.add_argument(
        "--hostile-link",
        action="append",
        default=[],
        help=f"a URL (any scheme) that {HOSTILE_PAGE}, linked from the home page, links to "
        f"and that {HOSTILE_REDIRECT}<i> redirects to (repeatable)",
    )
    add_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    cfg = SiteConfig(
        args.pages,
        args.links,
        args.seed,
        args.delay,
        args.crawl_delay,
        Faults(
            args.fail_rate,
            args.fail_times,
            args.fail_mode,
            args.throttle_at,
            args.retry_after,
            args.retry_after_date,
        ),
        args.leaves,
        tuple(args.hostile_link),
        args.fresh_pages,
        args.fresh_fast,
        args.fresh_slow,
    )
    serve(args.host, args.port, cfg, args.log)
    return 0


# --------------------------------------------------------------------------- subprocess helper


def _package_root() -> str:
    """The directory holding the ``distcrawl`` package, so the child imports this checkout."""
    return str(Path(__file__).resolve().parents[2])


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    parts = [_package_root(), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _read_line(stream: IO[bytes], timeout: float) -> bytes:
    """Read one line without blocking past ``timeout`` (the child may hang or die)."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = stream.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
    return buf


class DemoSite(ManagedProcess):
    """Run the demo site in a subprocess; the crawler under test then shares no reactor with it."""

    NAME = "demo site"
    START_TIMEOUT = 10.0

    def __init__(
        self,
        pages: int = 200,
        links: int = 17,
        delay: float = 0.0,
        log_path: str | os.PathLike[str] | None = None,
        crawl_delay: float | None = None,
        host: str = "127.0.0.1",
        seed: int = 1,
        port: int = 0,
        fail_rate: float = 0.0,
        fail_times: int = 2,
        fail_mode: str = "503",
        throttle_at: int = 0,
        retry_after: float = 3.0,
        retry_after_date: bool = False,
        leaves: int = 0,
        hostile_links: tuple[str, ...] | list[str] = (),
        fresh_pages: int = 10,
        fresh_fast: float = 2.0,
        fresh_slow: float = 10.0,
    ) -> None:
        super().__init__()
        self.fresh = (fresh_pages, fresh_fast, fresh_slow)
        self.hostile_links = tuple(hostile_links)
        self.fail_rate, self.fail_times, self.fail_mode = fail_rate, fail_times, fail_mode
        self.throttle_at, self.retry_after = throttle_at, retry_after
        self.retry_after_date = retry_after_date
        self.leaves = leaves
        self.pages = pages
        self.links = links
        self.delay = delay
        self.log_path = str(log_path) if log_path is not None else None
        self.crawl_delay = crawl_delay
        self.host = host
        self.seed = seed
        self.port = port
        self.url = ""

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "distcrawl.demo.site", "--host", self.host]
        cmd += ["--port", str(self.port), "--pages", str(self.pages), "--links", str(self.links)]
        cmd += ["--seed", str(self.seed), "--delay", str(self.delay)]
        if self.crawl_delay is not None:
            cmd += ["--crawl-delay", str(self.crawl_delay)]
        if self.log_path:
            cmd += ["--log", self.log_path]
        if self.fail_rate:
            cmd += ["--fail-rate", str(self.fail_rate), "--fail-times", str(self.fail_times)]
            cmd += ["--fail-mode", self.fail_mode]
        if self.throttle_at:
            cmd += ["--throttle-at", str(self.throttle_at), "--retry-after", str(self.retry_after)]
            if self.retry_after_date:
                cmd.append("--retry-after-date")
        if self.leaves:
            cmd += ["--leaves", str(self.leaves)]
        for url in self.hostile_links:
            cmd += ["--hostile-link", url]
        for option, value in zip(("pages", "fast", "slow"), self.fresh, strict=True):
            cmd += [f"--fresh-{option}", str(value)]
        return cmd

    def start(self) -> DemoSite:
        if self.proc is not None:
            raise RuntimeError("demo site already started")
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, env=_child_env())
        assert self.proc.stdout is not None
        line = _read_line(self.proc.stdout, self.START_TIMEOUT).decode("utf-8", "replace")
        if not line.startswith("READY "):
            code = self.proc.poll()
            self.stop()
            raise RuntimeError(f"demo site did not start (exit code {code}, output {line!r})")
        self.url = line.split()[1].rstrip("/")
        logger.debug("demo site pid %s listening on %s", self.proc.pid, self.url)
        return self

    def stop(self) -> None:
        self._terminate(signal.SIGTERM)

    def url_for(self, path: str) -> str:
        return self.url + path

    def read_log(self) -> list[LogLine]:
        return read_log(self.log_path) if self.log_path else []

    def expected_pages(self) -> set[str]:
        return expected_pages(self.pages, self.leaves)

    def fresh_stats(self) -> FreshStats:
        """The fresh pages' clock origin and the 200s and 304s the site sent, per target."""
        return read_stats(self.url)

    def expected_urls(self) -> set[str]:
        return {self.url + p for p in self.expected_pages()}


#: the pages' names too, which were this module's before pages.py
__all__ = [
    "DISCONNECTED_STATUS",
    "DROPPED_STATUS",
    "HOME_LINKS",
    "HOSTILE_PAGE",
    "HOSTILE_REDIRECT",
    "HTML_TYPE",
    "PDF_BODY",
    "SPECIAL_EVERY",
    "SPECIAL_REMAINDER",
    "DemoSite",
    "Faults",
    "LogLine",
    "RequestLog",
    "SiteConfig",
    "bfs_from_home",
    "expected_pages",
    "extra_links",
    "fails_first",
    "home_links",
    "is_special",
    "leaf_links",
    "main",
    "page_links",
    "read_log",
    "render_home",
    "render_hostile",
    "render_leaf",
    "render_not_found",
    "render_page",
    "render_private",
    "robots_txt",
    "route",
    "serve",
]

if __name__ == "__main__":
    sys.exit(main())
