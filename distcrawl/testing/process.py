"""The child processes of the quick start, the tests and the benchmarks, managed one way.

Every one of them (redis-server, the MongoDB-protocol server, the demo site, a ``scrapy
crawl`` worker) is started by this process and stopped by its PID, with a bounded wait and
SIGKILL after it, so that nothing outlives a test run or a benchmark and nothing is found
by name. The servers share more: a free loopback port (tried again when another process
took it first), a data directory that may outlive the process (so a restart keeps its data),
a log file, and readiness by asking the server itself.
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
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"

P = TypeVar("P", bound="ManagedProcess")
S = TypeVar("S", bound="ServerProcess")


def find_free_port(host: str = HOST) -> int:
    """Ask the kernel for a free port (racy: a server retries with another one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ManagedProcess:
    """One child process, stopped by its PID: a signal, a bounded wait, then SIGKILL."""

    #: how log lines name it
    NAME = "process"
    STOP_TIMEOUT = 5.0

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        #: the file its output goes to, closed when it stops
        self._output: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self: P) -> P:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def _terminate(self, sig: int, timeout: float | None = None) -> None:
        """Send ``sig``, wait up to ``timeout`` (STOP_TIMEOUT), SIGKILL if it is still there;
        close what it wrote to. The process is forgotten either way."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(self.STOP_TIMEOUT if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                logger.warning("%s pid %s ignored signal %s, killing it", self.NAME, proc.pid, sig)
                proc.kill()
                proc.wait(self.STOP_TIMEOUT)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        if self._output is not None:
            self._output.close()
            self._output = None

    def __enter__(self: P) -> P:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass(eq=False, repr=False)
class ServerProcess(ManagedProcess):
    """A server on a loopback port, writing to ``<directory>/<LOG_NAME>``.

    A directory it was not given is a temporary one it owns and removes at :meth:`stop`; a
    given one is kept, so a test can restart the server on its data. A dataclass, as are
    the servers: their options are fields, the process' state is not (``init=False``).
    """

    START_TIMEOUT = 10.0
    PORT_ATTEMPTS = 3
    #: seconds between two readiness checks
    READY_POLL = 0.05
    DIRECTORY_PREFIX = "distcrawl-server-"
    LOG_NAME = "server.log"

    #: None: a free port, another one tried when some other process takes it first
    port: int | None = None
    #: its data directory, a str once made (None: a temporary one, see above)
    directory: str | os.PathLike[str] | None = None
    #: the server's executable, the first word of :meth:`command`
    binary: str = field(default="", kw_only=True)
    _fixed_port: bool = field(init=False, default=False)
    _owns_directory: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        super().__init__()
        self._fixed_port = self.port is not None
        if self.directory is not None:
            self.directory = os.fspath(self.directory)

    @property
    def log_path(self) -> Path | None:
        return Path(self.directory, self.LOG_NAME) if self.directory else None

    def command(self) -> list[str]:
        raise NotImplementedError

    def _ping(self) -> bool:
        """Whether the server answers: readiness is the server's own word, not a port."""
        raise NotImplementedError

    def _spawn_options(self) -> dict[str, Any]:
        """Extra ``subprocess.Popen`` arguments (a working directory, say)."""
        return {}

    def start(self: S) -> S:
        if self.proc is not None:
            raise RuntimeError(f"{self.NAME} already started")
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix=self.DIRECTORY_PREFIX)
            self._owns_directory = True
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._fixed_port else self.PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            if not self._fixed_port:
                self.port = find_free_port()
            if self._spawn_and_wait():
                return self
            logger.warning("%s failed on port %s (attempt %d)", self.NAME, self.port, attempt)
        raise RuntimeError(f"{self.NAME} did not start; see {self.log_path}: {self._log_tail()}")

    def stop(self) -> None:
        """SIGTERM (a clean shutdown: an append-only file is flushed); an owned temporary
        directory is removed."""
        self._terminate(signal.SIGTERM)
        if self._owns_directory and self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
            self._owns_directory = False

    def pause(self) -> None:
        """Stop the server (SIGTERM) but keep its port and directory, for :meth:`resume`."""
        self._terminate(signal.SIGTERM)
        self._fixed_port = True

    def resume(self: S) -> S:
        """Start it again on the same port and directory, on the data it left there."""
        if not self._spawn_and_wait():
            raise RuntimeError(f"{self.NAME} did not restart: {self._log_tail()}")
        return self

    def restart(self: S) -> S:
        """Same port and directory: the data survives (for redis-server, when
        ``appendonly`` is on)."""
        self.pause()
        return self.resume()

    def _spawn_and_wait(self) -> bool:
        assert self.log_path is not None
        self._output = open(self.log_path, "ab")  # noqa: SIM115 - closed in _terminate
        self.proc = subprocess.Popen(
            self.command(),
            stdout=self._output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            **self._spawn_options(),
        )
        if self._wait_ready():
            logger.debug("%s pid %s ready at port %s", self.NAME, self.proc.pid, self.port)
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
            time.sleep(self.READY_POLL)
        return False

    def _log_tail(self, size: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:] if self.log_path else ""
        except OSError:
            return ""
