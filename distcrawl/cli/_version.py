"""``distcrawl --version``: the versions a bug report needs, in one line.

A crawl's behaviour depends on Scrapy's engine and redis-py's client as much as on distcrawl,
so the line names all three and Python. Every number comes from the installed distributions'
metadata: distcrawl's is written once, in pyproject.toml, and nothing here can drift from it.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def _installed(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:  # e.g. distcrawl run from a source tree it is not installed from
        return "not installed"


def version_line() -> str:
    return (
        f"distcrawl {_installed('distcrawl')} (Scrapy {_installed('Scrapy')}, "
        f"redis-py {_installed('redis')}, Python {platform.python_version()})"
    )


class VersionAction(argparse.Action):
    """``--version``, with the metadata read only when asked for: every other run of the
    command builds the same parser."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the versions of distcrawl, Scrapy, redis-py, Python")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(version_line())
        parser.exit()
