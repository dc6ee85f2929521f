"""Scrapy's side turned into the frontier's and back: requests as data (never code), the
entries of ``start_urls`` and of producers checked as a worker checks them, the slot a
request counts against, and dead letters read and re-driven as requests.

Apart because both the worker's engine and the tools that feed or repair a crawl need it,
and neither may depend on the other. The import rule: docs/development.md.
"""
