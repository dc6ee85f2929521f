"""Scrapy's RobotsTxtMiddleware, read once per cluster, minus a bug that lets disallowed
requests through.

Sharing: each netloc's robots.txt is kept in Redis (``<ns>:robotstxt``) for
DISTCRAWL_ROBOTS_TTL seconds, stamped and aged by the Redis server's clock so that workers
whose clocks disagree still agree on when it expires. The first worker to need it takes a
short lock, downloads it, and stores it; the others wait for it instead of downloading their
own copy. Its Crawl-delay (up to DISTCRAWL_CRAWL_DELAY_MAX) becomes the slot's cluster-wide
delay (``robots.lua``); until it is known, lease.lua hands out only the one request that makes
a worker read robots.txt, so no burst goes out before the delay is known.

The bug:
While a netloc's robots.txt is being downloaded, ``RobotsTxtMiddleware._parsers[netloc]``
holds one shared, unfired Deferred, and every request to that netloc that arrives meanwhile
waits for it. Since Scrapy 2.13 (``async def process_request``, scrapy/scrapy#6802) each
waiter does ``await maybe_deferred_to_future(shared)`` in ``robot_parser()``; that is
``shared.asFuture(loop)`` under the asyncio reactor (a bare ``await shared`` otherwise), and
both add a callback that returns None, i.e. *consume* the result: the first waiter gets the
parser, every later one gets None, which ``process_request_2()`` reads as "no robots.txt,
allow everything". So when three or more requests to a new netloc are dispatched before its
robots.txt arrives, all but the first two skip robots.txt; in a shared frontier that is
common, since a worker starts with a whole lease batch. Before 2.13 each waiter got its own
Deferred chained with a callback that passed the result on; this does that again.

Each waiter's own Deferred also means a waiter cancelled at shutdown cancels only itself,
not the shared Deferred the download will fire.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from protego import Protego
from scrapy import Request, signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware as ScrapyRobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler
from twisted.internet import task
from twisted.internet.defer import Deferred

from distcrawl import signals as distcrawl_signals
from distcrawl.codec.politeness import slot_of
from distcrawl.config import DistcrawlConfig
from distcrawl.model.redact import redact_error

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.robotstxt import RobotParser

    from distcrawl.scheduler import Scheduler

logger = logging.getLogger(__name__)
#: how often a worker looks for the robots.txt another worker is downloading
SHARED_POLL = 0.2

_T = TypeVar("_T")


def _relay(result: _T, waiter: Deferred[_T]) -> _T:
    """Hand the result to one waiter and pass it on, untouched, to the next callback."""
    waiter.callback(result)
    return result


async def _sleep(seconds: float) -> None:
    from twisted.internet import reactor

    await maybe_deferred_to_future(task.deferLater(reactor, seconds))


class RobotsTxtMiddleware(ScrapyRobotsTxtMiddleware):
    """Scrapy's ``RobotsTxtMiddleware`` (same settings, ``ROBOTSTXT_OBEY`` and parser), with
    each robots.txt downloaded by one worker for the whole crawl and its Crawl-delay made the
    slot's shared delay; see the module docstring for the waiter bug it also fixes.
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self.config = DistcrawlConfig.from_settings(crawler.settings)
        crawler.signals.connect(self.frontier_reset, signal=distcrawl_signals.frontier_reset)

    def frontier_reset(self) -> None:
        """A new crawl: the parsed robots.txt of the old one are read again from Redis (or
        downloaded), so that their Crawl-delay, gone with the old frontier, is recorded
        again and lease.lua hands out more than a slot's first request. Downloads under
        way finish and serve their waiters."""
        for netloc, parser in list(self._parsers.items()):
            if not isinstance(parser, Deferred):
                del self._parsers[netloc]

    async def robot_parser(self, request: Request) -> RobotParser | None:
        netloc = urlparse_cached(request).netloc
        parser = self._parsers.get(netloc)
        if isinstance(parser, Deferred):  # robots.txt being read: wait for it
            waiter: Deferred[RobotParser | None] = Deferred()
            parser.addCallback(_relay, waiter)
            return await maybe_deferred_to_future(waiter)
        if netloc in self._parsers:
            return parser
        from distcrawl.scheduler import scheduler_of

        scheduler = scheduler_of(self.crawler)
        if scheduler is None or scheduler.frontier is None:
            # not a distcrawl crawl: Scrapy's own download (the request that starts it
            # reads the result from _parsers, not from the Deferred)
            return await super().robot_parser(request)
        shared: Deferred[RobotParser | None] = Deferred()
        self._parsers[netloc] = shared
        body, fetched = await self._shared_body(request, netloc, scheduler)
        rp = None
        if body is not None:
            rp = build_from_crawler(self._parserimpl, self.crawler, body)
            await self.crawler.signals.send_catch_log_async(
                signal=signals.robots_parsed, robotparser=rp, request=request
            )
        wait = await self._record_crawl_delay(request, body, fetched, scheduler)
        self._parsers[netloc] = rp
        shared.callback(rp)
        if wait > 0:
            # the robots.txt download took this slot's turn: this request gets the next
            self._stats.inc_value("distcrawl/robots/crawl_delay_waits")
            await _sleep(wait)
        return rp

    async def _shared_body(
        self, request: Request, netloc: str, scheduler: Scheduler
    ) -> tuple[bytes | None, bool]:
        """robots.txt from Redis, downloaded by this worker only if nobody else is doing
        it; returns (body or None when it could not be read, downloaded here)."""
        frontier = scheduler.frontier
        assert frontier is not None
        lock_ms = int(self.config.robots.probe_timeout * 1000)
        give_up = time.monotonic() + self.config.robots.probe_timeout
        try:
            while True:
                cached = await self._redis(scheduler, frontier.robots_txt, netloc)
                # the age is by the server's clock; a negative one means the stamp came
                # from another clock (a worker of an older distcrawl): read it again
                if cached is not None and 0 <= cached.age < self.config.robots.ttl:
                    self._stats.inc_value("distcrawl/robots/shared")
                    return (cached.body if cached.status else None), False
                if time.monotonic() > give_up or await self._redis(
                    scheduler, frontier.lock_robots_txt, netloc, lock_ms
                ):
                    break
                await _sleep(SHARED_POLL)
        except redis.RedisError as exc:
            self._redis_failed("read the shared robots.txt of", netloc, exc)
        status, body = await self._download(request)
        try:
            await self._redis(
                scheduler,
                frontier.store_robots_txt,
                netloc,
                status,
                body or b"",
                ttl_ms=int(self.config.robots.ttl * 1000),
            )
        except redis.RedisError as exc:
            self._redis_failed("share the robots.txt of", netloc, exc)
        return body, True

    async def _redis(self, scheduler: Scheduler, func: Any, *args: Any, **kwargs: Any) -> Any:
        """A frontier call on the crawler's Redis thread, awaited without blocking."""
        return await maybe_deferred_to_future(scheduler.io.run(func, *args, **kwargs))

    def _redis_failed(self, what: str, name: str, exc: Exception) -> None:
        """Redis trouble costs sharing, never the crawl: the worker reads robots.txt itself."""
        logger.warning(
            "Could not %s %s (%s)",
            what,
            name,
            redact_error(exc, self.config.redis_url),
            extra={"spider": self.crawler.spider},
        )

    async def _download(self, request: Request) -> tuple[int, bytes | None]:
        """Like Scrapy's own download of robots.txt; (0, None) when it failed, which
        Scrapy reads as "allowed"."""
        url = urlparse_cached(request)
        robotsreq = Request(
            f"{url.scheme}://{url.netloc}/robots.txt",
            priority=self.DOWNLOAD_PRIORITY,
            meta={"dont_obey_robotstxt": True},
            callback=NO_CALLBACK,
        )
        self._stats.inc_value("robotstxt/request_count")
        try:
            assert self.crawler.engine is not None
            response = await self.crawler.engine.download_async(robotsreq)
        except Exception as exc:
            if not isinstance(exc, IgnoreRequest):
                logger.exception(
                    "Error downloading %(request)s: %(f_exception)s",
                    {"request": robotsreq, "f_exception": exc},
                    extra={"spider": self.crawler.spider},
                )
                self._stats.inc_value(f"robotstxt/exception_count/{type(exc)}")
            return 0, None
        self._stats.inc_value("robotstxt/response_count")
        self._stats.inc_value(f"robotstxt/response_status_count/{response.status}")
        return response.status, response.body

    async def _record_crawl_delay(
        self, request: Request, body: bytes | None, fetched: bool, scheduler: Scheduler
    ) -> float:
        delay = 0.0
        if body:
            useragent = self._robotstxt_useragent or request.headers.get(
                b"User-Agent", self._default_useragent
            )
            if isinstance(useragent, bytes):
                useragent = useragent.decode("latin-1")
            found = Protego.parse(body.decode("utf-8", "ignore")).crawl_delay(useragent or "*")
            delay = min(float(found or 0.0), self.config.robots.crawl_delay_max)
        assert scheduler.shards is not None
        slot = slot_of(request, by_ip=self.config.slots_by_ip)
        try:
            # the slot's state lives in the shard of the request's site
            shards = scheduler.shards
            record = shards.parts[shards.of_url(request.url)].record_crawl_delay
            return float(
                await self._redis(scheduler, record, slot, int(delay * 1000), fetched=fetched)
            )
        except redis.RedisError as exc:
            self._redis_failed("record the Crawl-delay of", slot, exc)
            return delay if fetched else 0.0
