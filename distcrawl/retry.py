"""Retries that wait in Redis, and dead letters for what retrying cannot fix.

Scrapy's RetryMiddleware retries at once, in the same process. In a shared frontier a retry
should wait (exponential backoff with jitter, at least what ``Retry-After`` asks) and may be
taken by any worker, so the wait lives in Redis (``<ns>:delayed``, scored by due time): it
survives the worker that scheduled it, and no worker holds it in memory.

``RetryMiddleware`` replaces Scrapy's at the same place in DOWNLOADER_MIDDLEWARES and keeps
its settings (RETRY_TIMES, RETRY_HTTP_CODES, RETRY_EXCEPTIONS, ...) and meta keys
(``dont_retry``, ``max_retry_times``). ``CallbackRetryMiddleware`` does the same for a
callback that raises, so a poison page is retried a bounded number of times and then
dead-lettered with its traceback instead of looping across workers or vanishing.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.exceptions import CloseSpider, IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.spidermiddlewares.httperror import HttpError
from scrapy.utils.misc import load_object
from scrapy.utils.python import global_object_name
from scrapy.utils.response import response_status_message

from distcrawl.codec.politeness import retry_after_of
from distcrawl.config import DistcrawlConfig
from distcrawl.config.backoff import RetrySettings
from distcrawl.engine.intake import RETRY_DELAY_META
from distcrawl.scheduler import scheduler_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: meta key of the error history that travels with a request
ERRORS_META = "distcrawl_errors"
#: meta key counting how often a request's callback failed
CALLBACK_FAILURES_META = "distcrawl_callback_failures"
HISTORY_LIMIT = 10


def with_error(request: Request, error: str, status: int | None) -> list[dict[str, Any]]:
    """The request's error history with one more entry (bounded)."""
    history = list(request.meta.get(ERRORS_META) or [])
    history.append({"error": error, "status": status, "time": round(time.time(), 3)})
    return history[-HISTORY_LIMIT:]


def _reason_text(reason: str | Exception | type[Exception]) -> str:
    if isinstance(reason, Exception):
        detail = str(reason)
        name = global_object_name(type(reason))
        return f"{name}: {detail}" if detail else name
    if isinstance(reason, type):
        return global_object_name(reason)
    return reason


@dataclass(eq=False)
class RetryMiddleware:
    """Scrapy's ``RetryMiddleware`` with the wait moved into Redis.

    Same settings and meta keys as Scrapy's, so a project keeps its retry policy; but a retry
    is scheduled in the shared ``delayed`` set with backoff and jitter (at least what
    ``Retry-After`` asks), taken later by whichever worker is free, and a request out of
    retries becomes a dead letter with its error history instead of a log line.
    """

    crawler: Crawler
    backoff: RetrySettings
    _: KW_ONLY
    max_retry_times: int
    retry_http_codes: set[int]
    priority_adjust: int
    exceptions: tuple[type[Exception], ...]

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RetryMiddleware:
        settings = crawler.settings
        if not settings.getbool("RETRY_ENABLED"):
            raise NotConfigured
        exceptions = tuple(
            load_object(x) if isinstance(x, str) else x
            for x in settings.getlist("RETRY_EXCEPTIONS")
        )
        return cls(
            crawler,
            DistcrawlConfig.from_settings(settings).retry,
            max_retry_times=settings.getint("RETRY_TIMES"),
            retry_http_codes={int(x) for x in settings.getlist("RETRY_HTTP_CODES")},
            priority_adjust=settings.getint("RETRY_PRIORITY_ADJUST"),
            exceptions=exceptions,
        )

    def process_response(self, request: Request, response: Response) -> Request | Response:
        if request.meta.get("dont_retry", False) or response.status not in self.retry_http_codes:
            return response
        retry_after = None
        if response.status in (429, 503):
            scheduler = scheduler_of(self.crawler)
            retry_after = retry_after_of(
                response, scheduler.clock.now() if scheduler is not None else None
            )
        reason = response_status_message(response.status)
        return self._retry(request, reason, response.status, retry_after) or response

    def process_exception(self, request: Request, exception: Exception) -> Request | None:
        if request.meta.get("dont_retry", False) or isinstance(exception, IgnoreRequest):
            return None
        if isinstance(exception, self.exceptions):
            return self._retry(request, exception, None, None)
        # retrying cannot fix it: keep it, with its reason, for an operator to look at
        scheduler = scheduler_of(self.crawler)
        if scheduler is not None:
            reason = _reason_text(exception)
            scheduler.dead_letter(
                request,
                f"not retryable: {reason}",
                source="download",
                attempts=request.meta.get("retry_times", 0) + 1,
                last_error=reason,
                errors=with_error(request, reason, None),
            )
        return None

    def _retry(
        self,
        request: Request,
        reason: str | Exception,
        status: int | None,
        retry_after: float | None,
    ) -> Request | None:
        assert self.crawler.spider is not None
        new = get_retry_request(
            request,
            spider=self.crawler.spider,
            reason=reason,
            max_retry_times=request.meta.get("max_retry_times", self.max_retry_times),
            priority_adjust=request.meta.get("priority_adjust", self.priority_adjust),
        )
        text = _reason_text(reason)
        errors = with_error(request, text, status)
        scheduler = scheduler_of(self.crawler)
        if new is None:
            if scheduler is not None:
                attempts = request.meta.get("retry_times", 0) + 1
                scheduler.dead_letter(
                    request,
                    f"gave up after {attempts} attempts: {text}",
                    source="retry",
                    attempts=attempts,
                    last_error=text,
                    status=status,
                    errors=errors,
                )
            return None
        new.meta[ERRORS_META] = errors
        if scheduler is not None:  # without distcrawl's scheduler: Scrapy's immediate retry
            delay = self.backoff.delay(new.meta["retry_times"], retry_after)
            new.meta[RETRY_DELAY_META] = delay
            logger.debug(
                "Retrying %(request)s in %(delay).1fs: %(reason)s",
                {"request": request, "delay": delay, "reason": text},
            )
        return new


class CallbackRetryMiddleware:
    """Retries a request whose callback raised, with backoff, then dead-letters it."""

    def __init__(self, crawler: Crawler, backoff: RetrySettings, max_retries: int) -> None:
        self.crawler = crawler
        self.backoff = backoff
        self.max_retries = max_retries

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CallbackRetryMiddleware:
        config = DistcrawlConfig.from_settings(crawler.settings)
        return cls(crawler, config.retry, config.retry.callback_retries)

    def process_spider_exception(
        self, response: Response, exception: Exception
    ) -> Iterable[Any] | None:
        scheduler = scheduler_of(self.crawler)
        request = response.request
        if scheduler is None or request is None or isinstance(exception, CloseSpider | HttpError):
            return None
        failures = request.meta.get(CALLBACK_FAILURES_META, 0) + 1
        summary = "".join(traceback.format_exception_only(type(exception), exception)).strip()
        errors = with_error(request, f"callback: {summary}", response.status)
        if failures > self.max_retries:
            frames = traceback.format_tb(exception.__traceback__)[-3:]
            scheduler.dead_letter(
                request,
                f"callback failed {failures} times: {summary}",
                source="callback",
                attempts=failures,
                last_error=summary,
                status=response.status,
                errors=errors,
                traceback="".join(frames)[-4000:],
            )
            return None  # Scrapy logs it as a spider error, as usual
        delay = self.backoff.delay(failures)
        logger.error(
            "Callback failed on %(request)s (%(failures)d of %(max)d tries), retrying in "
            "%(delay).1fs",
            {"request": request, "failures": failures, "max": self.max_retries + 1, "delay": delay},
            exc_info=(type(exception), exception, exception.__traceback__),
        )
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value("distcrawl/retry/callback")
        meta = dict(request.meta)
        meta.update(
            {CALLBACK_FAILURES_META: failures, ERRORS_META: errors, RETRY_DELAY_META: delay}
        )
        return [request.replace(meta=meta, dont_filter=True)]
