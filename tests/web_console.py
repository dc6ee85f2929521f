"""A ``distcrawl web`` process for the console's tests: started on a free loopback port,
ready once it answers, stopped by its PID (distcrawl.testing.process)."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from distcrawl.testing.process import ManagedProcess
from distcrawl.testing.redis_server import find_free_port


class Console(ManagedProcess):
    NAME = "distcrawl web"

    def __init__(self, redis_url: str, log_path: Path, *options: str, crawls=("site",)) -> None:
        super().__init__()
        self.redis_url = redis_url
        self.log_path = log_path
        self.options = options
        self.crawls = crawls
        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.auth: str | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "distcrawl.cli",
            "--redis-url",
            self.redis_url,
            "web",
            *self.crawls,
            "--port",
            str(self.port),
            *self.options,
        ]

    def start(self) -> Console:
        self._output = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.command(), stdout=self._output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"distcrawl web exited {self.proc.returncode}: {self.log()}")
            try:
                self.get("/static/console.css")
                return self
            except urllib.error.HTTPError:
                return self  # it answers (a 401 without the token)
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"distcrawl web did not answer in 20 s: {self.log()}")

    def stop(self) -> None:
        import signal

        self._terminate(signal.SIGTERM)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def request(
        self,
        path: str,
        data: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str, dict[str, str]]:
        """(status, body, headers) of a GET, or of a POST of ``data`` as a form; redirects
        are not followed, so that an action's 303 is seen."""
        body = None if data is None else urllib.parse.urlencode(data).encode()
        req = urllib.request.Request(self.url + path, data=body, headers=dict(headers or {}))
        if self.auth and "Authorization" not in req.headers:
            req.add_header("Authorization", self.auth)
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(req, timeout=10) as resp:
                return resp.status, resp.read().decode(), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace"), dict(exc.headers)

    def get(self, path: str) -> str:
        status, body, _ = self.request(path)
        if status >= 400:
            raise urllib.error.HTTPError(self.url + path, status, body, {}, None)  # type: ignore[arg-type]
        return body

    def csrf(self, crawl: str = "site") -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', self.get(f"/crawl/{crawl}"))
        assert found, "no form token on the page"
        return found.group(1)


def basic(token: str, user: str = "ops") -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None
