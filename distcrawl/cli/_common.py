"""What every ``distcrawl`` command shares: exit codes, the connection context, argument
types, output helpers, and where the Redis URL and the project's settings come from.

The Scrapyd commands (distcrawl/scrapyd) and ``distcrawl import`` use them too, so that an
error, an exit code or a JSON line looks the same whichever command printed it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from scrapy.settings import BaseSettings, Settings
from scrapy.utils.project import get_project_settings, inside_project

from distcrawl._commandline import (
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_UNREACHABLE,
    _emit_json,
    subcommand,
)
from distcrawl.config import DEFAULT_REDIS_URL
from distcrawl.config._convert import ConfigError, cluster_mode
from distcrawl.model.connection import auth_refusal, is_cluster, make_redis
from distcrawl.model.frontier_admin import FrontierAdmin
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.names import check_namespace
from distcrawl.model.redact import redact_text, redact_url, url_secrets
from distcrawl.producer import Producer

#: how much of an entry or dead-letter field a human-readable line shows
SHOW_CHARS = 200


class UsageError(Exception):
    """Bad input found after argument parsing (e.g. an unreadable --file): exit 2."""


class Context:
    """The parsed global options and the one lazily made Redis client of this run."""

    def __init__(self, redis_url: str, as_json: bool, cluster: bool | None = False) -> None:
        self.redis_url = redis_url
        self.as_json = as_json
        #: --cluster: whether the URL is a Redis Cluster node (None: ask it when connecting)
        self.cluster = cluster
        self._client: redis.Redis | None = None

    @property
    def shown_url(self) -> str:
        return redact_url(self.redis_url)

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            try:
                client = make_redis(self.redis_url, cluster=self.cluster)
            except (ValueError, redis.exceptions.RedisClusterException) as exc:
                raise UsageError(
                    f"invalid --redis-url {self.shown_url}: {self.scrub(str(exc))}"
                ) from None
            self.cluster = is_cluster(client)
            # A CLI should fail at once on a dead server, not after redis-py's backoff.
            client.set_retry(Retry(NoBackoff(), 0))
            self._client = client
        return self._client

    def keys(self, keys: FrontierKeys) -> FrontierKeys:
        """``keys`` named as on this Redis (hash-tagged on a cluster); connects."""
        return keys.on_cluster(is_cluster(self.client))

    def admin(self, keys: FrontierKeys) -> FrontierAdmin:
        """The operator's commands over crawl ``keys`` on this run's client (no scripts
        registered: none of them runs one)."""
        return FrontierAdmin(self.client, self.keys(keys))

    def producer(
        self, keys: FrontierKeys, settings: BaseSettings | None = None, **kwargs: Any
    ) -> Producer:
        """The :class:`Producer` of crawl ``keys`` on this run's client: the commands that
        push, show the status or handle dead letters share its code with Python callers.
        Without ``settings``, Scrapy's defaults (no project is loaded)."""
        try:
            return Producer(
                lambda: self.client,
                keys.namespace,
                settings if settings is not None else Settings(),
                namespace=keys.namespace,
                **kwargs,
            )
        except ConfigError as exc:
            raise UsageError(str(exc)) from None

    def warn_if_unknown(self, keys: FrontierKeys) -> None:
        """Warn (stderr) when no worker of crawl ``keys`` ever started on this Redis: a
        misspelt spider name would otherwise push to a list no worker reads, or show or
        pause a crawl that is not there, and say "ok". The first worker of a crawl writes
        ``<ns>:meta`` (distcrawl/model/layout.py), a push its start_urls; the first push to a
        Redis no worker of the crawl has seen yet is warned about too, which is right when
        the name is wrong and harmless when it is not."""
        named = self.keys(keys)
        # one slot on a cluster (a crawl's keys share its hash tag), one round trip; two
        # EXISTS, as the producer's ACL grants the records (meta, stats) and the keys that
        # hold requests in selectors of their own, and one command must fit in one of them
        pipe = self.client.pipeline(transaction=False)
        pipe.exists(named.meta, named.stats)
        pipe.exists(named.start_urls, named.queue, named.seen)
        try:
            ran = any(pipe.execute())
        except redis.ResponseError:  # EXISTS not granted to this user: nothing to say
            return
        if not ran:
            print(
                f"warning: no crawl {named.namespace!r} ever ran on this Redis (none of "
                f"{named.meta}, {named.start_urls}, {named.queue}): check the spider name",
                file=sys.stderr,
            )

    def scrub(self, text: str) -> str:
        """``text`` without the URL's secrets, should an error message quote them."""
        return redact_text(text, url_secrets(self.redis_url))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


# ---------------------------------------------------------------------- helpers


def redis_failure(exc: redis.RedisError, where: str, scrub: Callable[[str], str]) -> int:
    """Print a Redis error as every command reports one (refused credentials, Redis out of
    reach, any other error), naming ``where`` (the URL shown, or which side); the exit
    code. ``scrub`` hides the secrets of the URLs in the message."""
    reason = scrub(str(exc)) or type(exc).__name__
    refusal = auth_refusal(exc)
    if refusal is not None:  # a ConnectionError to redis-py, but no network problem
        print(f"error: {refusal} at {where}: {reason}", file=sys.stderr)
        return EXIT_PARTIAL
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        print(f"error: cannot reach Redis at {where}: {reason}", file=sys.stderr)
        return EXIT_UNREACHABLE
    print(f"error: Redis at {where}: {reason}", file=sys.stderr)
    return EXIT_PARTIAL


def _spider(value: str) -> FrontierKeys:
    try:
        return FrontierKeys(check_namespace(value, "spider/namespace"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cluster_option(value: str) -> bool | None:
    try:
        return cluster_mode(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected auto, yes or no") from None


def _json_object(value: str) -> dict[str, Any]:
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError('must be a JSON object, e.g. \'{"tag": "x"}\'')
    return data


def _one_line(text: str, limit: int | None = SHOW_CHARS) -> str:
    """``text`` safe for one terminal line: control characters escaped, long text cut."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    return text


def _show_entry(raw: bytes) -> str:
    return _one_line(raw.decode("utf-8", errors="backslashreplace"))


def _confirm(args: argparse.Namespace, question: str) -> bool:
    """True if ``--yes`` was given or a person at a terminal answered y/yes."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        print(
            "error: stdin is not a terminal, so nothing can be confirmed; "
            "pass --yes to delete without asking",
            file=sys.stderr,
        )
        return False
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer in ("y", "yes"):
        return True
    print("aborted", file=sys.stderr)
    return False


def default_redis_url() -> str:
    """Where the commands go without ``--redis-url``: ``$REDIS_URL``, else the ``REDIS_URL``
    of the Scrapy project the command runs in (found as ``scrapy crawl`` finds it: scrapy.cfg
    or SCRAPY_SETTINGS_MODULE), so that ``distcrawl push`` from a project reaches the Redis
    its workers use; else the local default."""
    from_env = os.environ.get("REDIS_URL")
    if from_env:
        return from_env
    if inside_project():
        try:
            configured = get_project_settings().get("REDIS_URL")
        except Exception:  # a broken settings module: the commands that read it say so
            configured = None
        if configured:
            return str(configured)
    return DEFAULT_REDIS_URL


def _project_settings(overrides: list[str]) -> BaseSettings:
    """The settings the project's workers run with (scrapy.cfg or SCRAPY_SETTINGS_MODULE, then
    ``-s NAME=VALUE`` as on ``scrapy crawl``), so that push accepts what they accept."""
    try:
        settings = get_project_settings()
    except Exception as exc:  # a broken settings module is the user's to fix, not a traceback
        raise UsageError(f"cannot load the project settings: {type(exc).__name__}: {exc}") from None
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError("-s expects NAME=VALUE")  # the text itself may be a secret
        settings.set(name.strip(), value, priority="cmdline")
    return settings


Handler = Callable[[argparse.Namespace, Context], int]


def global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """``--redis-url``/``--json``, accepted before and after the subcommand.

    Subcommands use SUPPRESS so that they only set the value when it is given there.
    """
    parser.add_argument(
        "--redis-url",
        default=None if defaults else argparse.SUPPRESS,
        metavar="URL",
        # never %(default)s: $REDIS_URL may hold a password
        help="Redis to use (default: $REDIS_URL, else the REDIS_URL setting of the Scrapy "
        f"project the command runs in, else {DEFAULT_REDIS_URL})",
    )
    parser.add_argument(
        "--cluster",
        type=_cluster_option,
        default=(os.environ.get("DISTCRAWL_REDIS_CLUSTER") or "auto")
        if defaults
        else argparse.SUPPRESS,
        metavar="auto|yes|no",
        help="whether --redis-url is a node of a Redis Cluster (default: "
        "$DISTCRAWL_REDIS_CLUSTER, else auto: ask the server; acl: no)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if defaults else argparse.SUPPRESS,
        help="machine-readable JSON output",
    )


def settings_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``-s NAME=VALUE``, read by :func:`_project_settings` as ``scrapy crawl`` reads it."""
    parser.add_argument("-s", "--set", action="append", metavar="NAME=VALUE", help=help_text)


def files_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    """The FILEs a replay command reads: at least one."""
    parser.add_argument("files", nargs="+", metavar="FILE", help=help_text)


def existing_files(paths: Sequence[str]) -> None:
    """Refuse before any work when a FILE is missing, rather than part way through."""
    for path in paths:
        if not os.path.isfile(path):
            raise UsageError(f"cannot read {path}: no such file")


def emit(ctx: Context, data: Any, text: str) -> None:
    """A command's result: ``data`` as JSON with ``--json``, else ``text``."""
    if ctx.as_json:
        _emit_json(data)
    else:
        print(text)


def delete_confirmed(
    args: argparse.Namespace,
    ctx: Context,
    keys: FrontierKeys,
    what: str,
    found: int,
    delete: Callable[[], int],
) -> int:
    """The deleting commands' one dialogue: ask (unless ``--yes``) when there is something to
    delete, delete, and say how many ``what`` went."""
    removed = 0
    if found:
        question = f"Delete all {found} {what} of {keys.namespace!r} at {ctx.shown_url}?"
        if not _confirm(args, question):
            return EXIT_PARTIAL
        removed = delete()
    emit(ctx, {"removed": removed}, f"removed {removed} {what} of {keys.namespace!r}")
    return EXIT_OK


def command_maker(common: argparse.ArgumentParser) -> Callable[..., argparse.ArgumentParser]:
    """``command(group, name, handler, help)``: a subcommand of ``group`` that takes the
    crawl's SPIDER (its namespace) and the global options, run by ``handler``."""

    def command(group: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        sub = subcommand(group, name, help_text, [common])
        sub.add_argument(
            "spider", type=_spider, metavar="SPIDER", help="namespace (usually the spider name)"
        )
        sub.set_defaults(handler=handler)
        return sub

    return command
