"""Settings of the bundled project (``scrapy crawl site``); every setting: docs/settings.md.

Connection settings come from the environment so that no credential has to be written in a
file or on a command line: ``REDIS_URL`` and ``MONGO_URI``.
"""

import os

# Scrapy's cookie middleware would download the public suffix list on first use; the bundled
# list is enough and keeps every run offline-safe.
os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")

BOT_NAME = "distcrawl"
SPIDER_MODULES = ["distcrawl.spiders"]
NEWSPIDER_MODULE = "distcrawl.spiders"

ADDONS = {"distcrawl.Addon": 0}

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# the MongoDB item pipeline is enabled by the add-on when this is set
MONGO_URI = os.environ.get("MONGO_URI")

ROBOTSTXT_OBEY = True
USER_AGENT = "distcrawl (+https://github.com/distcrawl/distcrawl)"
CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 16
DOWNLOAD_DELAY = 0
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
FEED_EXPORT_ENCODING = "utf-8"
