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
MONGO_PIPELINE = "distcrawl.pipelines.MongoPipeline"
#: late in the chain: pipelines that clean or drop items run before storage
MONGO_PIPELINE_ORDER = 800


class Addon:
    def update_settings(self, settings: BaseSettings) -> None:
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
        from distcrawl.extensions import WorkerMonitor

        settings.set_in_component_priority_dict("EXTENSIONS", WorkerMonitor, 500)
        # AUTOTHROTTLE_* settings drive the cluster-wide adaptive delay (commit.lua); Scrapy's
        # extension would add a second, per-process one on top
        from scrapy.extensions.throttle import AutoThrottle

        settings.set_in_component_priority_dict("EXTENSIONS", AutoThrottle, None)
        if settings.get("MONGO_URI"):
            pipelines = settings["ITEM_PIPELINES"]
            if isinstance(pipelines, BaseSettings):
                pipelines.set(MONGO_PIPELINE, MONGO_PIPELINE_ORDER, "addon")
            else:
                merged = dict(pipelines or {})
                merged.setdefault(MONGO_PIPELINE, MONGO_PIPELINE_ORDER)
                settings.set("ITEM_PIPELINES", merged, "addon")
