"""The frontier's Lua scripts, read from the ``.lua`` files beside this module.

Each file starts with a header naming its KEYS and ARGV. ``lib.lua`` (the layout of a
queue entry and the politeness helpers) is prepended to every script. Scripts are
registered once per client; redis-py sends EVALSHA and falls back to EVAL after a server
restart or flush.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

import redis
from redis.commands.core import Script

NAMES = ("commit", "lease", "redrive", "renew", "requeue", "robots")


def _read(name: str) -> str:
    return files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


def source(name: str) -> str:
    return _read("lib") + "\n" + _read(name)


@dataclass(frozen=True)
class Scripts:
    commit: Script
    lease: Script
    redrive: Script
    renew: Script
    requeue: Script
    robots: Script

    @classmethod
    def register(cls, client: redis.Redis) -> Scripts:
        return cls(**{name: client.register_script(source(name)) for name in NAMES})
