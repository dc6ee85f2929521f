"""The ``distcrawl`` command: seed, inspect and clean one crawl's shared frontier.

Operators otherwise do this with ``redis-cli`` and hand-typed key names, which pushes
entries the workers will only dead-letter later and makes it easy to delete another
crawl's keys. So this command validates every entry with the same :func:`parse_entry` the
workers use, with the project's settings, *before* it reaches Redis (push, status and the
dead-letter commands are :class:`distcrawl.Producer`'s, which Python code calls too), builds
every key through :class:`FrontierKeys` (``reset`` removes exactly one crawl's keys and
nothing else), gets its client only from :func:`make_redis`, and only ever shows the Redis
URL through :func:`redact_url`.

Exit codes: 0 success, 1 partial failure or refusal (some entries refused, confirmation
declined, problems ``doctor`` found and did not repair, Redis refused the password, other
Redis error), 2 usage error, 3 Redis unreachable.
"""

from __future__ import annotations

import argparse
import sys

import redis

from distcrawl._commandline import (
    EXIT_FULL,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    _emit_json,
)
from distcrawl.cli import _admin, _crawl, _dead
from distcrawl.cli._common import (
    Context,
    Handler,
    UsageError,
    _project_settings,
    default_redis_url,
    global_options,
    redis_failure,
)
from distcrawl.cli._version import VersionAction

__all__ = [
    "EXIT_FULL",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "Context",
    "UsageError",
    "_emit_json",
    "_project_settings",
    "build_parser",
    "default_redis_url",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distcrawl",
        description="Seed, inspect and clean a distcrawl frontier in Redis.",
        epilog="exit codes: 0 ok, 1 partial failure/refused/problems left, 2 usage error, "
        "3 Redis unreachable, 4 pending cap reached",
    )
    parser.add_argument("--version", action=VersionAction)
    global_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    global_options(common, defaults=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _crawl.add_parsers(commands, common)
    _dead.add_parsers(commands, common)
    _admin.add_parsers(commands, common)
    from distcrawl import scrapyd
    from distcrawl.cli import _import, _migrate, _recrawl, _web

    scrapyd.add_parser(commands, common, _admin.cmd_scrapyd)
    _import.add_parser(commands, common)
    _migrate.add_parser(commands, common)
    _recrawl.add_parsers(commands, common)
    _web.add_parser(commands, common)
    return parser


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return EXIT_OK
    return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help and usage errors: return the code, do not exit
        return _exit_code(exc)
    ctx = Context(args.redis_url or default_redis_url(), args.json, args.cluster)
    handler: Handler = args.handler
    try:
        return handler(args, ctx)
    except UsageError as exc:
        print(f"distcrawl: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except redis.RedisError as exc:
        return redis_failure(exc, ctx.shown_url, ctx.scrub)
    finally:
        ctx.close()
