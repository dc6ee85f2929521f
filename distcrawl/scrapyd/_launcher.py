"""The part that runs on a Scrapyd node: the launcher and ``listjobs.json`` that keep secret
settings out of Scrapyd's queue listing, its log and ``ps``, and the runner that puts them back
inside the crawl process (``python -m distcrawl.scrapyd``).

Scrapyd is imported only when a node asks for these components, so that the client side needs
no Scrapyd installed.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from distcrawl.scrapyd._secrets import is_secret, redact_argv, redact_settings

#: environment variable through which :class:`Launcher` hands secrets to the runner
SECRETS_ENV = "DISTCRAWL_SCRAPYD_SECRETS"
#: the runner that :class:`Launcher` wraps (Scrapyd's ``runner`` option)
INNER_RUNNER_ENV = "DISTCRAWL_SCRAPYD_RUNNER"
RUNNER = "distcrawl.scrapyd"
DEFAULT_RUNNER = "scrapyd.runner"
#: settings a job takes from the node's environment variables of the same name, unless the
#: job sets them (``distcrawl_env_settings`` in scrapyd.conf)
DEFAULT_ENV_SETTINGS = "REDIS_URL MONGO_URI"


def _take_secrets(message: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Remove secret settings and spider arguments from a Scrapyd queue message."""
    secrets: dict[str, dict[str, str]] = {}
    settings = message.get("settings") or {}
    hidden = {k: str(v) for k, v in settings.items() if is_secret(k, v)}
    for name in hidden:
        del settings[name]
    if hidden:
        secrets["settings"] = hidden
    args = {
        k: str(v)
        for k, v in message.items()
        if not k.startswith("_") and k != "settings" and isinstance(v, str) and is_secret(k, v)
    }
    for name in args:
        del message[name]
    if args:
        secrets["args"] = args
    return secrets


def _server_components() -> dict[str, type]:
    """Scrapyd components, made on first use so the client needs no Scrapyd installed."""
    from scrapyd.interfaces import IEnvironment
    from scrapyd.launcher import Launcher as ScrapydLauncher
    from scrapyd.launcher import ScrapyProcessProtocol, get_crawl_args
    from scrapyd.webservice import ListJobs as ScrapydListJobs
    from twisted.internet import reactor as _reactor

    reactor: Any = _reactor  # zope interfaces confuse mypy about spawnProcess

    # scrapyd ships no types: its classes are Any to mypy
    class ProcessProtocol(ScrapyProcessProtocol):  # type: ignore[misc]
        """Scrapyd's process protocol, logging the command line redacted."""

        args: list[str]

        def log(self, level: str, action: str) -> None:
            shown: list[str] = self.args
            self.args = redact_argv(shown)
            try:
                super().log(level, action)
            finally:
                self.args = shown

        def __repr__(self) -> str:
            return (
                f"ProcessProtocol(project={self.project} spider={self.spider} job={self.job} "
                f"pid={self.pid} args={redact_argv(self.args)})"
            )

    class Launcher(ScrapydLauncher):  # type: ignore[misc]
        """Scrapyd's launcher, with secrets passed through the environment, not argv, and
        the settings named by ``distcrawl_env_settings`` taken from the node's environment
        when the job does not set them."""

        def __init__(self, config: Any, app: Any) -> None:
            super().__init__(config, app)
            names = config.get("distcrawl_env_settings", DEFAULT_ENV_SETTINGS)
            self.env_settings = tuple(names.replace(",", " ").split())

        def _spawn_process(self, message: dict[str, Any], slot: int) -> None:
            project = message["_project"]
            environment = self.app.getComponent(IEnvironment)
            message.setdefault("settings", {})
            secrets = _take_secrets(message)
            message["settings"].update(environment.get_settings(message))
            env = environment.get_environment(message, slot)
            given = set(message["settings"]) | set(secrets.get("settings", {}))
            from_node = {n: env[n] for n in self.env_settings if n not in given and env.get(n)}
            if from_node:
                secrets.setdefault("settings", {}).update(from_node)
            env[INNER_RUNNER_ENV] = self.runner if self.runner != RUNNER else DEFAULT_RUNNER
            if secrets:
                env[SECRETS_ENV] = json.dumps(secrets)
            args = [sys.executable, "-m", RUNNER, "crawl", *get_crawl_args(message)]
            process = ProcessProtocol(project, message["_spider"], message["_job"], env, args)
            process.deferred.addBoth(self._process_finished, slot)
            reactor.spawnProcess(process, sys.executable, args=args, env=env)
            self.processes[slot] = process

    class ListJobs(ScrapydListJobs):  # type: ignore[misc]
        """``listjobs.json`` with pending jobs' secret settings and arguments redacted."""

        def render_GET(self, txrequest: Any) -> dict[str, Any]:
            data: dict[str, Any] = super().render_GET(txrequest)
            for job in data.get("pending", []):
                job["settings"] = redact_settings(job.get("settings") or {})
                job["args"] = redact_settings(job.get("args") or {})
            return data

    return {"Launcher": Launcher, "ListJobs": ListJobs, "ProcessProtocol": ProcessProtocol}


def runner_main(argv: list[str] | None = None) -> None:
    """Scrapyd's runner for :class:`Launcher`'s jobs: put the secrets it passed through the
    environment back as ``-s``/``-a`` options (in this process only, so they are not in
    ``ps``), then run the configured runner (Scrapyd's by default)."""
    import runpy

    argv = sys.argv if argv is None else argv
    secrets = json.loads(os.environ.pop(SECRETS_ENV, "") or "{}")
    for option, key in (("-s", "settings"), ("-a", "args")):
        for name, value in (secrets.get(key) or {}).items():
            argv += [option, f"{name}={value}"]
    inner = os.environ.pop(INNER_RUNNER_ENV, "") or DEFAULT_RUNNER
    sys.argv = argv
    runpy.run_module(inner, run_name="__main__", alter_sys=True)
