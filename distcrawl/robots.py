"""Scrapy's RobotsTxtMiddleware, minus a bug that lets disallowed requests through.

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

from typing import TYPE_CHECKING, TypeVar

from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware as ScrapyRobotsTxtMiddleware
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.robotstxt import RobotParser

_T = TypeVar("_T")


def _relay(result: _T, waiter: Deferred[_T]) -> _T:
    """Hand the result to one waiter and pass it on, untouched, to the next callback."""
    waiter.callback(result)
    return result


class RobotsTxtMiddleware(ScrapyRobotsTxtMiddleware):
    async def robot_parser(self, request: Request) -> RobotParser | None:
        parser = self._parsers.get(urlparse_cached(request).netloc)
        if isinstance(parser, Deferred):  # robots.txt being downloaded: wait for it
            waiter: Deferred[RobotParser | None] = Deferred()
            parser.addCallback(_relay, waiter)
            return await maybe_deferred_to_future(waiter)
        # known, or not asked for yet (then the base class downloads it; the request that
        # starts the download reads the result from _parsers, not from the Deferred)
        return await super().robot_parser(request)
