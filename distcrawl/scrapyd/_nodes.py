"""Scrapyd nodes, and the one way distcrawl talks to them: Scrapyd's JSON API over HTTP.

A node is named by URL or by a scrapy.cfg deploy target, as ``scrapyd-deploy`` names it, and
its credentials never appear in a URL shown or an error raised: a node's answer (or the error
about it) can quote the password, which is redacted. Only the standard library is needed, so
that the machine that deploys needs no Scrapyd.
"""

from __future__ import annotations

import base64
import configparser
import contextlib
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit
from urllib.request import Request, urlopen

from distcrawl.model.redact import redact_text

NODES_ENV = "DISTCRAWL_SCRAPYD_NODES"
TIMEOUT = 30.0


class ScrapydError(Exception):
    """A node answered with an error (Scrapyd's own message, or an HTTP status)."""


class NodeUnreachable(ScrapydError):
    """The node did not answer at all."""


class ConfigProblem(Exception):
    """Bad input found after argument parsing: the command exits with 2."""


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
