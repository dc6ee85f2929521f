"""``distcrawl scrapyd deploy|schedule|status|cancel``: the arguments and what each action
prints, as text or JSON, with its exit status (0 all done, 1 some failed, 3 no node answered).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from distcrawl._commandline import (
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_UNREACHABLE,
    command_group,
    count_option,
    env_option,
    subcommand,
)
from distcrawl._commandline import _emit_json as _emit
from distcrawl.scrapyd._egg import build_egg, egg_settings_module, project_root
from distcrawl.scrapyd._jobs import Job, _close_reason, _matches, list_jobs, schedule
from distcrawl.scrapyd._nodes import (
    NODES_ENV,
    ConfigProblem,
    Node,
    NodeUnreachable,
    ScrapydError,
    _target_node,
    _upload_egg,
    call,
    default_project,
    deploy_targets,
    parse_nodes,
)
from distcrawl.scrapyd._secrets import redact_settings


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
) -> None:
    """The ``scrapyd`` group of the ``distcrawl`` command; ``handler`` (in cli.py) calls
    ``args.scrapyd_action``."""
    actions = command_group(
        commands,
        common,
        "scrapyd",
        "deploy to Scrapyd nodes, spread jobs over them, watch and cancel them",
        "Deploy to Scrapyd nodes, spread jobs over them, watch and cancel them.",
    )

    nodes = argparse.ArgumentParser(add_help=False)
    nodes.add_argument(
        "--nodes",
        metavar="URL[,URL...]",
        help=f"Scrapyd nodes: URLs or scrapy.cfg deploy target names (default: ${NODES_ENV})",
    )
    nodes.add_argument("--project", metavar="NAME", help="default: the scrapy.cfg [deploy] project")
    auth = "HTTP auth of the nodes"
    env_option(nodes, "--username", "SCRAPYD_USERNAME", metavar="USER", help=auth)
    env_option(nodes, "--password", "SCRAPYD_PASSWORD", metavar="PASSWORD", help=auth)

    def action(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        sub = subcommand(actions, name, help_text, [common, nodes])
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
    count_option(sched, "--jobs-per-node", 1, "default 1", at_least_one=True)
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
