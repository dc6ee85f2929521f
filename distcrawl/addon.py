"""One line to turn a Scrapy project into a distcrawl worker: ``ADDONS = {"distcrawl.Addon": 0}``.

The add-on only sets component settings (at the "addon" priority, so a project's own
settings still win); every distcrawl value is read later, once, by DistcrawlConfig.
"""

from __future__ import annotations

from scrapy.settings import BaseSettings


class Addon:
    def update_settings(self, settings: BaseSettings) -> None:
        settings.set("SCHEDULER", "distcrawl.scheduler.Scheduler", "addon")
        settings.set("DUPEFILTER_CLASS", "distcrawl.dupefilter.RedisDupeFilter", "addon")
