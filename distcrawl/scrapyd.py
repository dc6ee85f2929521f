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

import argparse
import base64
import configparser
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit
from urllib.request import Request, urlopen

from distcrawl.redact import MASK, is_secret_name, redact_text

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_UNREACHABLE = 3

#: environment variable through which :class:`Launcher` hands secrets to the runner
SECRETS_ENV = "DISTCRAWL_SCRAPYD_SECRETS"
#: the runner that :class:`Launcher` wraps (Scrapyd's ``runner`` option)
INNER_RUNNER_ENV = "DISTCRAWL_SCRAPYD_RUNNER"
RUNNER = "distcrawl.scrapyd"
DEFAULT_RUNNER = "scrapyd.runner"
NODES_ENV = "DISTCRAWL_SCRAPYD_NODES"
#: settings a job takes from the node's environment variables of the same name, unless the
#: job sets them (``distcrawl_env_settings`` in scrapyd.conf)
DEFAULT_ENV_SETTINGS = "REDIS_URL MONGO_URI"
TIMEOUT = 30.0
#: how much of a finished job's log is read to find why it closed
LOG_TAIL_BYTES = 65536

_CLOSE_REASON = re.compile(r"Spider closed \(([^)]*)\)")

_SETUP_PY = """\
# written by distcrawl scrapyd deploy into a temporary copy of the project
from setuptools import setup, find_packages

setup(
    name="project",
    version="1.0",
    packages=find_packages(),
    entry_points={"scrapy": ["settings = %(settings)s"]},
)
"""
#: not copied into the temporary build tree
_BUILD_IGNORE = (
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "venv",
    ".tox",
    ".nox",
    "node_modules",
    "build",
    "dist",
    "*.egg-info",
    "*.egg",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".scrapy",
    ".demo",
)


class ScrapydError(Exception):
    """A node answered with an error (Scrapyd's own message, or an HTTP status)."""


class NodeUnreachable(ScrapydError):
    """The node did not answer at all."""


class ConfigProblem(Exception):
    """Bad input found after argument parsing: the command exits with 2."""


# ---------------------------------------------------------------------- secrets


def redact_setting(name: str, value: Any) -> str:
    """How a setting (or spider argument) may be shown: secret names hide the whole value."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and is_secret_name(name):
        return MASK
    return redact_text(text)


def is_secret(name: str, value: Any) -> bool:
    return redact_setting(name, value) != (value if isinstance(value, str) else str(value))


def redact_settings(values: Mapping[str, Any]) -> dict[str, str]:
    return {name: redact_setting(name, value) for name, value in values.items()}


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A crawl command line as Scrapyd logs it, with ``-s``/``-a`` values redacted."""
    out: list[str] = []
    previous = ""
    for arg in argv:
        if previous in ("-s", "-a") and "=" in arg:
            name, _, value = arg.partition("=")
            arg = f"{name}={redact_setting(name, value)}"
        else:
            arg = redact_text(arg)
        out.append(arg)
        previous = arg
    return out


# ---------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class Node:
    """One Scrapyd server: its base URL (never with credentials) and its basic auth."""

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.url

    def endpoint(self, path: str) -> str:
        return urljoin(self.url, path.lstrip("/"))


def _node_from_url(url: str, username: str | None, password: str | None) -> Node:
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ConfigProblem(f"invalid node URL {redact_text(url)!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigProblem(f"invalid node URL {redact_text(url)!r}: expected http(s)://HOST:PORT/")
    if parts.username is not None:  # credentials in the URL win for that node
        username, password = parts.username, parts.password or ""
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = f"{host}:{port}" if port is not None else host
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return Node(urlunsplit((parts.scheme, netloc, path, "", "")), username or None, password)


def deploy_targets(sources: Sequence[str] | None = None) -> dict[str, dict[str, str]]:
    """The ``[deploy]``/``[deploy:NAME]`` targets of scrapy.cfg, read as ``scrapyd-deploy``
    reads them (the same files, ``$VARIABLES`` expanded); ``[deploy]`` is ``default``."""
    from scrapy.utils.conf import get_sources

    class _Env(configparser.BasicInterpolation):
        def before_get(
            self, parser: Any, section: str, option: str, value: str, defaults: Any
        ) -> str:
            value = super().before_get(parser, section, option, value, defaults)
            return os.path.expandvars(value)

    cfg = configparser.ConfigParser(interpolation=_Env())
    cfg.read(list(sources) if sources is not None else get_sources(True))
    base = dict(cfg.items("deploy")) if cfg.has_section("deploy") else {}
    targets: dict[str, dict[str, str]] = {}
    if "url" in base:
        targets["default"] = base
    for section in cfg.sections():
        if section.startswith("deploy:"):
            targets[section[len("deploy:") :]] = {**base, **dict(cfg.items(section))}
    return targets


def default_project(given: str | None) -> str:
    if given:
        return given
    project = deploy_targets().get("default", {}).get("project")
    if not project:
        for target in deploy_targets().values():
            project = target.get("project")
            if project:
                break
    if not project:
        raise ConfigProblem("no project: pass --project NAME (or run inside a Scrapy project)")
    return project


def _target_node(target: Mapping[str, str], username: str | None, password: str | None) -> Node:
    """A deploy target's node: its own username/password if it has a username."""
    if target.get("username"):
        username, password = target["username"], target.get("password", "")
    return _node_from_url(target["url"], username, password)


def parse_nodes(spec: str | None, username: str | None, password: str | None) -> list[Node]:
    """``URL[,URL...]``; an entry that is not a URL names a scrapy.cfg deploy target, whose
    ``username``/``password`` are used for it. Credentials inside a URL win for that node."""
    spec = spec if spec is not None else os.environ.get(NODES_ENV, "")
    names = [item.strip() for item in spec.split(",") if item.strip()]
    if not names:
        raise ConfigProblem(f"no nodes: pass --nodes URL[,URL...] (or set {NODES_ENV})")
    nodes: list[Node] = []
    targets: dict[str, dict[str, str]] | None = None
    for name in names:
        if "://" in name:
            nodes.append(_node_from_url(name, username, password))
            continue
        if targets is None:
            targets = deploy_targets()
        target = targets.get(name)
        if target is None or not target.get("url"):
            known = ", ".join(sorted(targets)) or "none"
            raise ConfigProblem(f"unknown node {name!r}: not a URL nor a deploy target ({known})")
        nodes.append(_target_node(target, username, password))
    if len(set(nodes)) != len(nodes):
        raise ConfigProblem("a node is listed twice")
    return nodes


# ---------------------------------------------------------------------- HTTP


def _secrets(node: Node) -> list[str]:
    """The node's password, should its answer (or an error about it) quote it."""
    return [node.password] if node.password else []


def _auth_header(node: Node) -> dict[str, str]:
    if not node.username:
        return {}
    token = f"{node.username}:{node.password or ''}".encode()
    return {"Authorization": "Basic " + base64.b64encode(token).decode("ascii")}


def _open(node: Node, request: Request, timeout: float) -> bytes:
    return _fetch(node, request, timeout)[0]


def _open_response(node: Node, request: Request, timeout: float) -> Mapping[str, str]:
    """The headers of the answer (for a HEAD request)."""
    return _fetch(node, request, timeout)[1]


def _fetch(node: Node, request: Request, timeout: float) -> tuple[bytes, Mapping[str, str]]:
    for name, value in _auth_header(node).items():
        request.add_header(name, value)
    try:
        with urlopen(request, timeout=timeout) as response:
            return bytes(response.read()), {k.lower(): v for k, v in response.headers.items()}
    except HTTPError as exc:
        body = exc.read().decode("utf-8", "replace")
        if exc.code == 401:
            raise ScrapydError(
                f"{node}: HTTP 401, the node wants a username and password "
                "(--username/--password, user:password@ in the URL, or the deploy target)"
            ) from None
        message = body
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(body).get("message") or body
        raise ScrapydError(
            f"{node}: HTTP {exc.code}: {redact_text(message.strip(), _secrets(node))[:500]}"
        ) from None
    except (URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise NodeUnreachable(
            f"{node}: unreachable ({redact_text(str(reason), _secrets(node))})"
        ) from None


def call(
    node: Node,
    endpoint: str,
    *,
    query: Mapping[str, str] | None = None,
    form: Sequence[tuple[str, str]] | None = None,
    timeout: float = TIMEOUT,
) -> dict[str, Any]:
    """One Scrapyd JSON API call: GET with ``query``, or POST of ``form`` (multi-valued)."""
    url = node.endpoint(endpoint)
    if query:
        url += "?" + urlencode(query)
    data = urlencode(form).encode() if form is not None else None
    request = Request(url, data=data, method="POST" if data is not None else "GET")
    return _answer(node, endpoint, _open(node, request, timeout))


def _answer(node: Node, endpoint: str, raw: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(raw)
    except ValueError:
        raise ScrapydError(f"{node}{endpoint}: not a JSON answer: {raw[:200]!r}") from None
    if not isinstance(answer, dict) or answer.get("status") != "ok":
        message = answer.get("message", answer) if isinstance(answer, dict) else answer
        raise ScrapydError(f"{node}: {redact_text(str(message), _secrets(node)).strip()[:500]}")
    return answer


def _upload_egg(
    node: Node, project: str, version: str, egg: bytes, timeout: float
) -> dict[str, Any]:
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in (("project", project), ("version", version)):
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
        parts.append(f"{head}{value}\r\n".encode())
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="egg"; filename="project.egg"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
        + egg
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    request = Request(node.endpoint("addversion.json"), data=b"".join(parts), method="POST")
    request.add_header("Content-Type", f"multipart/form-data; boundary={boundary}")
    return _answer(node, "addversion.json", _open(node, request, timeout))


# ---------------------------------------------------------------------- the egg


def project_root(start: str | os.PathLike[str] | None = None) -> Path:
    """The directory of the closest scrapy.cfg."""
    from scrapy.utils.conf import closest_scrapy_cfg

    cfg = closest_scrapy_cfg(str(start) if start is not None else ".")
    if not cfg:
        raise ConfigProblem("no scrapy.cfg here or above: run this inside the Scrapy project")
    return Path(cfg).resolve().parent


def _settings_module(root: Path) -> str:
    cfg = configparser.ConfigParser()
    cfg.read(root / "scrapy.cfg")
    module = cfg.get("settings", "default", fallback="")
    if not module:
        raise ConfigProblem(f"{root / 'scrapy.cfg'} has no [settings] default = MODULE")
    return module


def egg_settings_module(egg: Path) -> str | None:
    """The ``scrapy``/``settings`` entry point of an egg: what Scrapyd runs it with."""
    with zipfile.ZipFile(egg) as archive:
        try:
            text = archive.read("EGG-INFO/entry_points.txt").decode()
        except KeyError:
            return None
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(text)
    return cfg.get("scrapy", "settings", fallback=None)


def build_egg(root: Path, out_dir: Path) -> Path:
    """Build the project's egg from a temporary copy, so the work tree gets no ``setup.py``,
    ``build/`` or ``*.egg-info``; the copy's own ``setup.py`` is used if it has one, else
    the one ``scrapyd-deploy`` would write. Fails if the egg lacks the entry point Scrapyd
    needs (a pyproject.toml ``[project]`` table makes setuptools ignore setup.py's)."""
    settings = _settings_module(root)
    with tempfile.TemporaryDirectory(prefix="distcrawl-egg-") as tmp:
        copy = Path(tmp, "project")
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns(*_BUILD_IGNORE), symlinks=True)
        if not (copy / "setup.py").exists():
            (copy / "setup.py").write_text(_SETUP_PY % {"settings": settings})
        dist = Path(tmp, "dist")
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            result = subprocess.run(
                [sys.executable, "setup.py", "-q", "bdist_egg", "-d", str(dist)],
                cwd=copy,
                env=env,
                capture_output=True,
                timeout=300,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigProblem(f"could not build the egg: {exc}") from None
        eggs = sorted(dist.glob("*.egg"))
        if result.returncode != 0 or not eggs:
            output = (result.stderr or result.stdout).decode("utf-8", "replace")[-3000:]
            hint = ""
            if "No module named 'setuptools'" in output:
                hint = " (install setuptools<81, e.g. pip install 'distcrawl[scrapyd]')"
            raise ConfigProblem(f"could not build the egg{hint}:\n{output}")
        out_dir.mkdir(parents=True, exist_ok=True)
        egg = out_dir / eggs[0].name
        shutil.copyfile(eggs[0], egg)
    found = egg_settings_module(egg)
    if found != settings:
        raise ConfigProblem(
            f"the egg has no Scrapy settings entry point (Scrapyd could not run it); add to "
            f'pyproject.toml:\n\n[project.entry-points.scrapy]\nsettings = "{settings}"\n'
        )
    return egg


# ---------------------------------------------------------------------- jobs


@dataclass
class Job:
    node: Node
    id: str
    project: str
    spider: str
    state: str = "pending"
    pid: int | None = None
    start_time: str | None = None
    end_time: str | None = None
    log_url: str | None = None
    reason: str | None = None
    settings: dict[str, str] = field(default_factory=dict)
    args: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "node": self.node.url,
            "id": self.id,
            "project": self.project,
            "spider": self.spider,
            "state": self.state,
        }
        for name in ("pid", "start_time", "end_time", "log_url", "reason"):
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        if self.settings:
            data["settings"] = redact_settings(self.settings)
        if self.args:
            data["args"] = redact_settings(self.args)
        return data


def expand(value: str, *, node: int, n: int, job: str) -> str:
    """``{node}`` (1-based node number), ``{n}`` (job number on that node) and ``{job}``."""
    return value.replace("{node}", str(node)).replace("{n}", str(n)).replace("{job}", job)


def plan(nodes: Sequence[Node], jobs_per_node: int, prefix: str) -> list[tuple[int, int, str]]:
    """(node index, job number on it, job id), one round over the nodes at a time, so that
    a failure half-way leaves the jobs already scheduled spread over the nodes."""
    return [
        (i, n, f"{prefix}-{i + 1}-{n}")
        for n in range(1, jobs_per_node + 1)
        for i in range(len(nodes))
    ]


def schedule(
    nodes: Sequence[Node],
    project: str,
    spider: str,
    *,
    jobs_per_node: int,
    settings: Mapping[str, str],
    args: Mapping[str, str] | None = None,
    prefix: str | None = None,
    version: str | None = None,
    priority: float | None = None,
) -> tuple[list[Job], list[str]]:
    """Schedule ``jobs_per_node`` jobs on each node; returns the jobs and the errors."""
    prefix = prefix or f"{spider}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:4]}"
    jobs: list[Job] = []
    errors: list[str] = []
    failed: set[int] = set()
    for index, n, job_id in plan(nodes, jobs_per_node, prefix):
        if index in failed:
            continue
        node = nodes[index]
        form: list[tuple[str, str]] = [
            ("project", project),
            ("spider", spider),
            ("jobid", job_id),
        ]
        if version:
            form.append(("_version", version))
        if priority is not None:
            form.append(("priority", str(priority)))
        job_settings = {k: expand(v, node=index + 1, n=n, job=job_id) for k, v in settings.items()}
        job_args = {k: expand(v, node=index + 1, n=n, job=job_id) for k, v in (args or {}).items()}
        form += [("setting", f"{k}={v}") for k, v in job_settings.items()]
        form += list(job_args.items())
        try:
            answer = call(node, "schedule.json", form=form)
        except ScrapydError as exc:
            errors.append(str(exc))
            failed.add(index)  # one error per node, not one per job
            continue
        jobs.append(
            Job(
                node,
                str(answer.get("jobid", job_id)),
                project,
                spider,
                "pending",
                settings=job_settings,
                args=job_args,
            )
        )
    return jobs, errors


def _close_reason(node: Node, log_url: str) -> str | None:
    """The last ``Spider closed (REASON)`` of a job's log, reading only its end (asked for
    by offset: Twisted fails on a suffix range longer than the file)."""
    url = node.endpoint(log_url)
    try:
        head = _open_response(node, Request(url, method="HEAD"), TIMEOUT)
        size = int(head.get("content-length") or 0)
        start = max(0, size - LOG_TAIL_BYTES)
        tail = _open(node, Request(url, headers={"Range": f"bytes={start}-"}), TIMEOUT)
    except (ScrapydError, ValueError):
        return None
    found = _CLOSE_REASON.findall(tail.decode("utf-8", "replace"))
    return found[-1] if found else None


def list_jobs(node: Node, project: str) -> list[Job]:
    """Every job Scrapyd knows for ``project`` on ``node``."""
    answer = call(node, "listjobs.json", query={"project": project})
    jobs: list[Job] = []
    for state in ("pending", "running", "finished"):
        for item in answer.get(state, []):
            job = Job(
                node,
                str(item.get("id")),
                str(item.get("project", project)),
                str(item.get("spider")),
                state,
                pid=item.get("pid"),
                start_time=item.get("start_time"),
                end_time=item.get("end_time"),
                log_url=item.get("log_url"),
                settings=dict(item.get("settings") or {}),
                args={k: v for k, v in (item.get("args") or {}).items() if k != "_project"},
            )
            jobs.append(job)
    return jobs


def _matches(job: Job, ids: Sequence[str], prefix: str | None) -> bool:
    if ids and job.id not in ids:
        return False
    return not (prefix and not job.id.startswith(prefix))


# ---------------------------------------------------------------------- command line


def _key_value(value: str) -> tuple[str, str]:
    """``K=V``; a bare ``K`` takes the value of the environment variable ``K``, so that a
    secret needs to be neither typed nor visible in ``ps``."""
    name, sep, text = value.partition("=")
    name = name.strip()
    if not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {value!r}")
    if not sep:
        if name not in os.environ:
            raise argparse.ArgumentTypeError(f"{name}: no '=' and no environment variable {name}")
        text = os.environ[name]
    return name, text


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return number


def _emit(data: Any) -> None:
    print(json.dumps(data, ensure_ascii=False, default=str))


def _exit_code(done: int, errors: Sequence[str], unreachable: int) -> int:
    if not errors:
        return EXIT_OK
    if done == 0 and unreachable == len(errors):
        return EXIT_UNREACHABLE
    return EXIT_PARTIAL


def _nodes(args: argparse.Namespace) -> list[Node]:
    return parse_nodes(args.nodes, args.username, args.password)


def _destinations(args: argparse.Namespace) -> list[tuple[Node, str]]:
    """(node, project) for ``--nodes`` and for each deploy target named; with neither,
    $DISTCRAWL_SCRAPYD_NODES, else scrapy.cfg's default target (as scrapyd-deploy does)."""
    out: list[tuple[Node, str]] = []
    names = list(args.targets)
    if args.nodes is not None or (not names and os.environ.get(NODES_ENV)):
        project = default_project(args.project)
        out += [(node, project) for node in _nodes(args)]
    elif not names:
        names = ["default"]
    targets = deploy_targets() if names else {}
    for name in names:
        target = targets.get(name)
        if target is None or not target.get("url"):
            known = ", ".join(sorted(targets)) or "none"
            raise ConfigProblem(f"unknown deploy target {name!r} (scrapy.cfg has: {known})")
        target_project = args.project or target.get("project")
        if not target_project:
            raise ConfigProblem(f"deploy target {name!r} has no project: pass --project NAME")
        out.append((_target_node(target, args.username, args.password), target_project))
    return out


def cmd_deploy(args: argparse.Namespace, *, as_json: bool) -> int:
    root = project_root()
    with tempfile.TemporaryDirectory(prefix="distcrawl-deploy-") as tmp:
        egg = Path(args.egg) if args.egg else build_egg(root, Path(tmp))
        if args.build_egg:
            Path(args.build_egg).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(egg, args.build_egg)
            if as_json:
                _emit({"egg": args.build_egg, "settings": egg_settings_module(egg)})
            else:
                print(f"wrote {args.build_egg} (settings {egg_settings_module(egg)})")
            return EXIT_OK
        destinations = _destinations(args)
        version = args.version or str(int(time.time()))
        data = egg.read_bytes()
        done: list[dict[str, Any]] = []
        errors: list[str] = []
        unreachable = 0
        for node, project in destinations:
            try:
                answer = _upload_egg(node, project, version, data, args.timeout)
            except ScrapydError as exc:
                errors.append(str(exc))
                unreachable += isinstance(exc, NodeUnreachable)
                continue
            done.append(
                {
                    "node": node.url,
                    "project": project,
                    "version": version,
                    "spiders": answer.get("spiders"),
                }
            )
    if as_json:
        _emit({"deployed": done, "errors": errors})
    else:
        for item in done:
            print(
                f"deployed {item['project']} version {item['version']} to {item['node']} "
                f"({item['spiders']} spiders)"
            )
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    return _exit_code(len(done), errors, unreachable)


def cmd_schedule(args: argparse.Namespace, *, as_json: bool) -> int:
    nodes = _nodes(args)
    project = default_project(args.project)
    settings = dict(args.settings or [])
    if args.idle_timeout is not None:
        settings["DISTCRAWL_IDLE_TIMEOUT"] = str(args.idle_timeout)
    jobs, errors = schedule(
        nodes,
        project,
        args.spider,
        jobs_per_node=args.jobs_per_node,
        settings=settings,
        args=dict(args.args or []),
        prefix=args.job_prefix,
        version=args.version,
        priority=args.priority,
    )
    unreachable = sum(1 for e in errors if "unreachable" in e)
    if as_json:
        _emit({"jobs": [job.as_dict() for job in jobs], "errors": errors})
    else:
        for job in jobs:
            print(f"{job.id}  {job.node}")
        print(
            f"scheduled {len(jobs)} {args.spider} jobs of {project!r} on "
            f"{len({job.node for job in jobs})} of {len(nodes)} nodes",
            file=sys.stderr,
        )
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    return _exit_code(len(jobs), errors, unreachable)


def collect(
    nodes: Sequence[Node],
    project: str,
    *,
    ids: Sequence[str] = (),
    prefix: str | None = None,
    reasons: bool = True,
) -> tuple[list[Job], list[str], int]:
    jobs: list[Job] = []
    errors: list[str] = []
    unreachable = 0
    for node in nodes:
        try:
            found = list_jobs(node, project)
        except ScrapydError as exc:
            errors.append(str(exc))
            unreachable += isinstance(exc, NodeUnreachable)
            continue
        for job in found:
            if _matches(job, ids, prefix):
                if reasons and job.state == "finished" and job.log_url:
                    job.reason = _close_reason(node, job.log_url)
                jobs.append(job)
    return jobs, errors, unreachable


def _show(job: Job) -> str:
    detail = job.reason or (f"pid {job.pid}" if job.pid else "")
    when = job.end_time or job.start_time or ""
    line = f"{job.state:<9} {job.id}  {job.spider}  {job.node}  {detail}  {when}".rstrip()
    if job.settings:
        shown = " ".join(f"{k}={v}" for k, v in redact_settings(job.settings).items())
        line += f"  settings: {shown}"
    return line


def cmd_status(args: argparse.Namespace, *, as_json: bool) -> int:
    nodes = _nodes(args)
    project = default_project(args.project)
    jobs, errors, unreachable = collect(
        nodes, project, ids=args.jobs, prefix=args.run, reasons=not args.no_reasons
    )
    if as_json:
        _emit({"jobs": [job.as_dict() for job in jobs], "errors": errors})
    else:
        for job in jobs:
            print(_show(job))
        counts = {
            s: sum(1 for j in jobs if j.state == s) for s in ("pending", "running", "finished")
        }
        print(", ".join(f"{v} {k}" for k, v in counts.items()), file=sys.stderr)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    missing = [job_id for job_id in args.jobs if job_id not in {job.id for job in jobs}]
    for job_id in missing:
        print(f"error: no job {job_id!r} on these nodes", file=sys.stderr)
    if missing and not errors:
        return EXIT_PARTIAL
    return _exit_code(len(jobs) + (len(nodes) - len(errors)), errors, unreachable)


def cmd_cancel(args: argparse.Namespace, *, as_json: bool) -> int:
    if not (args.jobs or args.run or args.all):
        raise ConfigProblem("nothing to cancel: give JOB ids, --run PREFIX or --all")
    nodes = _nodes(args)
    project = default_project(args.project)
    jobs, errors, unreachable = collect(
        nodes, project, ids=args.jobs, prefix=args.run, reasons=False
    )
    cancelled: list[dict[str, Any]] = []
    for job in jobs:
        if job.state == "finished":
            continue
        try:
            answer = call(
                job.node,
                "cancel.json",
                form=[("project", project), ("job", job.id), ("signal", args.signal)],
            )
        except ScrapydError as exc:
            errors.append(str(exc))
            continue
        cancelled.append({"id": job.id, "node": job.node.url, "prevstate": answer.get("prevstate")})
    if as_json:
        _emit({"cancelled": cancelled, "errors": errors})
    else:
        for item in cancelled:
            print(f"cancelled {item['id']} on {item['node']} (was {item['prevstate']})")
        print(f"cancelled {len(cancelled)} jobs", file=sys.stderr)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    finished = {job.id for job in jobs if job.state == "finished"}
    missing = [j for j in args.jobs if j not in {job.id for job in jobs}]
    for job_id in missing:
        print(f"error: no job {job_id!r} on these nodes", file=sys.stderr)
    for job_id in sorted(finished & set(args.jobs)):
        print(f"note: {job_id} had already finished", file=sys.stderr)
    if missing and not errors:
        return EXIT_PARTIAL
    return _exit_code(len(cancelled) + len(finished), errors, unreachable)


def add_parser(
    commands: Any,
    common: argparse.ArgumentParser,
    handler: Callable[[argparse.Namespace, Any], int],
) -> argparse.ArgumentParser:
    """The ``scrapyd`` group of the ``distcrawl`` command; ``handler`` (in cli.py) calls
    ``args.scrapyd_action``."""
    group: argparse.ArgumentParser = commands.add_parser(
        "scrapyd",
        parents=[common],
        help="deploy to Scrapyd nodes, spread jobs over them, watch and cancel them",
        description="Deploy to Scrapyd nodes, spread jobs over them, watch and cancel them.",
    )
    actions = group.add_subparsers(dest="scrapyd_command", required=True, metavar="ACTION")

    nodes = argparse.ArgumentParser(add_help=False)
    nodes.add_argument(
        "--nodes",
        metavar="URL[,URL...]",
        help=f"Scrapyd nodes: URLs or scrapy.cfg deploy target names (default: ${NODES_ENV})",
    )
    nodes.add_argument("--project", metavar="NAME", help="default: the scrapy.cfg [deploy] project")
    nodes.add_argument(
        "--username",
        default=os.environ.get("SCRAPYD_USERNAME"),
        metavar="USER",
        help="HTTP auth of the nodes (default: $SCRAPYD_USERNAME)",
    )
    nodes.add_argument(
        "--password",
        default=os.environ.get("SCRAPYD_PASSWORD"),
        metavar="PASSWORD",
        # never %(default)s
        help="HTTP auth of the nodes (default: $SCRAPYD_PASSWORD)",
    )

    def action(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = actions.add_parser(
            name, parents=[common, nodes], help=help_text, description=help_text
        )
        sub.set_defaults(handler=handler, scrapyd_action=func)
        return sub

    deploy = action(
        "deploy",
        cmd_deploy,
        "build the project's egg from a temporary copy (nothing is written to the work tree) "
        "and upload it to every node",
    )
    deploy.add_argument(
        "targets", nargs="*", metavar="TARGET", help="scrapy.cfg deploy targets (default: default)"
    )
    deploy.add_argument("--version", metavar="V", help="default: the current Unix time")
    deploy.add_argument("--egg", metavar="FILE", help="upload this egg instead of building one")
    deploy.add_argument(
        "--build-egg", metavar="FILE", help="only build the egg (for scrapyd-deploy --egg FILE)"
    )
    deploy.add_argument("--timeout", type=float, default=120.0, help=argparse.SUPPRESS)

    sched = action("schedule", cmd_schedule, "schedule N jobs of SPIDER on every node")
    sched.add_argument("spider", metavar="SPIDER")
    sched.add_argument(
        "--jobs-per-node", type=_positive_int, default=1, metavar="N", help="default 1"
    )
    sched.add_argument(
        "--setting",
        "-s",
        dest="settings",
        action="append",
        type=_key_value,
        metavar="NAME=VALUE",
        help="Scrapy setting of every job; NAME alone takes $NAME from this shell; {node}, "
        "{n} and {job} in VALUE become the node number, the job number on the node and "
        "the job id; repeatable",
    )
    sched.add_argument(
        "--arg",
        "-a",
        dest="args",
        action="append",
        type=_key_value,
        metavar="NAME=VALUE",
        help="spider argument, like --setting; repeatable",
    )
    sched.add_argument(
        "--idle-timeout",
        type=float,
        metavar="SECONDS",
        help="shorthand for --setting DISTCRAWL_IDLE_TIMEOUT=SECONDS: each job finishes after "
        "this long without work",
    )
    sched.add_argument("--job-prefix", metavar="TEXT", help="job ids are TEXT-<node>-<n>")
    sched.add_argument("--version", metavar="V", help="project version (default: the latest)")
    sched.add_argument("--priority", type=float, metavar="P", help="Scrapyd queue priority")

    status = action("status", cmd_status, "list the jobs of the project on every node")
    status.add_argument("jobs", nargs="*", metavar="JOB", help="only these job ids")
    status.add_argument("--run", metavar="PREFIX", help="only job ids starting with PREFIX")
    status.add_argument(
        "--no-reasons",
        action="store_true",
        help="do not read finished jobs' logs for the reason they closed",
    )

    cancel = action(
        "cancel",
        cmd_cancel,
        "cancel pending and running jobs; a running job closes gracefully and gives its "
        "leased requests back to the queue",
    )
    cancel.add_argument("jobs", nargs="*", metavar="JOB", help="job ids")
    cancel.add_argument("--run", metavar="PREFIX", help="every job whose id starts with PREFIX")
    cancel.add_argument("--all", action="store_true", help="every job of the project")
    cancel.add_argument(
        "--signal",
        default="INT",
        metavar="SIG",
        help="INT (default) or TERM: a graceful close; KILL loses nothing either, but the "
        "job's leases are only crawled again once they expire",
    )
    return group


# ---------------------------------------------------------------------- on the Scrapyd node


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

    protocol_base: Any = ScrapyProcessProtocol
    launcher_base: Any = ScrapydLauncher
    listjobs_base: Any = ScrapydListJobs

    class ProcessProtocol(protocol_base):
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

    class Launcher(launcher_base):
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

    class ListJobs(listjobs_base):
        """``listjobs.json`` with pending jobs' secret settings and arguments redacted."""

        def render_GET(self, txrequest: Any) -> dict[str, Any]:
            data: dict[str, Any] = super().render_GET(txrequest)
            for job in data.get("pending", []):
                job["settings"] = redact_settings(job.get("settings") or {})
                job["args"] = redact_settings(job.get("args") or {})
            return data

    return {"Launcher": Launcher, "ListJobs": ListJobs, "ProcessProtocol": ProcessProtocol}


_COMPONENTS: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    if name in ("Launcher", "ListJobs", "ProcessProtocol"):
        if not _COMPONENTS:
            _COMPONENTS.update(_server_components())
        return _COMPONENTS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


if __name__ == "__main__":
    runner_main()
