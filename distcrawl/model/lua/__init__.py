"""The frontier's Lua scripts, read from the ``.lua`` files beside this module.

Each file starts with a header naming its KEYS and ARGV. ``lib.lua`` (the layout of a
queue entry and the politeness helpers) is prepended to every script. Scripts are
registered once per client; redis-py sends EVALSHA and falls back to EVAL after a server
restart or flush. The batch runner (batch.py) pipelines EVALSHA itself and, on NOSCRIPT,
loads them all (``Scripts.load``) and sends again the steps that were refused.

On Redis 7 and later the same scripts can be one library of Redis functions instead
(:func:`library_source`, loaded by the operator with ``distcrawl setup``): then workers and
producers send FCALL and need no right to EVALSHA, SCRIPT LOAD or EVAL, so that a stolen
worker credential cannot run a script of its own (``distcrawl acl`` grants FCALL only). Which
way a client goes is settled on its first script (:class:`ScriptMode`): FCALL when Redis holds
the library of exactly this version (``distcrawl_version``), EVALSHA when it holds none or
has no functions (Redis 6.2); another version is refused (:class:`LibraryMismatch`), since its
functions would lay the frontier out as another distcrawl does.

The seen-set is pluggable: ``seen_set.lua`` and ``seen_bloom.lua`` each define
``seen_add(fp)`` and ``seen_has(fp)``, and the scripts that deduplicate (``commit.lua``,
``seen.lua``) are built by prepending one of them, so that the check stays atomic with the
push whichever seen-set is used, and each script keeps a single copy of the logic.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.resources import files
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script

NAMES = (
    "commit",
    "lease",
    "redrive",
    "renew",
    "requeue",
    "robots",
    "robots_store",
    "seen",
    "bloom_grow",
    "sent",
    "places",
    "claim",
    "unclaim",
    "claimed",
    "sweep",
    "alive",
    "runnable",
    "finish",
)
SEEN_MODES = ("set", "bloom")

#: Each script's KEYS in order, named by the :class:`~distcrawl.model.keys.FrontierKeys` member
#: that builds the key (a method takes the worker tag or netloc the call is for). The ``.lua``
#: headers name the same members in the same order (tests/test_lua.py reads them), so a key
#: added to a script is added here once and every caller passes it
#: (``FrontierKeys.script_keys``). Keys a script takes beyond these (the Bloom filter's
#: parts, the claim lists of several workers) are appended by their caller, as the headers'
#: ``KEYS[n ..]`` lines say. ``ids`` (doctor_unrecorded.lua) is whichever ZSET the doctor
#: checks, passed by the doctor itself.
KEYS: dict[str, tuple[str, ...]] = {
    "alive": ("alive",),
    "bloom_grow": ("bloom",),
    "claim": ("start_urls", "claims", "claimants", "wake_of"),
    "claimed": ("claims", "claimants"),
    "commit": (
        *("queue", "requests", "seen", "seq", "leases", "claims", "dead", "delayed", "ready"),
        *("slots", "inflight", "throttle", "robots", "throttle_raised", "commits"),
        *("throttle_state", "placeless", "claimants", "wake", "revisits", "revisit_of"),
        "legacy_seen",
    ),
    "doctor_inflight": ("leases", "requests", "inflight", "placeless"),
    "doctor_quarantine": ("members", "dead", "stats"),
    "doctor_ready": ("queue", "ready", "slots", "revisit_queue"),
    "doctor_records": (
        *("requests", "leases", "delayed", "queue", "ready", "slots", "dead", "stats"),
        "revisits",
    ),
    "doctor_unrecorded": ("ids", "requests"),
    "lease": (
        *("queue", "requests", "leases", "delayed", "ready", "slots", "inflight", "throttle"),
        *("limits", "robots", "hungry", "seq", "dead", "stats", "throttle_state", "alive"),
        *("placeless", "revisits", "revisit_queue"),
    ),
    "finish": (
        *("queue", "revisit_queue", "leases", "delayed", "revisits", "start_urls", "seq"),
        *("dead", "paused", "stats", "lifecycle", "events", "runnable"),
    ),
    "places": ("requests", "inflight", "robots", "ready", "slots", "placeless"),
    "redrive": ("dead", "queue", "seq", "start_urls", "ready", "slots", "wake"),
    "renew": ("leases", "requests"),
    "requeue": (
        *("leases", "queue", "requests", "ready", "slots", "inflight", "robots", "alive"),
        *("commits", "placeless", "claimants", "wake"),
    ),
    "robots": ("robots", "slots", "ready", "limits", "throttle"),
    "runnable": (
        *("ready", "queue", "revisit_queue", "inflight", "limits", "throttle_state", "paused"),
        *("start_urls", "runnable"),
    ),
    "robots_store": ("robots_txt", "robots_lock"),
    "seen": (),
    "sent": ("slots", "ready"),
    "sweep": (
        *("slots", "throttle_state", "robots", "ready", "inflight", "throttle"),
        *("throttle_raised", "hungry", "sweep"),
    ),
    "unclaim": ("start_urls", "claimants", "alive"),
}
#: names in KEYS that are not FrontierKeys members: the caller passes the key itself
PASSED_BY_CALLER = frozenset({"ids", "members"})

#: how many KEYS commit.lua takes itself; the Bloom filter's keys follow them
COMMIT_KEYS = len(KEYS["commit"])
#: where each script's seen-set keys start in its KEYS, per seen-set: the SET is commit.lua's
#: KEYS[3], the Bloom filter's keys are appended at the end
SEEN_KEYS = {
    ("commit", "set"): 3,
    ("commit", "bloom"): COMMIT_KEYS + 1,
    ("seen", "set"): 1,
    ("seen", "bloom"): 1,
}


def source(name: str) -> str:
    return files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


#: a top-level definition of lib.lua: ``local function name(`` or ``local NAME =``
_LIB_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)


@lru_cache(maxsize=1)
def lib_definitions() -> tuple[tuple[str, str], ...]:
    """lib.lua cut into its top-level definitions, (name, text with the comment above it),
    in order."""
    text = source("lib")
    starts = [m.start() for m in _LIB_DEFINITION.finditer(text)]
    out = []
    for at, end in zip(starts, [*starts[1:], len(text)], strict=True):
        # without the comment lines above the next definition (comments run no code)
        lines = text[at:end].split("\n")
        while len(lines) > 1 and (lines[-1].startswith("--") or not lines[-1].strip()):
            lines.pop()
        name = _LIB_DEFINITION.match(text, at)
        assert name is not None
        out.append((name.group(1), "\n".join(lines)))
    return tuple(out)


def lib_for(code: str) -> str:
    """The definitions of lib.lua that ``code`` uses, directly or through one another, in
    lib.lua's order. A script runs its whole text on every call, lib.lua's included: each
    function defined is a closure made anew, so a script carries only what it calls."""
    defs = lib_definitions()
    used: set[str] = set()
    pending = [code]
    while pending:
        text = pending.pop()
        for name, body in defs:
            if name not in used and re.search(rf"\b{name}\b", text):
                used.add(name)
                pending.append(body)
    return "\n".join(body for name, body in defs if name in used)


def script_source(name: str, seen: str = "set") -> str:
    """The source of script ``name``: what it uses of lib.lua, the seen-set snippet if it
    uses one (it calls lib.lua's helpers too), then the script itself."""
    if seen not in SEEN_MODES:
        raise ValueError(f"unknown seen-set {seen!r}: expected one of {', '.join(SEEN_MODES)}")
    parts = [source(name)]
    at = SEEN_KEYS.get((name, seen))
    if at is not None:
        parts[:0] = [f"local SEEN_KEYS = {at}", source(f"seen_{seen}")]
    return "\n".join([lib_for("\n".join(parts)), *parts])


#: the doctor's scripts (doctor.py), in the library too: the operator runs the doctor as the
#: worker user, which may call functions only
DOCTOR_NAMES = (
    "doctor_quarantine",
    "doctor_ready",
    "doctor_unrecorded",
    "doctor_records",
    "doctor_inflight",
)
LIBRARY = "distcrawl"
VERSION_FUNCTION = "distcrawl_version"


def function_name(name: str, seen: str = "set") -> str:
    """The Redis function of script ``name`` (``distcrawl_<name>``; a script that has the
    seen-set snippet has one per seen-set, ``distcrawl_commit_bloom``)."""
    suffix = f"_{seen}" if (name, seen) in SEEN_KEYS else ""
    return f"distcrawl_{name}{suffix}"


def _library_body() -> str:
    out = []
    for name in (*NAMES, *DOCTOR_NAMES):
        for seen in SEEN_MODES if (name, "set") in SEEN_KEYS else ("set",):
            out.append(
                f"redis.register_function('{function_name(name, seen)}', "
                f"function(KEYS, ARGV)\n{script_source(name, seen)}\nend)\n"
            )
    return "".join(out)


@lru_cache(maxsize=1)
def library_version() -> str:
    """A digest of every function's code: any change to a script is a new version."""
    return hashlib.sha1(_library_body().encode("utf-8")).hexdigest()[:16]


@lru_cache(maxsize=1)
def library_source() -> str:
    """The Redis function library of every script (``FUNCTION LOAD REPLACE``), each
    function the script's own source as its body: KEYS and ARGV are its arguments."""
    version = library_version()
    return (
        f"#!lua name={LIBRARY}\n"
        "-- distcrawl's frontier scripts (distcrawl/model/lua/*.lua), loaded by `distcrawl setup`\n"
        "redis.register_function{function_name='" + VERSION_FUNCTION + "', "
        f"callback=function() return '{version}' end, flags={{'no-writes'}}}}\n" + _library_body()
    )


def load_library(client: Any) -> str:
    """Load (or replace) the library on the server, on every master of a cluster; returns
    its version. Needs FUNCTION LOAD: an administrator's step (``distcrawl setup``)."""
    client.function_load(library_source(), replace=True)
    return library_version()


class LibraryMismatch(RuntimeError):
    """Redis holds distcrawl's function library of another version."""

    def __init__(self, loaded: str) -> None:
        self.loaded = loaded
        super().__init__(
            f"Redis holds distcrawl's function library version {loaded}, this distcrawl "
            f"needs {library_version()}: stop the workers of the other version and run "
            "`distcrawl setup` (as an administrator) to load this one"
        )


class ScriptsRefused(RuntimeError):
    """Redis holds no function library of distcrawl and refuses this user EVALSHA."""

    def __init__(self) -> None:
        super().__init__(
            "Redis holds no function library of distcrawl and refuses this user EVALSHA: "
            "run `distcrawl setup` as an administrator (Redis 7+) to load it, or give the "
            "user EVALSHA and SCRIPT LOAD (distcrawl acl --scripts eval)"
        )


def check_evalsha(client: Any) -> None:
    """Raise ScriptsRefused when this user may not send EVALSHA: asked with the digest of no
    script, which runs nothing (NOSCRIPT when it may)."""
    try:
        client.execute_command("EVALSHA", "0" * 40, 0)
    except redis.exceptions.NoPermissionError:
        raise ScriptsRefused() from None
    except redis.exceptions.NoScriptError:
        return


#: how Redis answers FCALL distcrawl_version when there is no library to call: no such
#: function (Redis 7+), no such command (Redis 6.2), or a user without FCALL
_NO_LIBRARY = ("function not found", "unknown command", "no permissions")


def loaded_version(client: Any) -> str | None:
    """The version of the library Redis holds (None: none, or no functions)."""
    try:
        got = client.execute_command("FCALL", VERSION_FUNCTION, 0)
    except redis.ResponseError as exc:
        if isinstance(exc, redis.exceptions.NoPermissionError) or any(
            text in str(exc).lower() for text in _NO_LIBRARY
        ):
            return None
        raise
    return got.decode() if isinstance(got, bytes) else str(got)


@dataclass
class ScriptMode:
    """Whether one client's scripts go as FCALL (True) or EVALSHA (False), settled by
    :meth:`resolve` on first use (None: not yet): a round trip, never in a constructor."""

    functions: bool | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def resolve(self, client: Any) -> bool:
        """Raises LibraryMismatch, or redis.RedisError when Redis cannot tell (asked again
        on the next use)."""
        if self.functions is None:
            with self._lock:
                if self.functions is None:
                    loaded = loaded_version(client)
                    if loaded is not None and loaded != library_version():
                        raise LibraryMismatch(loaded)
                    self.functions = loaded is not None
        return self.functions


class LuaScript:
    """One script, sent as FCALL of its function or EVALSHA of its source (its ``mode``);
    called as redis-py's Script is (``keys=``, ``args=``, ``client=``)."""

    def __init__(self, client: Any, name: str, seen: str, mode: ScriptMode) -> None:
        self.name = name
        self.script: Script = client.register_script(script_source(name, seen))
        self.sha = self.script.sha
        self.function = function_name(name, seen)
        self.mode = mode
        self._client = client

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The command that runs the script, for a pipeline."""
        if self.mode.resolve(self._client):
            return ("FCALL", self.function, len(keys), *keys, *args)
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def __call__(
        self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None
    ) -> Any:
        target = client if client is not None else self._client
        if not self.mode.resolve(self._client):
            return self.script(keys=list(keys), args=list(args), client=client)
        command = ("FCALL", self.function, len(keys), *keys, *args)
        if isinstance(target, RedisCluster) and keys:
            # routed by the first key, as batch.py routes its steps (all keys in one slot)
            return target.execute_command(*command, target_nodes=target.get_node_from_key(keys[0]))
        return target.execute_command(*command)


def lua_script(
    client: Any, name: str, seen: str = "set", mode: ScriptMode | None = None
) -> LuaScript:
    """A script of its own (the liveness beat, the doctor's), with a mode of its own
    unless given one."""
    return LuaScript(client, name, seen, mode if mode is not None else ScriptMode())


@dataclass(frozen=True)
class Scripts:
    commit: LuaScript
    lease: LuaScript
    redrive: LuaScript
    renew: LuaScript
    requeue: LuaScript
    robots: LuaScript
    robots_store: LuaScript
    seen: LuaScript
    bloom_grow: LuaScript
    sent: LuaScript
    places: LuaScript
    claim: LuaScript
    unclaim: LuaScript
    claimed: LuaScript
    sweep: LuaScript
    alive: LuaScript
    runnable: LuaScript
    finish: LuaScript
    mode: ScriptMode

    @classmethod
    def register(cls, client: redis.Redis, seen: str = "set") -> Scripts:
        mode = ScriptMode()
        return cls(**{name: LuaScript(client, name, seen, mode) for name in NAMES}, mode=mode)

    def load(self, client: redis.Redis) -> None:
        """Load every script into the server's cache in one round trip: after NOSCRIPT (a
        restarted or flushed server), before EVALSHA is sent again."""
        if isinstance(client, RedisCluster):
            # redis-py's cluster pipeline refuses SCRIPT LOAD; RedisCluster sends it to
            # every master, one call per script
            for name in NAMES:
                client.script_load(getattr(self, name).script.script)
            return
        pipe = client.pipeline(transaction=False)
        for name in NAMES:
            pipe.script_load(getattr(self, name).script.script)
        pipe.execute()
