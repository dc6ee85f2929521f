"""The command-line pieces ``distcrawl`` and ``distcrawl scrapyd`` share: exit statuses and
argparse builders. Standard library only, so that the Scrapyd client's commands need neither
Redis nor Scrapy, and neither command package imports the other's."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_FULL = 4


def _non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return number


def _positive_int(value: str) -> int:
    number = _non_negative_int(value)
    if number == 0:
        raise argparse.ArgumentTypeError("must be >= 1")
    return number


def _emit_json(data: Any) -> None:
    """One JSON document on stdout; what JSON has no type for is written as its text."""
    print(json.dumps(data, ensure_ascii=False, default=str))


def env_option(
    parser: argparse.ArgumentParser, option: str, env: str, *, metavar: str, help: str
) -> None:
    """An option whose default is ``$env``: its help names the variable, never the value
    (``%(default)s`` would print a password)."""
    parser.add_argument(
        option, default=os.environ.get(env), metavar=metavar, help=f"{help} (default: ${env})"
    )


def subcommand(
    group: Any, name: str, help_text: str, parents: Sequence[argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    """A subcommand of ``group`` whose one-line help is also its description."""
    sub: argparse.ArgumentParser = group.add_parser(
        name, parents=list(parents), help=help_text, description=help_text
    )
    return sub


def command_group(
    commands: Any,
    common: argparse.ArgumentParser,
    name: str,
    help_text: str,
    description: str,
    *,
    dest: str | None = None,
    metavar: str = "ACTION",
) -> Any:
    """A command that only picks one of its own subcommands (``distcrawl dead list``): the
    subparsers to add them to, one of which must be given."""
    group = commands.add_parser(name, parents=[common], help=help_text, description=description)
    return group.add_subparsers(dest=dest or f"{name}_command", required=True, metavar=metavar)


def count_option(
    parser: argparse.ArgumentParser,
    option: str,
    default: int,
    help_text: str | None = None,
    *,
    at_least_one: bool = False,
) -> None:
    """An option that takes a count N (0 allowed unless ``at_least_one``), refused when
    negative as the command line is read rather than by the command."""
    kind = _positive_int if at_least_one else _non_negative_int
    parser.add_argument(option, type=kind, default=default, metavar="N", help=help_text)
