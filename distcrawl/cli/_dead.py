"""``distcrawl dead``: list, count, purge and re-drive the crawl's dead letters."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import Any

from distcrawl._commandline import EXIT_OK, EXIT_PARTIAL, _emit_json, command_group, count_option
from distcrawl.cli._common import (
    Context,
    UsageError,
    _one_line,
    _project_settings,
    command_maker,
    delete_confirmed,
)
from distcrawl.producer import ProducerError

# ---------------------------------------------------------------------- dead letters


def _iso(timestamp: Any) -> str:
    try:
        moment = datetime.fromtimestamp(float(timestamp), tz=timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"
    return moment.isoformat(timespec="seconds")


def _dead_line(record: dict[str, Any]) -> str:
    subject = record.get("url") or record.get("raw") or "-"
    fields = (
        _iso(record.get("time")),
        _one_line(str(record.get("source") or "-")),
        _one_line(str(record.get("reason") or "-")),
        _one_line(str(subject)),
    )
    return "  ".join(fields)


def cmd_dead_list(args: argparse.Namespace, ctx: Context) -> int:
    producer = ctx.producer(args.spider, target="start_urls")
    records = producer.dead_letters(args.limit)
    if ctx.as_json:
        _emit_json(records)
        return EXIT_OK
    for record in records:
        print(_dead_line(record))
    total = producer.dead_count()
    if total > len(records):
        print(f"(newest {len(records)} of {total}; see --limit)", file=sys.stderr)
    return EXIT_OK


def cmd_dead_count(args: argparse.Namespace, ctx: Context) -> int:
    count = ctx.producer(args.spider, target="start_urls").dead_count()
    if ctx.as_json:
        _emit_json({"dead": count})
    else:
        print(count)
    return EXIT_OK


def cmd_dead_purge(args: argparse.Namespace, ctx: Context) -> int:
    keys = ctx.keys(args.spider)

    def delete() -> int:
        # Count and delete atomically, so records added meanwhile are counted too.
        pipe = ctx.client.pipeline(transaction=True)
        pipe.llen(keys.dead)
        pipe.unlink(keys.dead)
        return int(pipe.execute()[0])

    found = int(ctx.client.llen(keys.dead))
    return delete_confirmed(args, ctx, keys, "dead-letter records", found, delete)


def cmd_dead_redrive(args: argparse.Namespace, ctx: Context) -> int:
    # the project's spider makes the request of a record that holds only its URL
    producer = ctx.producer(args.spider, _project_settings([]), target="start_urls")
    try:
        result = producer.redrive(
            error=args.error, domain=args.domain, source=args.source, serializer=args.serializer
        )
    except ProducerError as exc:  # a sharded frontier, the spider not in SPIDER_MODULES
        raise UsageError(str(exc)) from None
    moved, unusable = result.redriven, result.not_redrivable
    if ctx.as_json:
        _emit_json({"redriven": moved, "not_redrivable": unusable})
    else:
        print(f"re-drove {moved} dead letters of {args.spider.namespace!r}")
        if unusable:
            print(f"{unusable} matching records hold no request to re-drive", file=sys.stderr)
    return EXIT_PARTIAL if unusable else EXIT_OK


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    command = command_maker(common)
    records = "dead-letter records"
    dead_commands = command_group(commands, common, "dead", records, records)
    dead_list = command(dead_commands, "list", cmd_dead_list, "show records, newest first")
    count_option(dead_list, "--limit", 20, "at most N records, 0 for all")
    command(dead_commands, "count", cmd_dead_count, "print the number of records")
    purge = command(dead_commands, "purge", cmd_dead_purge, "delete every record")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    redrive = command(
        dead_commands,
        "redrive",
        cmd_dead_redrive,
        "put matching records back to work (requests into the queue with a fresh attempt "
        "count, bad start_urls entries back into start_urls)",
    )
    redrive.add_argument("--error", metavar="TEXT", help="only records whose reason contains TEXT")
    redrive.add_argument("--domain", metavar="HOST", help="only URLs on HOST or its subdomains")
    redrive.add_argument(
        "--source",
        # every source a dead letter is written with (grep source= and lua/lib.lua)
        choices=(
            "retry",
            "callback",
            "download",
            "enqueue",
            "start_urls",
            "queue",
            "commit",
            "doctor",
        ),
        help="only records of this source",
    )
    redrive.add_argument(
        "--serializer",
        choices=("msgpack", "json"),
        default="msgpack",
        help="DISTCRAWL_SERIALIZER of the workers (default msgpack)",
    )
