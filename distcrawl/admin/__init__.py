"""The operator's tools behind the ``distcrawl`` command: ``doctor``, ``migrate`` (to another
Redis, and to another shard count), ``import scrapy-redis`` and the crawl's ACL users.

Apart because they send Redis commands the worker's user is never granted, and because no
worker needs them: nothing imports this package but ``distcrawl.cli`` (the import rule of
docs/development.md).
"""
