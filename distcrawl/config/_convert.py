"""Turning raw setting values into typed ones, naming the setting in the error.

Shared by every module that parses settings (config.py, recrawl.py, mongo/_config.py), so
that a bad value reads the same whichever component parses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from scrapy.settings import BaseSettings

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting has a value distcrawl cannot use; the message names the setting."""


def _get(settings: BaseSettings, name: str, default: T, convert: Callable[[Any], T]) -> T:
    raw = settings.get(name, default)
    if raw is None:
        return default
    try:
        return convert(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}={raw!r}: {exc}") from None


def _optional_float(settings: BaseSettings, name: str) -> float | None:
    """A number where ``None`` (unset) means "never"; 0 is a real value, not "unset"."""
    raw = settings.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={raw!r}: expected a number of seconds or None") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r}: must be >= 0")
    return value


def _optional_names(settings: BaseSettings, name: str) -> tuple[str, ...] | None:
    """A list of names where None (unset) means "no list"; an empty list is a real value."""
    if settings.get(name) is None:
        return None
    names = settings.getlist(name)
    if not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{name}={settings.get(name)!r}: expected a list of names")
    # "-s NAME=a, b" arrives as "a" and " b": spaces are never part of a name
    names = [n.strip() for n in names if n.strip()]
    if any(not n.replace("_", "").replace(".", "").isalnum() for n in names):
        raise ConfigError(f"{name}={settings.get(name)!r}: expected names such as parse, proxy")
    return tuple(names)


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int | float):
        return bool(raw)
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected a boolean")


def cluster_mode(raw: Any) -> bool | None:
    """``DISTCRAWL_REDIS_CLUSTER`` (or the CLI's ``--cluster``): True or False, or None for
    "auto" (ask the server whether it is a cluster node, at connect time)."""
    if raw is None or (isinstance(raw, str) and raw.strip().lower() == "auto"):
        return None
    try:
        return _bool(raw)
    except ValueError:
        raise ValueError("expected auto, true or false") from None


def _positive(kind: Callable[[Any], T]) -> Callable[[Any], T]:
    def convert(raw: Any) -> T:
        value = kind(raw)
        if value <= 0:  # type: ignore[operator]
            raise ValueError("must be > 0")
        return value

    return convert


def _at_least(low: float, kind: Callable[[Any], T]) -> Callable[[Any], T]:
    def convert(raw: Any) -> T:
        value = kind(raw)
        if value < low:  # type: ignore[operator]
            raise ValueError(f"must be >= {low}")
        return value

    return convert


#: a number of seconds where 0 is a value of its own (no delay, no backoff)
_seconds = _at_least(0.0, float)


def _probability(raw: Any) -> float:
    value = float(raw)
    if not 0.0 < value < 1.0:
        raise ValueError("must be between 0 and 1, both excluded")
    return value


def _integer(raw: Any) -> int:
    """An int, also from a float-like value such as ``1e8`` (a float only if whole)."""
    if isinstance(raw, str):
        raw = raw.strip().replace("_", "")
        try:
            return int(raw)
        except ValueError:
            raw = float(raw)
    if isinstance(raw, float) and not raw.is_integer():
        raise ValueError("expected a whole number")
    return int(raw)


def _fraction(raw: Any) -> float:
    value = float(raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be between 0 and 1")
    return value
