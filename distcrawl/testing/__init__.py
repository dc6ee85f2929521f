"""Real services and workers, started and stopped by PID, for tests of a crawl.

The quick start, distcrawl's own tests and its benchmarks run a crawl on the same processes:
a ``redis-server``, a MongoDB-protocol server and ``scrapy crawl`` workers (the demo site is
in :mod:`distcrawl.demo`). A project can test its own spiders against a real frontier the
same way::

    from distcrawl.testing import RedisServer

    with RedisServer() as server:
        ...  # REDIS_URL = server.url

A real server rather than a fake: the frontier relies on Lua scripts, blocking commands and
AOF durability, which fakes do not reproduce.
"""

from distcrawl.testing.mongo_server import MongoServer
from distcrawl.testing.process import HOST, ManagedProcess, ServerProcess, find_free_port
from distcrawl.testing.redis_server import RedisServer
from distcrawl.testing.workers import Worker, worker_agent

__all__ = [
    "HOST",
    "ManagedProcess",
    "MongoServer",
    "RedisServer",
    "ServerProcess",
    "Worker",
    "find_free_port",
    "worker_agent",
]
