"""The commands around the frontier: Redis users (acl), MongoDB spill replay, Celery
notification replay, and the entry of the Scrapyd commands."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from distcrawl._commandline import (
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_UNREACHABLE,
    _emit_json,
    command_group,
    env_option,
    subcommand,
)
from distcrawl.cli._common import (
    Context,
    UsageError,
    _project_settings,
    _spider,
    command_maker,
    existing_files,
    files_argument,
)
from distcrawl.config._convert import ConfigError
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.redact import redact_text, redact_url, url_secrets

# ---------------------------------------------------------------------- acl


def cmd_acl(args: argparse.Namespace, ctx: Context) -> int:
    """Print the producer and worker ACL users of a crawl; talks to no Redis (so a
    cluster's key names are only used with ``--cluster yes``)."""
    from distcrawl.admin import acl

    keys: FrontierKeys = (args.namespace or args.spider).on_cluster(ctx.cluster is True)
    try:
        users = acl.roles(
            keys,
            functions=args.scripts == "functions",
            producer=args.producer_user,
            worker=args.worker_user,
            producer_password_env=args.producer_password_env,
            worker_password_env=args.worker_password_env,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if ctx.as_json:
        _emit_json(
            {
                "namespace": keys.namespace,
                "users": [
                    {
                        "role": u.role,
                        "user": u.name,
                        "rules": list(u.rules),
                        "command": u.command(),
                        "password_placeholder": u.placeholder,
                    }
                    for u in users
                ],
            }
        )
    else:
        for user in users:
            print(user.aclfile_line() if args.format == "aclfile" else user.command())
    for user in users:
        if user.placeholder:
            print(
                f"note: replace <{user.role}-password> before use, or pass "
                f"--{user.role}-password-env VAR to print its SHA-256 instead",
                file=sys.stderr,
            )
    return EXIT_OK


# ---------------------------------------------------------------------- mongo


def cmd_setup(args: argparse.Namespace, ctx: Context) -> int:
    """Load distcrawl's Redis function library (Redis 7+), so that workers and producers
    send FCALL and their users need no EVALSHA, SCRIPT or EVAL (distcrawl/model/lua)."""
    import redis

    from distcrawl.model import lua

    try:
        version = lua.load_library(ctx.client)
    except redis.ResponseError as exc:
        if "unknown command" not in str(exc).lower():
            raise
        print(
            "error: this Redis has no functions (Redis 7 or later): workers send EVALSHA "
            "(their users need EVALSHA and SCRIPT LOAD: distcrawl acl --scripts eval)",
            file=sys.stderr,
        )
        return EXIT_PARTIAL
    if ctx.as_json:
        _emit_json({"library": lua.LIBRARY, "version": version})
    else:
        print(f"loaded the function library {lua.LIBRARY!r} version {version}")
    return EXIT_OK


def cmd_mongo_replay(args: argparse.Namespace, ctx: Context) -> int:
    """Write spill files (items a worker could not store at close) into MongoDB."""
    from pymongo.errors import ConfigurationError, ConnectionFailure, InvalidURI, PyMongoError

    from distcrawl.mongo import auth_refusal as mongo_auth_refusal
    from distcrawl.mongo import replay

    uri = args.mongo_uri
    if not uri:
        raise UsageError("no MongoDB: pass --mongo-uri URI or set MONGO_URI")
    shown = redact_url(uri)

    def scrub(text: str, uri: str) -> str:
        return redact_text(text, url_secrets(uri))

    existing_files(args.files)
    try:
        result = replay(args.files, uri, database=args.database)
    except InvalidURI as exc:
        raise UsageError(f"invalid --mongo-uri {shown}: {scrub(str(exc), uri)}") from None
    except ValueError as exc:  # a line that is not a spill record
        raise UsageError(str(exc)) from None
    except (ConnectionFailure, ConfigurationError) as exc:
        reason = scrub(str(exc), uri) or type(exc).__name__
        print(f"error: cannot reach MongoDB at {shown}: {reason}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except PyMongoError as exc:
        what = mongo_auth_refusal(exc) or "MongoDB"
        print(f"error: {what} at {shown}: {scrub(str(exc), uri)}", file=sys.stderr)
        return EXIT_PARTIAL
    dead, spilled, skipped = (result.count(o) for o in ("dead", "spilled", "skipped"))
    if ctx.as_json:
        _emit_json(
            {
                "documents": result.documents,
                "upserted": result.count("upserted"),
                "updated": result.count("updated"),
                "dead": dead,
                "rejected": spilled,
                "already_recorded": skipped,
            }
        )
    else:
        print(
            f"replayed {result.documents} documents from {len(result.files)} file(s) into "
            f"{shown}: {result.count('upserted')} new, {result.count('updated')} updated, "
            f"{dead} dead-lettered" + (f", {skipped} fetches already recorded" if skipped else "")
        )
        if spilled:
            print(
                f"{spilled} documents could not even be dead-lettered: see "
                f"{args.files[0]}.rejected.jsonl",
                file=sys.stderr,
            )
    return EXIT_PARTIAL if dead or spilled else EXIT_OK


def cmd_notify_replay(args: argparse.Namespace, ctx: Context) -> int:
    """Send the item notifications a worker spilled at close (its broker was down)."""
    from distcrawl import notify

    broker = (
        args.broker
        or _project_settings([]).get("DISTCRAWL_CELERY_BROKER_URL")
        or os.environ.get("CELERY_BROKER_URL")
    )
    if not broker:
        raise UsageError(
            "no broker: pass --broker URL, or set DISTCRAWL_CELERY_BROKER_URL in the project's "
            "settings or CELERY_BROKER_URL"
        )
    broker = str(broker)
    shown = redact_url(broker)
    existing_files(args.files)
    try:
        result = notify.replay(args.files, broker)
    except ConfigError as exc:  # Celery is not installed
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # a line that is not a notification record
        raise UsageError(str(exc)) from None
    except Exception as exc:  # kombu raises the transport's own errors
        reason = redact_text(str(exc), url_secrets(broker)) or type(exc).__name__
        print(f"error: cannot send to the Celery broker at {shown}: {reason}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if ctx.as_json:
        _emit_json({"sent": result.sent, "files": result.files})
    else:
        print(
            f"sent {result.sent} item notifications from {len(result.files)} file(s) via "
            f"{shown}; each file renamed to FILE{notify.SENT_SUFFIX}"
        )
    return EXIT_OK


# ---------------------------------------------------------------------- scrapyd


def cmd_scrapyd(args: argparse.Namespace, ctx: Context) -> int:
    """``distcrawl scrapyd ACTION``: the actions are in :mod:`distcrawl.scrapyd`."""
    from distcrawl.scrapyd import ConfigProblem

    try:
        return int(args.scrapyd_action(args, as_json=ctx.as_json))
    except ConfigProblem as exc:
        raise UsageError(str(exc)) from None


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    command = command_maker(common)
    acl_help = (
        "print ACL SETUSER commands of two least-privilege Redis users: a producer that can "
        "only add start URLs (and read what push and status need), a worker with exactly the "
        "commands distcrawl sends, on this crawl's keys"
    )
    acl = command(commands, "acl", cmd_acl, acl_help)
    acl.add_argument(
        "--namespace", type=_spider, metavar="NS", help="DISTCRAWL_NAMESPACE, if not SPIDER"
    )
    acl.add_argument("--producer-user", metavar="NAME", help="default: <namespace>-producer")
    acl.add_argument("--worker-user", metavar="NAME", help="default: <namespace>-worker")
    for role in ("producer", "worker"):
        acl.add_argument(
            f"--{role}-password-env",
            metavar="VAR",
            help=f"the {role} password is in this environment variable: printed as its "
            "SHA-256 (#<hex>), never in clear; default: a >placeholder to replace",
        )
    acl.add_argument(
        "--format",
        choices=("commands", "aclfile"),
        default="commands",
        help="ACL SETUSER commands (for redis-cli) or lines of an ACL file (aclfile)",
    )
    acl.add_argument(
        "--scripts",
        choices=("functions", "eval"),
        default="functions",
        help="how the workers run distcrawl's Lua: FCALL of the library `distcrawl setup` "
        "loads (functions, the default), or EVALSHA and SCRIPT LOAD when it is not loaded",
    )
    setup_help = (
        "load distcrawl's Redis function library (Redis 7+; again after each upgrade of "
        "distcrawl, once its old workers stopped): workers then send FCALL, and the users of "
        "distcrawl acl need no EVALSHA, SCRIPT LOAD or EVAL"
    )
    setup = subcommand(commands, "setup", setup_help, [common])
    setup.set_defaults(handler=cmd_setup)
    mongo_commands = command_group(
        commands, common, "mongo", "items stored in MongoDB", "MongoDB items"
    )
    replay_help = (
        "write spill files (items a worker could not store in MongoDB at close) into MongoDB; "
        "documents are upserted by _id, so replaying twice changes nothing"
    )
    replay = subcommand(mongo_commands, "replay", replay_help, [common])
    files_argument(replay, "spill file (.jsonl)")
    env_option(replay, "--mongo-uri", "MONGO_URI", metavar="URI", help="MongoDB to write to")
    replay.add_argument(
        "--database", metavar="NAME", help="write here instead of the database in each record"
    )
    replay.set_defaults(handler=cmd_mongo_replay)
    notify_commands = command_group(
        commands,
        common,
        "notify",
        "item notifications to Celery",
        "item notifications (DISTCRAWL_CELERY_ITEM_TASK)",
    )
    notify_help = (
        "send the item notifications that workers spilled at close (their broker was down), "
        "then rename each file to FILE.sent so that they are not sent twice"
    )
    notify_replay = subcommand(notify_commands, "replay", notify_help, [common])
    files_argument(notify_replay, "notification spill file (*-notify-*.jsonl)")
    notify_replay.add_argument(
        "--broker",
        metavar="URL",
        # never %(default)s: the broker's URL may hold a password
        help="Celery's broker (default: DISTCRAWL_CELERY_BROKER_URL of the project's settings, "
        "else $CELERY_BROKER_URL)",
    )
    notify_replay.set_defaults(handler=cmd_notify_replay)
