"""A throwaway ``redis-server`` for tests, benchmarks and the quick start.

Tests use a real server rather than a fake because the frontier relies on Lua scripts,
blocking commands and AOF durability, which fakes do not reproduce faithfully.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger(__name__)

REDIS_BINARY = os.environ.get(
    "DISTCRAWL_REDIS_SERVER", shutil.which("redis-server") or "/usr/bin/redis-server"
)
HOST = "127.0.0.1"


def find_free_port() -> int:
    """Ask the kernel for a free loopback port (racy, hence the retry in RedisServer.start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` subprocess bound to loopback, in a directory that may outlive it."""

    START_TIMEOUT = 10.0
    STOP_TIMEOUT = 5.0
    PORT_ATTEMPTS = 3

    def __init__(
        self,
        port: int | None = None,
        directory: str | os.PathLike[str] | None = None,
        appendonly: bool = False,
        password: str | None = None,
        appendfsync: str = "everysec",
        binary: str = REDIS_BINARY,
        unixsocket: str | os.PathLike[str] | None = None,
    ) -> None:
        self.port = port
        self._fixed_port = port is not None
        self.directory = str(directory) if directory is not None else None
        self._owns_directory = False
        self.appendonly = appendonly
        self.password = password
        self.appendfsync = appendfsync
        self.binary = binary
        #: also listen on this unix socket (keep the path short: about 100 bytes at most)
        self.unixsocket = str(unixsocket) if unixsocket is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None

    # ------------------------------------------------------------------ properties

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

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

    @property
    def log_path(self) -> Path | None:
        return Path(self.directory, "redis.log") if self.directory else None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client; the caller closes it."""
        return redis.Redis.from_url(self.url, **kwargs)

    # ------------------------------------------------------------------ lifecycle

    def command(self) -> list[str]:
        assert self.port is not None and self.directory is not None
        cmd = [self.binary, "--port", str(self.port), "--bind", HOST, "--dir", self.directory]
        cmd += ["--save", "", "--appendonly", "yes" if self.appendonly else "no"]
        cmd += ["--appendfsync", self.appendfsync, "--daemonize", "no"]
        if self.password:
            cmd += ["--requirepass", self.password]
        if self.unixsocket:
            cmd += ["--unixsocket", self.unixsocket, "--unixsocketperm", "700"]
        return cmd

    def start(self) -> RedisServer:
        if self.proc is not None:
            raise RuntimeError("redis server already started")
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="distcrawl-redis-")
            self._owns_directory = True
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._fixed_port else self.PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            if not self._fixed_port:
                self.port = find_free_port()
            if self._spawn_and_wait():
                return self
            logger.warning("redis-server failed on port %s (attempt %d)", self.port, attempt)
        raise RuntimeError(f"redis-server did not start; see {self.log_path}: {self._log_tail()}")

    def stop(self) -> None:
        """Graceful SIGTERM so an AOF is flushed; the owned temp directory is removed."""
        self._terminate(signal.SIGTERM)
        if self._owns_directory and self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
            self._owns_directory = False

    def kill(self) -> None:
        """SIGKILL, keeping the directory: simulates a crash for durability tests."""
        self._terminate(signal.SIGKILL)

    def restart(self) -> RedisServer:
        """Same port and directory, so AOF data survives when ``appendonly`` is on."""
        self._terminate(signal.SIGTERM)
        self._fixed_port = True
        if not self._spawn_and_wait():
            raise RuntimeError(f"redis-server did not restart: {self._log_tail()}")
        return self

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _spawn_and_wait(self) -> bool:
        assert self.log_path is not None
        self._output = open(self.log_path, "ab")  # noqa: SIM115 - closed in _terminate
        self.proc = subprocess.Popen(
            self.command(), stdout=self._output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        if self._wait_ready():
            logger.debug("redis-server pid %s ready at port %s", self.proc.pid, self.port)
            return True
        self._terminate(signal.SIGKILL)
        return False

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if self._ping():
                return True
            time.sleep(0.02)
        return False

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

    def _terminate(self, sig: int) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(self.STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                logger.warning("redis-server pid %s ignored signal %s, killing it", proc.pid, sig)
                proc.kill()
                proc.wait(self.STOP_TIMEOUT)
        if self._output is not None:
            self._output.close()
            self._output = None

    def _log_tail(self, size: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:] if self.log_path else ""
        except OSError:
            return ""
