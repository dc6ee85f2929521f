"""How a job's settings and spider arguments may be shown: what names or holds a secret is
hidden, in ``distcrawl scrapyd status``, in ``listjobs.json`` and in the command lines Scrapyd
logs."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from distcrawl.model.redact import MASK, is_secret_name, redact_text


def redact_setting(name: str, value: Any) -> str:
    """How a setting (or spider argument) may be shown: secret names hide the whole value."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and is_secret_name(name):
        return MASK
    return redact_text(text)


def is_secret(name: str, value: Any) -> bool:
    return redact_setting(name, value) != (value if isinstance(value, str) else str(value))


def redact_settings(values: Mapping[str, Any]) -> dict[str, str]:
    return {name: redact_setting(name, value) for name, value in values.items()}


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A crawl command line as Scrapyd logs it, with ``-s``/``-a`` values redacted."""
    out: list[str] = []
    previous = ""
    for arg in argv:
        if previous in ("-s", "-a") and "=" in arg:
            name, _, value = arg.partition("=")
            arg = f"{name}={redact_setting(name, value)}"
        else:
            arg = redact_text(arg)
        out.append(arg)
        previous = arg
    return out
