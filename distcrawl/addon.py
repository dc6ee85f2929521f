"""One line to turn a Scrapy project into a distcrawl worker: ``ADDONS = {"distcrawl.Addon": 0}``.

The add-on only sets component settings (at the "addon" priority, so a project's own
settings still win); every distcrawl value is read later, once, by DistcrawlConfig (and
MongoConfig for the item pipeline).
"""

from __future__ import annotations

from scrapy.settings import BaseSettings

#: engine side of every default spider middleware but StartSpiderMiddleware (25), so that a
#: retried request does not pass through DepthMiddleware and friends a second time
CALLBACK_RETRY_ORDER = 30
#: DOWNLOADER_MIDDLEWARES: below RetryMiddleware (550) and RedirectMiddleware (600)
RECRAWL_ORDER = 520
#: SPIDER_MIDDLEWARES: above HttpErrorMiddleware (50)
RECRAWL_SPIDER_ORDER = 55
MONGO_PIPELINE = "distcrawl.pipelines.MongoPipeline"
#: late in the chain: pipelines that clean or drop items run before storage
MONGO_PIPELINE_ORDER = 800
#: Scrapy's download handlers that fetch no web page (local files, buckets, FTP, inline
#: data): turned off unless their scheme is in DISTCRAWL_ALLOWED_SCHEMES
NON_WEB_SCHEMES = ("file", "s3", "ftp", "data")


class Addon:
    """Scrapy add-on (``ADDONS``) that swaps in distcrawl's components.

    Settings go in at the "addon" priority so that a project can still override any one of
    them, and only component settings are set here: the values they read are parsed once, at
    ``from_crawler``, into ``DistcrawlConfig`` (and ``MongoConfig``), where an invalid one
    names itself.
    """

    def update_settings(self, settings: BaseSettings) -> None:
        from distcrawl.config.setting_names import warn_unknown

        # once per crawl, at start, with every source in: settings.py, -s, custom_settings
        warn_unknown(settings)
        settings.set("SCHEDULER", "distcrawl.scheduler.Scheduler", "addon")
        settings.set("DUPEFILTER_CLASS", "distcrawl.dupefilter.RedisDupeFilter", "addon")
        # retries wait in Redis instead of being re-sent at once by the same process
        from scrapy.downloadermiddlewares.retry import RetryMiddleware as ScrapyRetry

        from distcrawl.retry import CallbackRetryMiddleware, RetryMiddleware

        settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", ScrapyRetry, None)
        settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", RetryMiddleware, 550)
        # robots.txt read once per cluster; Scrapy's own lets requests that waited for a
        # robots.txt through (see distcrawl.robots)
        from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware as ScrapyRobots

        from distcrawl.robots import RobotsTxtMiddleware

        settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", ScrapyRobots, None)
        settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", RobotsTxtMiddleware, 100)
        settings.set_in_component_priority_dict(
            "SPIDER_MIDDLEWARES", CallbackRetryMiddleware, CALLBACK_RETRY_ORDER
        )
        # revisits (off unless DISTCRAWL_RECRAWL_INTERVAL is set): engine side of the retry
        # and redirect middlewares, to judge the answer a fetch ended with; and spider side of
        # HttpErrorMiddleware, to take a 304 before it is logged as an ignored response
        from distcrawl.revisit import RecrawlMiddleware, RecrawlSpiderMiddleware

        settings.set_in_component_priority_dict(
            "DOWNLOADER_MIDDLEWARES", RecrawlMiddleware, RECRAWL_ORDER
        )
        settings.set_in_component_priority_dict(
            "SPIDER_MIDDLEWARES", RecrawlSpiderMiddleware, RECRAWL_SPIDER_ORDER
        )
        from distcrawl.extensions import WorkerMonitor

        settings.set_in_component_priority_dict("EXTENSIONS", WorkerMonitor, 500)
        # AUTOTHROTTLE_* settings drive the cluster-wide adaptive delay (commit.lua); Scrapy's
        # extension would add a second, per-process one on top
        from scrapy.extensions.throttle import AutoThrottle

        settings.set_in_component_priority_dict("EXTENSIONS", AutoThrottle, None)
        self._handlers_and_listeners(settings)
        if settings.get("MONGO_URI"):
            pipelines = settings["ITEM_PIPELINES"]
            if isinstance(pipelines, BaseSettings):
                pipelines.set(MONGO_PIPELINE, MONGO_PIPELINE_ORDER, "addon")
            else:
                merged = dict(pipelines or {})
                merged.setdefault(MONGO_PIPELINE, MONGO_PIPELINE_ORDER)
                settings.set("ITEM_PIPELINES", merged, "addon")

    def _handlers_and_listeners(self, settings: BaseSettings) -> None:
        """Nothing a crawled page or a queue entry names may read local files, and a worker
        opens no port it was not asked to (project settings still win over both)."""
        from distcrawl.config import allowed_schemes

        allowed = allowed_schemes(settings)
        handlers = settings["DOWNLOAD_HANDLERS"]
        off = [scheme for scheme in NON_WEB_SCHEMES if scheme not in allowed]
        if isinstance(handlers, BaseSettings):
            for scheme in off:
                handlers.set(scheme, None, "addon")
        else:
            merged = dict(handlers or {})
            for scheme in off:
                merged.setdefault(scheme, None)
            settings.set("DOWNLOAD_HANDLERS", merged, "addon")
        # Scrapy 2.19's remote control: an HTTP endpoint that runs code sent to it, and a
        # job file (with its token) left behind by every worker killed
        settings.set("REMOTE_CONTROL_ENABLED", False, "addon")
        # and its telnet console, a Python shell on a local port, on by default in Scrapy
        settings.set("TELNETCONSOLE_ENABLED", False, "addon")
