"""Run distcrawl on Scrapyd: deploy a project to many nodes, spread jobs over them, watch and
cancel them (``distcrawl scrapyd ...``), and keep connection secrets out of Scrapyd.

Every job of a spider on every node shares one Redis frontier, so scaling a crawl is:
deploy once per node, then schedule as many jobs per node as the node has cores to spare.

The client side (deploy, schedule, status, cancel) only needs the standard library and talks
to Scrapyd's JSON API, with HTTP basic auth when the node asks for it.

The node side is optional but recommended when connection settings are given per job
(``-d setting=REDIS_URL=...``): plain Scrapyd 1.6 shows them in clear in ``listjobs.json``
(pending jobs), in its own log (``Process started: ... args=[...]``) and in the crawl's
command line (``ps``). In the node's ``scrapyd.conf``::

    [scrapyd]
    launcher = distcrawl.scrapyd.Launcher

    [services]
    listjobs.json = distcrawl.scrapyd.ListJobs

:class:`Launcher` passes secret settings to the crawl process through its environment
(read back by this module run as Scrapyd's runner, ``python -m distcrawl.scrapyd``) and logs
the command line redacted; :class:`ListJobs` redacts pending jobs' settings and arguments.
Scrapyd still keeps a pending job's settings in its queue database (``dbs_dir``) until the
job starts. Connection settings in the node's environment avoid all of that: the launcher
gives every job the node's ``REDIS_URL`` and ``MONGO_URI`` environment variables as settings
(``distcrawl_env_settings`` in scrapyd.conf changes that list) unless the job sets them.
"""

from __future__ import annotations

from typing import Any

from distcrawl._commandline import EXIT_OK, EXIT_PARTIAL, EXIT_UNREACHABLE
from distcrawl.scrapyd._commands import (
    add_parser,
    cmd_cancel,
    cmd_deploy,
    cmd_schedule,
    cmd_status,
    collect,
)
from distcrawl.scrapyd._egg import build_egg, egg_settings_module, project_root
from distcrawl.scrapyd._jobs import LOG_TAIL_BYTES, Job, expand, list_jobs, plan, schedule
from distcrawl.scrapyd._launcher import (
    DEFAULT_ENV_SETTINGS,
    DEFAULT_RUNNER,
    INNER_RUNNER_ENV,
    RUNNER,
    SECRETS_ENV,
    _server_components,
    runner_main,
)
from distcrawl.scrapyd._nodes import (
    NODES_ENV,
    TIMEOUT,
    ConfigProblem,
    Node,
    NodeUnreachable,
    ScrapydError,
    call,
    default_project,
    deploy_targets,
    parse_nodes,
)
from distcrawl.scrapyd._secrets import is_secret, redact_argv, redact_setting, redact_settings

__all__ = [
    "DEFAULT_ENV_SETTINGS",
    "DEFAULT_RUNNER",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_UNREACHABLE",
    "INNER_RUNNER_ENV",
    "LOG_TAIL_BYTES",
    "NODES_ENV",
    "RUNNER",
    "SECRETS_ENV",
    "TIMEOUT",
    "ConfigProblem",
    "Job",
    "Node",
    "NodeUnreachable",
    "ScrapydError",
    "add_parser",
    "build_egg",
    "call",
    "cmd_cancel",
    "cmd_deploy",
    "cmd_schedule",
    "cmd_status",
    "collect",
    "default_project",
    "deploy_targets",
    "egg_settings_module",
    "expand",
    "is_secret",
    "list_jobs",
    "parse_nodes",
    "plan",
    "project_root",
    "redact_argv",
    "redact_setting",
    "redact_settings",
    "runner_main",
    "schedule",
]

#: Scrapyd's components (Launcher, ListJobs, ProcessProtocol), made on first use: the
#: client side needs no Scrapyd installed
_COMPONENTS: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    if name in ("Launcher", "ListJobs", "ProcessProtocol"):
        if not _COMPONENTS:
            _COMPONENTS.update(_server_components())
        return _COMPONENTS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
