"""Benchmarks of distcrawl against plain Scrapy and scrapy-redis: ``python -m benchmarks``.

See ``benchmarks/__main__.py`` for what is measured and how.
"""
