"""The console's aiohttp application: its routes, pages, JSON endpoints and actions.

Redis is read with the same blocking redis-py client and readers as the command line, on a
small thread pool (``run_in_executor``), never on the event loop: so the console shows the
numbers ``distcrawl status`` shows, read by the one reader (no second, asynchronous copy of
the dashboard, the sizes or the producer to keep in step), and a slow Redis delays a page,
never the loop serving the others.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import jinja2
import redis
from aiohttp import web
from scrapy.settings import BaseSettings

from distcrawl.model.frontier import Frontier
from distcrawl.model.frontier_admin import FrontierAdmin
from distcrawl.model.keys import FrontierKeys
from distcrawl.producer import Outcome, Producer
from distcrawl.web import reads
from distcrawl.web.security import Guard, Handler

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
T = TypeVar("T")
#: the dead-letter sources a re-drive may be limited to (``distcrawl dead redrive --source``)
SOURCES = ("retry", "callback", "download", "enqueue", "start_urls", "queue", "commit", "doctor")

CONSOLE: web.AppKey[Console] = web.AppKey("console")


class Connection(Protocol):
    """What the console takes from the command line's connection context
    (``distcrawl.cli._common.Context``): its one Redis client, keys named as on that Redis,
    the commands' admin and producer, and the URL's secrets hidden. A protocol, so that the
    console does not import the command line that starts it (no import cycle)."""

    @property
    def client(self) -> redis.Redis: ...

    @property
    def shown_url(self) -> str: ...

    def keys(self, keys: FrontierKeys) -> FrontierKeys: ...

    def admin(self, keys: FrontierKeys) -> FrontierAdmin: ...

    def producer(
        self, keys: FrontierKeys, settings: BaseSettings | None = None, **kwargs: Any
    ) -> Producer: ...

    def scrub(self, text: str) -> str: ...


def _iso(value: Any) -> str:
    try:
        return datetime.fromtimestamp(float(value), tz=timezone.utc).isoformat(timespec="seconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"


class Console:
    """The console's state: its crawls, the Redis context, the settings actions use, the
    guard, the rates of each crawl and the thread pool the reads run on."""

    def __init__(
        self,
        ctx: Connection,
        crawls: Sequence[str],
        guard: Guard,
        *,
        allow_actions: bool,
        settings: BaseSettings,
    ) -> None:
        self.ctx = ctx
        self.crawls = list(crawls)
        self.guard = guard
        self.allow_actions = allow_actions
        self.settings = settings
        self.rates = {name: reads.Rates() for name in self.crawls}
        self._frontiers: dict[str, Frontier] = {}
        self._lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="distcrawl-web")
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["iso"] = _iso

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread pool: every Redis call goes through here."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def keys(self, name: str) -> FrontierKeys:
        if name not in self.crawls:
            raise web.HTTPNotFound(text=f"no crawl {name!r} in this console")
        return self.ctx.keys(FrontierKeys(name))

    def frontier(self, name: str) -> Frontier:
        """The crawl's Frontier, made once (it loads the scripts: 50 ms, more than a page's
        reads) and shared by the pool's threads (the snapshot only sends a pipeline)."""
        keys = self.keys(name)
        with self._lock:
            if name not in self._frontiers:
                self._frontiers[name] = Frontier(self.ctx.client, keys)
            return self._frontiers[name]

    def page(self, template: str, request: web.Request, **data: Any) -> web.Response:
        html = self.templates.get_template(template).render(
            crawls=self.crawls,
            actions=self.allow_actions,
            csrf=self.guard.csrf,
            message=request.query.get("msg", ""),
            **data,
        )
        return web.Response(text=html, content_type="text/html")


def _console(request: web.Request) -> Console:
    return request.app[CONSOLE]


def _page_number(request: web.Request) -> int:
    try:
        return max(0, int(request.query.get("page", "0")))
    except ValueError:
        raise web.HTTPBadRequest(text="page must be a number") from None


# ---------------------------------------------------------------------- pages


async def index(request: web.Request) -> web.StreamResponse:
    console = _console(request)
    if len(console.crawls) == 1:
        raise web.HTTPFound(f"/crawl/{quote(console.crawls[0])}")
    return console.page("index.html", request)


async def crawl_page(request: web.Request) -> web.StreamResponse:
    console = _console(request)
    name = request.match_info["name"]
    frontier = await console.run(console.frontier, name)
    snap = await console.run(reads.overview, frontier, console.rates[name])
    return console.page("crawl.html", request, name=name, snap=snap, sources=SOURCES)


async def domains_page(request: web.Request) -> web.StreamResponse:
    console = _console(request)
    name = request.match_info["name"]
    keys = await console.run(console.keys, name)
    data = await console.run(reads.domains, console.ctx.client, keys, _page_number(request))
    return console.page("domains.html", request, name=name, data=data)


async def dead_page(request: web.Request) -> web.StreamResponse:
    console = _console(request)
    name = request.match_info["name"]
    keys = await console.run(console.keys, name)
    data = await console.run(reads.dead_page, console.ctx.client, keys, _page_number(request))
    return console.page("dead.html", request, name=name, data=data, sources=SOURCES)


# ---------------------------------------------------------------------- JSON


async def status_json(request: web.Request) -> web.StreamResponse:
    console = _console(request)
    name = request.match_info["name"]
    frontier = await console.run(console.frontier, name)
    snap = await console.run(reads.overview, frontier, console.rates[name])
    return web.json_response(snap)


async def history_json(request: web.Request) -> web.StreamResponse:
    console = _console(request)
    keys = await console.run(console.keys, request.match_info["name"])
    span = request.query.get("span", "hour")
    try:
        data = await console.run(reads.history, console.ctx.client, keys, span)
    except ValueError:
        raise web.HTTPBadRequest(text="span must be hour or day") from None
    return web.json_response(data)


# ---------------------------------------------------------------------- actions


async def _checked_form(request: web.Request) -> tuple[Console, str, dict[str, str]]:
    """The action's console, crawl and form, once read-only mode, the origin and the CSRF
    token allowed it (403 otherwise, before anything is read from Redis)."""
    console = _console(request)
    if not console.allow_actions:
        raise web.HTTPForbidden(text="read-only console: start it with --allow-actions")
    if not console.guard.same_origin(request):
        raise web.HTTPForbidden(text="cross-origin request refused")
    form = {k: str(v) for k, v in (await request.post()).items()}
    if not console.guard.csrf_ok(form.get("csrf", "")):
        raise web.HTTPForbidden(text="missing or wrong form token: reload the page")
    return console, request.match_info["name"], form


def _done(name: str, message: str, where: str = "") -> web.HTTPSeeOther:
    return web.HTTPSeeOther(f"/crawl/{quote(name)}{where}?msg={quote(message)}")


async def _set_paused(request: web.Request, paused: bool) -> web.StreamResponse:
    """Pause or resume, as ``distcrawl pause``/``resume`` do (FrontierAdmin.set_paused)."""
    console, name, _form = await _checked_form(request)
    keys = await console.run(console.keys, name)
    await console.run(lambda: console.ctx.admin(keys).set_paused(paused))
    word = "Paused" if paused else "Resumed"
    logger.info("%s %r from the web console", word, name)
    raise _done(name, "paused: workers see it within one heartbeat" if paused else "resumed")


async def pause_action(request: web.Request) -> web.StreamResponse:
    return await _set_paused(request, True)


async def resume_action(request: web.Request) -> web.StreamResponse:
    return await _set_paused(request, False)


async def push_action(request: web.Request) -> web.StreamResponse:
    console, name, form = await _checked_form(request)
    url = form.get("url", "").strip()
    if not url:
        raise _done(name, "nothing to push")
    keys = await console.run(console.keys, name)

    def push() -> str:
        # what `distcrawl push` does: the entry checked by the workers' rules, then LPUSHed
        producer = console.ctx.producer(keys, console.settings, target="start_urls")
        (result,) = producer.push_many([url.encode("utf-8")], atomic=True)
        if result.outcome is Outcome.REFUSED:
            return f"refused: {result.reason}"
        if result.outcome is Outcome.FULL:
            return "refused: the crawl is at its pending cap"
        return "pushed 1"

    message = await console.run(push)
    logger.info("Push to %r from the web console: %s", name, message)
    raise _done(name, message)


async def redrive_action(request: web.Request) -> web.StreamResponse:
    console, name, form = await _checked_form(request)
    keys = await console.run(console.keys, name)
    source = form.get("source") or None
    if source is not None and source not in SOURCES:
        raise web.HTTPBadRequest(text="unknown source")

    def redrive() -> str:
        # what `distcrawl dead redrive` does, with the same filters
        producer = console.ctx.producer(keys, console.settings, target="start_urls")
        result = producer.redrive(
            error=form.get("error") or None, domain=form.get("domain") or None, source=source
        )
        text = f"re-drove {result.redriven} dead letters"
        if result.not_redrivable:
            text += f"; {result.not_redrivable} matching hold no request to re-drive"
        return text

    message = await console.run(redrive)
    logger.info("Re-drive of %r from the web console: %s", name, message)
    raise _done(name, message, "/dead")


def redis_errors(console: Console) -> Any:
    """A Redis error as a 503 page saying what is wrong, its text redacted (a message may
    quote the URL), instead of a 500 with a traceback in the log."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except redis.RedisError as exc:
            reason = console.ctx.scrub(str(exc)) or type(exc).__name__
            logger.warning("Redis at %s: %s (%s)", console.ctx.shown_url, reason, request.path)
            raise web.HTTPServiceUnavailable(text=f"Redis: {reason}") from None

    return middleware


@web.middleware
async def server_timing(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``Server-Timing: app;dur=<ms>``: the time the handler took (its Redis reads and the
    rendering), which benchmarks/console.py reports per view."""
    started = time.perf_counter()
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
        raise
    response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
    return response


def make_app(console: Console) -> web.Application:
    app = web.Application(
        middlewares=[console.guard.middleware, redis_errors(console), server_timing]
    )
    app[CONSOLE] = console
    app.router.add_get("/", index)
    app.router.add_get("/crawl/{name}", crawl_page)
    app.router.add_get("/crawl/{name}/domains", domains_page)
    app.router.add_get("/crawl/{name}/dead", dead_page)
    app.router.add_get("/api/crawl/{name}/status", status_json)
    app.router.add_get("/api/crawl/{name}/history", history_json)
    # registered in read-only mode too, so that an action is refused with a 403 that says
    # why rather than a 404
    app.router.add_post("/crawl/{name}/pause", pause_action)
    app.router.add_post("/crawl/{name}/resume", resume_action)
    app.router.add_post("/crawl/{name}/push", push_action)
    app.router.add_post("/crawl/{name}/dead/redrive", redrive_action)
    app.router.add_static("/static/", HERE / "static")

    async def close_pool(app: web.Application) -> None:
        console.pool.shutdown(wait=False)

    app.on_cleanup.append(close_pool)
    return app
