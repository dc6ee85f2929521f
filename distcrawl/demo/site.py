"""A deterministic demo website for the quick start, the tests and the benchmarks.

Run it standalone::

    python -m distcrawl.demo.site --host 127.0.0.1 --port 0 --pages 2000 --links 17 \
        --seed 1 --delay 0 --log /tmp/site.log

It prints exactly one ``READY http://HOST:PORT`` line once listening. Every page is a pure
function of ``(seed, n)`` so tests can compute the expected crawl without fetching anything
(:func:`page_links`, :func:`expected_pages`), and the request log (:func:`read_log`) lets them
check what a crawler really fetched, how often and with which User-Agent.
"""

from __future__ import annotations

import argparse
import html
import logging
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

from distcrawl.demo.process import ManagedProcess

logger = logging.getLogger(__name__)

HOME_LINKS = 10
SPECIAL_EVERY = 50
SPECIAL_REMAINDER = 7
PDF_BODY = b"%PDF-1.4\n% distcrawl demo file\n%%EOF\n"
HTML_TYPE = b"text/html; charset=utf-8"
DISCONNECTED_STATUS = 499  # nginx's "client closed request": logged, never sent
DROPPED_STATUS = 0  # the site dropped the connection on purpose (--fail-mode drop)
#: linked from / only when the site has hostile links (--hostile-link)
HOSTILE_PAGE = "/hostile/links"
#: + i: a 302 to the i-th hostile link
HOSTILE_REDIRECT = "/hostile/redirect/"

# fmt: off
_WORDS = (
    "crawler", "frontier", "redis", "queue", "scheduler", "spider", "request", "response",
    "politeness", "domain", "shard", "lease", "worker", "retry", "robots", "sitemap",
    "fingerprint", "duplicate", "canonical", "link", "page", "index", "archive", "distributed",
    "resilient", "fast", "steady", "careful", "simple",
)
# fmt: on


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


# --------------------------------------------------------------------------- pure helpers


def home_links(pages: int) -> list[str]:
    """Paths linked from ``/``: the first ten pages are enough because pages chain n -> n+1."""
    return [f"/page/{k}" for k in range(min(HOME_LINKS, max(pages, 0)))]


def leaf_links(leaves: int) -> list[str]:
    """Extra paths linked from ``/`` when the site has leaves: one page that fans out to
    thousands of cheap targets, to load the frontier without fetching thousands of big pages."""
    return [f"/leaf/{i}" for i in range(max(leaves, 0))]


def is_special(n: int) -> bool:
    """Pages that also link to a PDF and to a robots-disallowed page."""
    return n % SPECIAL_EVERY == SPECIAL_REMAINDER


def _rng(n: int, seed: int) -> random.Random:
    """Integer seeding is cheap and, unlike ``hash()``, stable across processes."""
    return random.Random(seed * 1_000_003 + n)


def page_links(n: int, pages: int, links: int, seed: int) -> list[str]:
    """HTML page paths linked from ``/page/<n>``, duplicates included.

    The first link is always ``/page/(n+1) % pages`` so that everything is reachable from
    ``/``; the others are random but fixed for a given ``(seed, n)``. Links to the PDF and the
    private page of special pages are not included (see :func:`extra_links`).
    """
    if pages <= 0:
        return []
    rng = _rng(n, seed)
    out = [f"/page/{(n + 1) % pages}"]
    out.extend(f"/page/{rng.randrange(pages)}" for _ in range(max(links - 1, 0)))
    return out


def extra_links(n: int) -> list[str]:
    """Non-HTML or disallowed links of page n: a PDF and a /private/ page on special pages."""
    if not is_special(n):
        return []
    return [f"/files/{n}.pdf", f"/private/{n}"]


def expected_pages(pages: int, leaves: int = 0) -> set[str]:
    """HTML page paths that a full crawl from ``/`` must fetch (robots-disallowed excluded)."""
    return {"/"} | {f"/page/{n}" for n in range(max(pages, 0))} | set(leaf_links(leaves))


def robots_txt(crawl_delay: float | None = None) -> str:
    """The robots.txt body; ``Crawl-delay`` only when asked for, to test both code paths."""
    body = "User-agent: *\nDisallow: /private/\n"
    if crawl_delay is not None:
        body += f"Crawl-delay: {crawl_delay:g}\n"
    return body


def _sentences(rng: random.Random, count: int) -> str:
    """A little filler text so that pages look like pages to parsers and item extractors."""
    out = []
    for _ in range(count):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 12))]
        out.append(" ".join(words).capitalize() + ".")
    return " ".join(out)


def _anchors(paths: list[str]) -> str:
    return "\n".join(f'<li><a href="{p}">{html.escape(p)}</a></li>' for p in paths)


def _document(title: str, description: str, body: str) -> bytes:
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>"
        f'<meta name="description" content="{html.escape(description)}">'
        f"</head><body>\n{body}\n</body></html>\n"
    ).encode()


def render_home(pages: int, leaves: int = 0, hostile: bool = False) -> bytes:
    """The home page: the crawl's single start URL.

    Leaves get a list of their own, after the pages, and only when there are some; so does
    the hostile page: the home page of a site without either stays byte-for-byte what it
    always was.
    """
    body = (
        "<h1>distcrawl demo site</h1>\n<p>A deterministic site for crawling tests.</p>\n"
        f"<ul>\n{_anchors(home_links(pages))}\n</ul>"
    )
    if leaves > 0:
        body += f'\n<ul class="leaves">\n{_anchors(leaf_links(leaves))}\n</ul>'
    if hostile:
        body += f'\n<ul class="hostile">\n{_anchors([HOSTILE_PAGE])}\n</ul>'
    return _document("Home", "The demo site home page", body)


def render_page(n: int, pages: int, links: int, seed: int) -> bytes:
    """Page n; the text uses a different stream than the links so links stay independent."""
    text = _sentences(_rng(n, seed + 7919), 3)
    paths = page_links(n, pages, links, seed) + extra_links(n)
    body = f"<h1>Page {n}</h1>\n<p>{text}</p>\n<ul>\n{_anchors(paths)}\n</ul>"
    return _document(f"Page {n}", f"Description of page {n}", body)


def render_leaf(i: int) -> bytes:
    """Tiny and link-free, so thousands of leaves cost the crawler little beyond the frontier."""
    return _document(f"Leaf {i}", f"Leaf page {i}", f"<h1>Leaf {i}</h1>")


def render_private(n: int) -> bytes:
    """Served if fetched, so a crawler ignoring robots.txt is visible in the log."""
    return _document(f"Private {n}", f"Private page {n}", f"<h1>Private {n}</h1>")


def render_hostile(links: tuple[str, ...]) -> bytes:
    """A page such as any crawled site may serve: links to URLs of any scheme (``file://``
    on the crawled host, ``ftp://``, ``data:``), and to redirects to each of them."""
    anchors = "\n".join(
        f'<li><a href="{html.escape(url)}">{html.escape(url)}</a></li>' for url in links
    )
    redirects = _anchors([f"{HOSTILE_REDIRECT}{i}" for i in range(len(links))])
    body = f"<h1>Hostile links</h1>\n<ul>\n{anchors}\n{redirects}\n</ul>"
    return _document("Hostile links", "Links a crawler must not follow", body)


def render_not_found() -> bytes:
    return _document("Not found", "Not found", "<h1>404 Not Found</h1>")


def _parse_index(text: str) -> int | None:
    """Only canonical decimals: ``/page/07`` must not alias ``/page/7``."""
    if not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    return int(text)


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


# --------------------------------------------------------------------------- twisted server


class _Route(NamedTuple):
    status: int
    content_type: bytes
    body: bytes
    location: bytes | None = None


class SiteConfig(NamedTuple):
    pages: int
    links: int
    seed: int
    delay: float
    crawl_delay: float | None
    fail_rate: float = 0.0
    fail_times: int = 2
    fail_mode: str = "503"
    #: the n-th request of a page answers 429 with Retry-After: retry_after (0: never)
    throttle_at: int = 0
    retry_after: float = 0.0
    #: the home page also links to /leaf/0 .. /leaf/(leaves-1), tiny pages without links
    leaves: int = 0
    #: URLs listed on HOSTILE_PAGE, which the home page links to when there are some
    hostile_links: tuple[str, ...] = ()


def fails_first(path: str, cfg: SiteConfig) -> bool:
    """Whether ``path`` is one of the pages that fail their first ``fail_times`` requests:
    a deterministic share ``fail_rate`` of the pages, chosen by seed."""
    if cfg.fail_rate <= 0 or not path.startswith("/page/"):
        return False
    return random.Random(f"fail:{cfg.seed}:{path}").random() < cfg.fail_rate


def route(path: str, cfg: SiteConfig) -> _Route:
    """Map a request path to a response; pure so it can be unit-tested without a reactor."""
    if path == "/":
        return _Route(200, HTML_TYPE, render_home(cfg.pages, cfg.leaves, bool(cfg.hostile_links)))
    if path == "/robots.txt":
        return _Route(200, b"text/plain; charset=utf-8", robots_txt(cfg.crawl_delay).encode())
    head, _, tail = path[1:].partition("/")
    if head == "page":
        n = _parse_index(tail)
        if n is not None and n < cfg.pages:
            return _Route(200, HTML_TYPE, render_page(n, cfg.pages, cfg.links, cfg.seed))
    elif head == "leaf":
        n = _parse_index(tail)
        if n is not None and n < cfg.leaves:
            return _Route(200, HTML_TYPE, render_leaf(n))
    elif head == "files" and tail.endswith(".pdf"):
        n = _parse_index(tail[:-4])
        if n is not None and n < cfg.pages and is_special(n):
            return _Route(200, b"application/pdf", PDF_BODY)
    elif head == "broken":
        # /broken/<n> always answers 503: a page no number of retries will fetch
        return _Route(503, HTML_TYPE, b"<html><body>always down</body></html>")
    elif head == "redirect":
        # /redirect/<n> answers 302 to /page/<n>: a request that becomes another request
        n = _parse_index(tail)
        if n is not None and n < cfg.pages:
            return _Route(302, HTML_TYPE, b"", f"/page/{n}".encode())
    elif head == "hostile" and cfg.hostile_links:
        if path == HOSTILE_PAGE:
            return _Route(200, HTML_TYPE, render_hostile(cfg.hostile_links))
        n = _parse_index(path.removeprefix(HOSTILE_REDIRECT))
        if path.startswith(HOSTILE_REDIRECT) and n is not None and n < len(cfg.hostile_links):
            return _Route(302, HTML_TYPE, b"", cfg.hostile_links[n].encode())
    elif head == "private":
        n = _parse_index(tail)
        if n is not None and n < cfg.pages and is_special(n):
            return _Route(200, HTML_TYPE, render_private(n))
    return _Route(404, HTML_TYPE, render_not_found())


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


def _build_site(cfg: SiteConfig, request_log: RequestLog) -> Any:
    """Twisted is imported lazily so importing the pure helpers stays cheap for tests."""
    from twisted.web import http, resource, server

    reactor = _reactor()
    attempts: dict[str, int] = {}  # failures served so far, per path
    counters = {"in_flight": 0, "pages": 0}

    def arrive(request: Any) -> None:
        counters["in_flight"] += 1
        request.distcrawl_arrival = (time.time(), counters["in_flight"])

    def leave(request: Any) -> tuple[float, int]:
        arrival = getattr(request, "distcrawl_arrival", None)
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
                if counters["pages"] == cfg.throttle_at:
                    request.setResponseCode(429)
                    request.setHeader(b"retry-after", b"%d" % cfg.retry_after)
                    return b"<html><body>slow down</body></html>"
            if fails_first(path, cfg) and attempts.get(path, 0) < cfg.fail_times:
                attempts[path] = attempts.get(path, 0) + 1
                if cfg.fail_mode == "drop":
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
            answer = route(path, cfg)
            request.setResponseCode(answer.status)
            request.setHeader(b"content-type", answer.content_type)
            if answer.location is not None:
                request.setHeader(b"location", answer.location)
            if cfg.delay <= 0 or request.path == b"/robots.txt":
                return answer.body
            call = reactor.callLater(cfg.delay, _finish, request, answer.body)
            request.notifyFinish().addErrback(_disconnected, request, call)
            return server.NOT_DONE_YET

    def _finish(request: server.Request, body: bytes) -> None:
        if request._disconnected:  # connection lost but errback not yet run
            return
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

    site = DemoSite(DemoResource())
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
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    cfg = SiteConfig(
        args.pages,
        args.links,
        args.seed,
        args.delay,
        args.crawl_delay,
        args.fail_rate,
        args.fail_times,
        args.fail_mode,
        args.throttle_at,
        args.retry_after,
        args.leaves,
        tuple(args.hostile_link),
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
        leaves: int = 0,
        hostile_links: tuple[str, ...] | list[str] = (),
    ) -> None:
        super().__init__()
        self.hostile_links = tuple(hostile_links)
        self.fail_rate, self.fail_times, self.fail_mode = fail_rate, fail_times, fail_mode
        self.throttle_at, self.retry_after = throttle_at, retry_after
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
        if self.leaves:
            cmd += ["--leaves", str(self.leaves)]
        for url in self.hostile_links:
            cmd += ["--hostile-link", url]
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

    def expected_urls(self) -> set[str]:
        return {self.url + p for p in self.expected_pages()}


def bfs_from_home(pages: int, links: int, seed: int, leaves: int = 0) -> Iterator[str]:
    """Paths in crawl order from ``/``, following only HTML page links (what must be fetched)."""
    seen = {"/"}
    queue = ["/"]
    head = 0
    while head < len(queue):
        path = queue[head]
        head += 1
        yield path
        if path == "/":
            nxt = home_links(pages) + leaf_links(leaves)
        elif path.startswith("/leaf/"):
            nxt = []
        else:
            nxt = page_links(int(path.rsplit("/", 1)[1]), pages, links, seed)
        for p in nxt:
            if p not in seen:
                seen.add(p)
                queue.append(p)


if __name__ == "__main__":
    sys.exit(main())
