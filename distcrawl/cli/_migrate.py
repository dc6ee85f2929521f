"""``distcrawl migrate SPIDER --to URL`` and ``distcrawl migrate SPIDER --shards N``: their
arguments, and the command that runs a :class:`~distcrawl.admin.migrate.Migration` (to another
Redis) or a :class:`~distcrawl.admin.reshard.Resharding` (on the same one) and prints what it did.

Kept apart from :mod:`distcrawl.admin.migrate` so that the move stays a plain API, whose steps
Python code and the tests run one by one, while what only the command cares about (the
target URL's secrets, exit codes, naming the side a Redis error came from) sits with the
other commands'."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import redis

from distcrawl._commandline import EXIT_OK, EXIT_PARTIAL, _emit_json
from distcrawl.admin.migrate import KeyInfo, Migration, MigrationRefused, RunOutcome
from distcrawl.admin.reshard import Resharding, ReshardRefused
from distcrawl.cli._common import Context, UsageError, _cluster_option, command_maker, redis_failure
from distcrawl.model.connection import make_redis
from distcrawl.model.redact import redact_text, redact_url, url_secrets


def _print_plan(infos: Sequence[KeyInfo], as_json: bool) -> None:
    if as_json:
        print(json.dumps([asdict(i) for i in infos], indent=2))
        return
    for i in infos:
        ttl = f" ttl {i.ttl_ms / 1000:.0f}s" if i.ttl_ms >= 0 else ""
        print(f"{i.source} -> {i.target}: {i.type} of {i.size}, {i.bytes or 0} bytes{ttl}")
    total = sum(i.bytes or 0 for i in infos)
    print(f"{len(infos)} keys, {total} bytes (MEMORY USAGE); nothing written (--dry-run)")


def _print_outcome(ctx: Context, outcome: RunOutcome, already_done: str, summary: str) -> None:
    """What a run did: the outcome as JSON, or the line that says it."""
    if ctx.as_json:
        _emit_json(outcome.as_dict())
    else:
        print(already_done if outcome.already_done else summary)


def _differs(mismatches: list[str], kept: str) -> bool:
    """Whether some count differs after the copy (each one said, and what was kept)."""
    for line in mismatches:
        print(f"differs: {line}", file=sys.stderr)
    if mismatches:
        print(f"not verified: {kept}; run it again", file=sys.stderr)
    return bool(mismatches)


def cmd_reshard(args: argparse.Namespace, ctx: Context) -> int:
    """Exit 0 when the crawl has ``--shards`` shards (moved and verified now, or before), 1
    when refused (nothing written) or a count differs after the copy (nothing switched)."""
    if args.to is not None or args.delete_source:
        raise UsageError(
            "--shards re-shards on this Redis: move the crawl with --to first, then run "
            "--shards with --redis-url of the target"
        )
    ns = args.spider.namespace
    try:
        job = Resharding(
            ctx.client,
            ns,
            args.shards,
            worker_timeout=args.worker_timeout,
            trust_pickle=args.trust_pickle,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    problems = job.problems(force=args.force)
    if args.dry_run and not problems:
        source = job.recorded_shards()
        sizes = [int(ctx.client.zcard(k.queue)) for k in job.old_keys(source)]
        print(
            f"{ns!r}: {source} -> {args.shards} shards, {sum(sizes)} queued requests; "
            "nothing written (--dry-run)"
        )
    for problem in problems:
        print(f"distcrawl migrate: refused: {problem}", file=sys.stderr)
    if problems or args.dry_run:
        return EXIT_PARTIAL if problems else EXIT_OK
    try:
        outcome = job.run()
    except ReshardRefused as exc:
        print(f"distcrawl migrate: refused: {exc}", file=sys.stderr)
        return EXIT_PARTIAL
    _print_outcome(
        ctx,
        outcome,
        f"{ns!r} already has {args.shards} shard(s)",
        f"{ns!r}: {outcome.from_shards} -> {outcome.to_shards} shards: {outcome.queued} "
        f"queued and {outcome.retries} retries moved, {outcome.dead_lettered} to the dead "
        f"letters, {outcome.seen} fingerprints copied, {outcome.deleted} old keys removed, "
        f"in {outcome.seconds:.1f}s",
    )
    if _differs(outcome.mismatches, "the crawl keeps its old layout"):
        return EXIT_PARTIAL
    if not ctx.as_json and not outcome.already_done:
        print(f"start the workers with DISTCRAWL_SHARDS={args.shards}, then: distcrawl resume {ns}")
    return EXIT_OK


def cmd_migrate(args: argparse.Namespace, ctx: Context) -> int:
    """Exit 0 when every key is on the target and verified (and, with --delete-source, gone
    from the source), 1 when refused (nothing written) or a key differs after the copy."""
    if args.shards is not None:
        return cmd_reshard(args, ctx)
    if args.to is None:
        raise UsageError("say where to: --to URL (another Redis) or --shards N (re-shard here)")
    unfinished = Resharding(ctx.client, args.spider.namespace, 1).record()
    if unfinished:
        print(
            "distcrawl migrate: refused: an interrupted re-sharding: finish it first "
            f"(--shards {unfinished.get('reshard:to')})",
            file=sys.stderr,
        )
        return EXIT_PARTIAL
    target_url: str = args.to
    shown_target = redact_url(target_url)

    def scrub(text: str) -> str:
        return ctx.scrub(redact_text(text, url_secrets(target_url)))

    try:
        to_cluster = _cluster_option(args.to_cluster)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(str(exc)) from None
    ctx.client.ping()  # the source first: cli.main reports its errors, naming it
    where = f"the target {shown_target}"

    def failed(exc: redis.RedisError) -> int:
        """As the other commands report a Redis error (cli.main), naming the side."""
        return redis_failure(exc, where, scrub)

    try:
        target = make_redis(target_url, cluster=to_cluster)
    except (ValueError, redis.exceptions.RedisClusterException) as exc:
        raise UsageError(f"invalid --to {shown_target}: {scrub(str(exc))}") from None
    except redis.RedisError as exc:  # a cluster's slot map is loaded here
        return failed(exc)
    try:
        migration = Migration.between(
            ctx.client,
            target,
            args.spider.namespace,
            shown=(ctx.shown_url, shown_target),
            worker_timeout=args.worker_timeout,
        )
        migration.target.client.ping()  # a wrong --to is named as such, before any work
        where = f"the source {ctx.shown_url} or the target {shown_target}"
        problems = [] if args.force else migration.problems()
        if args.dry_run:  # the keys, and what a run would refuse
            migration.run(dry_run=True)
            _print_plan(migration.listed, ctx.as_json)
        for problem in problems:
            print(f"distcrawl migrate: refused: {problem}", file=sys.stderr)
        if problems or args.dry_run:
            return EXIT_PARTIAL if problems else EXIT_OK
        outcome = migration.run(delete_source=args.delete_source)
    except MigrationRefused as exc:
        print(f"distcrawl migrate: refused: {exc}", file=sys.stderr)
        return EXIT_PARTIAL
    except redis.RedisError as exc:
        return failed(exc)
    finally:
        target.close()
    ns = args.spider.namespace
    _print_outcome(
        ctx,
        outcome,
        f"{ns!r} was already migrated to {shown_target} and verified",
        f"{ns!r}: {outcome.keys} keys from {ctx.shown_url} to {shown_target}: "
        f"{outcome.copied} copied, {outcome.unchanged} already there, "
        f"{outcome.expired} expired meanwhile, in {outcome.seconds:.1f}s",
    )
    if not ctx.as_json:
        verified = not _differs(outcome.mismatches, "the source is kept")
        if verified and outcome.deleted:
            print(f"removed {outcome.deleted} keys from the source")
        elif verified and not args.delete_source:
            print(
                f"verified; point the workers at the target, then: distcrawl --redis-url "
                f"<target> resume {ns}"
            )
    return EXIT_PARTIAL if outcome.mismatches else EXIT_OK


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """``distcrawl migrate SPIDER --to URL``, registered by ``build_parser``."""
    text = (
        "copy a paused crawl (every worker stopped) to another Redis, e.g. one node to a "
        "Redis Cluster, under the names keys take there; verify; optionally delete the "
        "source. Or, with --shards N, re-split its frontier into N shards on this Redis"
    )
    sub = command_maker(common)(commands, "migrate", cmd_migrate, text)
    # never %(default)s or an echo of the value: it may hold a password
    sub.add_argument("--to", metavar="URL", help="the Redis to move the crawl to")
    sub.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="re-split the frontier into N shards (DISTCRAWL_SHARDS) on this Redis instead",
    )
    sub.add_argument(
        "--trust-pickle",
        action="store_true",
        help="with --shards: unpickle pickled requests to read their URLs (runs code "
        "anyone who could write to Redis wrote); without it they are refused",
    )
    sub.add_argument(
        "--to-cluster",
        default="auto",
        metavar="auto|yes|no",
        help="whether --to is a Redis Cluster node (default auto: ask it)",
    )
    sub.add_argument("--dry-run", action="store_true", help="list the keys and sizes only")
    sub.add_argument(
        "--delete-source",
        action="store_true",
        help="remove the crawl's keys from the source once every key is verified",
    )
    sub.add_argument(
        "--worker-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a worker that beat more recently is live and refuses the move "
        "(DISTCRAWL_WORKER_TIMEOUT, default 10)",
    )
    sub.add_argument(
        "--force",
        action="store_true",
        help="UNSAFE: skip the checks that the crawl is paused and no worker is live",
    )
