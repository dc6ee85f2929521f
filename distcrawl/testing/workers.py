"""Real ``scrapy crawl`` worker processes, for the quick start, the tests and the benchmarks.

Each worker gets its own User-Agent (``distcrawl-worker-<n>``), so that the demo site's own
request log says which worker fetched which page: counts come from the site, not from the
crawler being tested.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from distcrawl.testing.process import ManagedProcess

ROOT = Path(__file__).resolve().parents[2]


def worker_agent(index: int) -> str:
    return f"distcrawl-worker-{index}"


class Worker(ManagedProcess):
    """One ``scrapy crawl`` process of the bundled project, its log in its own file."""

    NAME = "worker"

    def __init__(
        self,
        index: int,
        *,
        redis_url: str,
        log_path: Path,
        spider: str = "site",
        settings: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        mongo_uri: str | None = None,
        spider_args: Mapping[str, str] | None = None,
        wrapper: Sequence[str] = (),
    ) -> None:
        super().__init__()
        self.index = index
        self.redis_url = redis_url
        self.log_path = Path(log_path)
        self.spider = spider
        self.settings = dict(settings or {})
        #: ``-a name=value`` arguments of the spider (e.g. the site spider's allowed_domains)
        self.spider_args = dict(spider_args or {})
        self.env = dict(env or {})
        #: given to the worker as the MONGO_URI environment variable (the bundled settings read
        #: it), never on its command line; None: the worker stores no items
        self.mongo_uri = mongo_uri
        #: a command the worker runs under, e.g. ``["faketime", "-f", "-1h"]`` for a host
        #: whose clock is an hour behind
        self.wrapper = list(wrapper)

    def command(self) -> list[str]:
        cmd = [*self.wrapper, sys.executable, "-m", "scrapy", "crawl", self.spider]
        settings = {"USER_AGENT": worker_agent(self.index), "LOG_FILE": str(self.log_path)}
        settings.update(self.settings)
        for key, value in settings.items():
            cmd += ["-s", f"{key}={value}"]
        for name, value in self.spider_args.items():
            cmd += ["-a", f"{name}={value}"]
        return cmd

    def start(self) -> Worker:
        env = dict(os.environ)
        env.pop("MONGO_URI", None)  # a MONGO_URI of the caller's shell is not for this worker
        if self.mongo_uri:
            env["MONGO_URI"] = self.mongo_uri
        env.update(
            {
                "REDIS_URL": self.redis_url,
                "SCRAPY_SETTINGS_MODULE": "distcrawl.settings",
                "TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS": "",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            }
        )
        env.update(self.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.command(),
            env=env,
            cwd=str(ROOT),
            stdout=subprocess.DEVNULL,
            stderr=open(self.log_path.with_suffix(".stderr"), "wb"),  # noqa: SIM115
        )
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, text: str, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return True
            if self.proc is not None and self.proc.poll() is not None:
                return text in self.log()
            time.sleep(0.05)
        return False

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL: the crash that must lose nothing."""
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (Scrapy's graceful shutdown), then SIGKILL if it does not exit in time."""
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        if self.wait(timeout) is None:
            self.kill()
