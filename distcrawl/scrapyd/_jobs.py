"""Jobs over many nodes: one job id per node and number, scheduled one round over the nodes at
a time, and listed back with why each finished job closed."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.request import Request

from distcrawl.scrapyd._nodes import TIMEOUT, Node, ScrapydError, _open, _open_response, call
from distcrawl.scrapyd._secrets import redact_settings

#: how much of a finished job's log is read to find why it closed
LOG_TAIL_BYTES = 65536

_CLOSE_REASON = re.compile(r"Spider closed \(([^)]*)\)")


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
