"""The demo site's pages and routes: every page a pure function of ``(seed, n)``, so that the
tests and the benchmarks compute the expected crawl without fetching anything
(:func:`page_links`, :func:`expected_pages`, :func:`bfs_from_home`), and :func:`route` maps a
path to its answer without a server. The server and its process are in site.py.
"""

from __future__ import annotations

import html
import random
from collections.abc import Iterator
from typing import NamedTuple

HOME_LINKS = 10
SPECIAL_EVERY = 50
SPECIAL_REMAINDER = 7
PDF_BODY = b"%PDF-1.4\n% distcrawl demo file\n%%EOF\n"
HTML_TYPE = b"text/html; charset=utf-8"
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


class _Route(NamedTuple):
    status: int
    #: empty: no Content-Type (a 304)
    content_type: bytes
    body: bytes
    location: bytes | None = None
    #: more headers: (lower-case name, value) pairs
    headers: tuple[tuple[bytes, bytes], ...] = ()


class Faults(NamedTuple):
    """Answers the site gets wrong on purpose, for the tests of retries and of throttling."""

    #: a share of the pages, chosen by seed, fail their first ``fail_times`` requests: a 503,
    #: or with ``fail_mode`` "drop" a connection dropped in the middle of the answer
    fail_rate: float = 0.0
    fail_times: int = 2
    fail_mode: str = "503"
    #: the n-th request of a page answers 429 with Retry-After: retry_after (0: never)
    throttle_at: int = 0
    retry_after: float = 0.0
    #: Retry-After as an HTTP date (this host's clock plus ``retry_after``), not seconds
    retry_after_date: bool = False


class SiteConfig(NamedTuple):
    pages: int
    links: int
    seed: int
    delay: float
    crawl_delay: float | None
    faults: Faults = Faults()
    #: the home page also links to /leaf/0 .. /leaf/(leaves-1), tiny pages without links
    leaves: int = 0
    #: URLs listed on HOSTILE_PAGE, which the home page links to when there are some
    hostile_links: tuple[str, ...] = ()
    #: the fresh pages (fresh.py): pages per kind, seconds per version of fast and slow ones
    fresh_pages: int = 10
    fresh_fast: float = 2.0
    fresh_slow: float = 10.0


def fails_first(path: str, cfg: SiteConfig) -> bool:
    """Whether ``path`` is one of the pages that fail their first ``fail_times`` requests:
    a deterministic share ``fail_rate`` of the pages, chosen by seed."""
    rate = cfg.faults.fail_rate
    if rate <= 0 or not path.startswith("/page/"):
        return False
    return random.Random(f"fail:{cfg.seed}:{path}").random() < rate


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
