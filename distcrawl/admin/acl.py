"""Two Redis ACL users per crawl, so that a leaked credential cannot steer the workers.

Whoever can write a crawl's keys decides what its workers fetch and how they call back: the
queue, the request records, the seen-set, the politeness state. With the default Redis user
every producer (a cron job, a web form, a partner's script) holds that power over every crawl
on the server. So ``distcrawl acl`` prints two users for one namespace:

* a **producer** that may add start URLs (``LPUSH``/``RPUSH`` on ``<ns>:start_urls``, the one
  key it may write) and read what ``distcrawl push`` (pending cap) and ``distcrawl status``
  read: the sizes of the keys holding requests (ZCARD, LLEN, SCARD, EXISTS: a count, never
  a member, since a request carries its headers and cookies), and the values of the few
  keys holding none (counters, heartbeats, the pending cap; an ACL selector gives HGET,
  HGETALL, ZRANGE and ZREVRANGE on those alone); it runs no script;
* a **worker** with exactly the commands distcrawl sends (workers and the operator's
  ``distcrawl`` commands), on ``<ns>:*`` only (on a Redis Cluster: ``{<ns>:start_urls}:*``
  and ``<ns>:start_urls``, see keys.py; create the users on every node).

The command lists are kept in step with the code by tests/test_acl.py, which reads every
``redis.call`` of ``distcrawl/model/lua`` and every redis-py call of ``distcrawl/`` and fails when
a command is missing here or granted without use. Since Redis 7 the commands a Lua script
calls are checked against the caller's ACL too, so they are granted one by one, not through
FCALL alone. The worker runs the scripts as FCALL of the function library an administrator
loads with ``distcrawl setup`` (distcrawl/model/lua), and gets no EVAL, EVALSHA or SCRIPT, so that
its credential runs no Lua of its own; ``--scripts eval`` gives EVALSHA and SCRIPT LOAD
instead, for a Redis without that library. Passwords are never printed:
``--*-password-env`` gives the SHA-256 form (``#<hex>``), else a ``>`` placeholder the
operator replaces.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from distcrawl.model.keys import FrontierKeys
from distcrawl.model.names import glob_escape

#: what redis-py sends besides the commands distcrawl issues: PING is its health check
#: (``health_check_interval``), SELECT comes with a database number in the URL. AUTH and
#: HELLO are allowed to every user; ``make_redis`` turns off CLIENT SETINFO and CLIENT
#: MAINT_NOTIFICATIONS, so no CLIENT subcommand has to be granted.
CONNECTION_COMMANDS = ("ping", "select")

#: what redis-py's cluster client sends besides: CLUSTER SLOTS for the slot map (at start,
#: after a MOVED, a failover), COMMAND to learn where each command's keys are; granted only
#: to the users of a crawl on a Redis Cluster (``FrontierKeys.cluster``)
CLUSTER_COMMANDS = ("cluster|slots", "command")

#: EVALSHA runs the frontier's scripts; SCRIPT LOAD is redis-py's answer to NOSCRIPT after a
#: Redis restart or SCRIPT FLUSH. EVAL is never sent. Only with ``--scripts eval``: a user with
#: SCRIPT LOAD and EVALSHA runs any Lua it likes (a loop holding Redis for every client)
SCRIPT_COMMANDS = ("evalsha", "script|load")
#: with distcrawl's function library loaded (``distcrawl setup``, Redis 7+), the default:
#: FCALL runs its functions and nothing else
FUNCTION_COMMANDS = ("fcall",)

#: every command called inside distcrawl/model/lua/*.lua
LUA_COMMANDS = (
    "bitfield",
    "del",
    "exists",
    "get",
    "getbit",
    "hdel",
    "hexists",
    "hget",
    "hgetall",
    "hincrby",
    "hmget",
    "hscan",
    "hset",
    "incr",
    "incrby",
    "lindex",
    "llen",
    "lmove",
    "lpush",
    "lrange",
    "lrem",
    "lset",
    "ltrim",
    "pexpire",
    "rpush",
    "sadd",
    "set",
    "setbit",
    "sismember",
    "smembers",
    "smismember",
    "srem",
    "time",
    "xadd",
    "zadd",
    "zcard",
    "zcount",
    "zlexcount",
    "zmscore",
    "zrange",
    "zrangebylex",
    "zrangebyscore",
    "zrem",
    "zscore",
)

#: every command distcrawl sends from Python (frontier, scheduler, liveness, monitor, seen,
#: dashboard, doctor, cli, revisits_admin): MULTI/EXEC for the transactional pipelines, INFO
#: for the monitor's memory check (INFO memory), TIME for ages on the server's clock; BLMOVE and
#: BLPOP for a parked worker's waits for work, SADD to register its claim list before, CLIENT ID
#: and CLIENT UNBLOCK to end its BLMOVE when it closes or pauses (idle.py), ZDIFF for a parked
#: reaper's look for claimants not alive (batch.py)
PYTHON_COMMANDS = (
    "blmove",
    "blpop",
    "client|id",
    "client|unblock",
    "del",
    "exec",
    "exists",
    "get",
    "hdel",
    "hexists",
    "hget",
    "hgetall",
    "hincrby",
    "hkeys",
    "hlen",
    "hmget",
    "hscan",
    "hset",
    "hsetnx",
    "info",
    "llen",
    "lpush",
    "lrange",
    "ltrim",
    "multi",
    "pexpire",
    "publish",
    "sadd",
    "scan",
    "scard",
    "set",
    "smembers",
    "subscribe",
    "time",
    "unlink",
    "watch",
    "xrange",
    "zadd",
    "zcard",
    "zcount",
    "zdiff",
    "zincrby",
    "zlexcount",
    "zmscore",
    "zrange",
    "zrem",
    "zremrangebyrank",
    "zrevrange",
    "zscan",
    "zscore",
)

#: what ``distcrawl setup`` sends: an administrator's step, never granted by these lists
SETUP_COMMANDS = ("function|load",)

#: what ``distcrawl import scrapy-redis`` (importer.py) sends beyond PYTHON_COMMANDS: it
#: reads scrapy-redis' keys, outside the crawl's namespace, so it runs as an administrator,
#: never as the worker user these lists build, which gets none of them (SADD is a worker's:
#: its scripts' and a parked worker's own)
IMPORT_COMMANDS = ("renamenx", "smismember", "sscan", "type")

#: what ``distcrawl migrate`` (migrate.py, reshard.py) sends beyond PYTHON_COMMANDS:
#: DUMP/RESTORE and PTTL copy each key with its TTL, TYPE and the size of each type verify
#: the copy, MEMORY USAGE sizes the dry run; re-sharding (``--shards``) reads the seen SET
#: (SSCAN) and copies Bloom bitmaps in pieces (GETRANGE, SETRANGE); its SADD of fingerprints
#: into the new shards, HMGET of retries' records and ZADD of queue entries are among
#: PYTHON_COMMANDS (workers and ``distcrawl recrawl`` send them too). An administrator's tool,
#: like the import: the worker user gets none of these
MIGRATE_COMMANDS = (
    "dump",
    "getrange",
    "memory|usage",
    "pttl",
    "restore",
    "setrange",
    "sscan",
    "strlen",
    "type",
)

#: ``distcrawl push`` (ZCARD/LLEN for the room left, LPUSH inside MULTI/EXEC) and ``distcrawl
#: status``/``watch`` (one pipeline of sizes and TIME), plus RPUSH for producers that want an
#: entry taken before the others: commands that answer with a count, never with a member,
#: granted on every key the producer reads (:func:`producer_size_keys`)
PRODUCER_COMMANDS = (
    "exec",
    "exists",
    "llen",
    "lpush",
    "multi",
    "ping",
    "rpush",
    "scard",
    "select",
    "time",
    "zcard",
)

#: the reads that answer with members or values (the pending cap, the layout record, the
#: counters, heartbeats, busiest domains, liveness beats), granted in an ACL selector of their
#: own on the keys that hold no request (:func:`producer_record_keys`) and on no other: a
#: Redis ACL grants commands to all of a user's keys, so with ZRANGE beside ``<ns>:queue`` the
#: producer could read every queued request with its headers and cookies
PRODUCER_RECORD_COMMANDS = ("exists", "hget", "hgetall", "zrange", "zrevrange")


def producer_size_keys(keys: FrontierKeys) -> tuple[str, ...]:
    """The keys that hold requests or their ids (queues, leases, retries, revisits,
    seen-set, dead letters, start URLs) or a flag: the producer gets their sizes only."""
    return (
        keys.start_urls,
        keys.queue,
        keys.ready,
        keys.leases,
        keys.delayed,
        keys.revisits,
        keys.revisit_queue,
        keys.seen,
        keys.dead,
        keys.paused,
        keys.runnable,
    )


def producer_record_keys(keys: FrontierKeys) -> tuple[str, ...]:
    """The keys whose members are no request: the pending cap (``settings``), the layout
    record, the Bloom filter's description, counters, heartbeats, domains, liveness beats."""
    return (
        keys.settings,
        keys.meta,
        keys.bloom,
        keys.stats,
        keys.workers,
        keys.domains,
        keys.alive,
        keys.lifecycle,
    )


#: what push and status read in each shard of a sharded crawl (DISTCRAWL_SHARDS): sizes...
PRODUCER_SHARD_SIZES = (
    "queue",
    "ready",
    "leases",
    "delayed",
    "revisits",
    "revisit_queue",
    "seen",
    "dead",
    "runnable",
)
#: ... and the records of no request
PRODUCER_SHARD_RECORDS = ("bloom", "stats", "lifecycle")


def shard_pattern(keys: FrontierKeys, suffix: str = "*") -> str:
    """An ACL glob of the shards' keys (``{<ns>:<shard>}:<suffix>``, keys.py)."""
    return f"{{{key_pattern(check_token('namespace', keys.namespace))}:[0-9]*}}:{suffix}"


def worker_commands(cluster: bool = False, functions: bool = True) -> tuple[str, ...]:
    extra = CLUSTER_COMMANDS if cluster else ()
    # without the library, FCALL still asks once whether it is loaded (lua.ScriptMode)
    scripts = FUNCTION_COMMANDS if functions else (*FUNCTION_COMMANDS, *SCRIPT_COMMANDS)
    return tuple(sorted({*CONNECTION_COMMANDS, *scripts, *LUA_COMMANDS, *PYTHON_COMMANDS, *extra}))


def worker_key_patterns(keys: FrontierKeys) -> tuple[str, ...]:
    """``<ns>:*`` on a single server; on a cluster the hash-tagged names
    ``{<ns>:start_urls}:*`` and ``<ns>:start_urls`` itself (keys.py); and the shards' keys,
    ``{<ns>:<shard>}:*``, which a crawl may have (DISTCRAWL_SHARDS) on either."""
    namespace = key_pattern(check_token("namespace", keys.namespace))
    shards = shard_pattern(keys)
    if not keys.cluster:
        return (f"{namespace}:*", shards)
    crawl = keys.sharded(1)
    return (f"{key_pattern(crawl.prefix)}*", key_pattern(keys.start_urls), shards)


#: characters that would need quoting in redis-cli input or an ACL file
_UNSAFE = re.compile(r"[\s\"'\x00-\x1f\x7f]")


def key_pattern(key: str) -> str:
    """``key`` as an ACL glob that matches itself only (``*?[]\\`` escaped); a crawl's
    name holds none of these (names.check_namespace), a per-host key's netloc may."""
    return glob_escape(key)


def check_token(what: str, value: str) -> str:
    """Refuse what cannot be written unquoted in an ACL rule: whitespace, quotes, control
    characters (an ACL file has no quoting, and redis-cli would split or unquote them)."""
    if not value or _UNSAFE.search(value):
        raise ValueError(f"{what} {value!r} cannot be used in an ACL rule (quotes or whitespace)")
    return value


@dataclass(frozen=True)
class AclUser:
    role: str
    name: str
    rules: tuple[str, ...]
    #: True when the password rule is a placeholder the operator must replace
    placeholder: bool

    def command(self) -> str:
        return " ".join(("ACL", "SETUSER", self.name, "reset", *self.rules))

    def aclfile_line(self) -> str:
        """With ``reset`` too, so that both forms make the same user (reset also turns on
        sanitize-payload, which a user read from a file lacks)."""
        return " ".join(("user", self.name, "reset", *self.rules))


def password_rule(role: str, env_var: str | None) -> tuple[str, bool]:
    """``#<sha256>`` of the password in ``env_var`` (never the password itself), else a
    ``>`` placeholder; raises ValueError naming the variable when it is unset or empty."""
    if env_var is None:
        return f"><{role}-password>", True
    secret = os.environ.get(env_var)
    if not secret:
        raise ValueError(f"environment variable {env_var} (--{role}-password-env) is not set")
    return "#" + hashlib.sha256(secret.encode("utf-8")).hexdigest(), False


def producer_user(keys: FrontierKeys, name: str, password: tuple[str, bool]) -> AclUser:
    check_token("producer user", name)

    def reads(own: tuple[str, ...], shards: tuple[str, ...]) -> tuple[str, ...]:
        exact = tuple(f"%R~{key_pattern(check_token('key', key))}" for key in own)
        return exact + tuple(f"%R~{shard_pattern(keys, suffix)}" for suffix in shards)

    records = (
        *reads(producer_record_keys(keys), PRODUCER_SHARD_RECORDS),
        *(f"+{c}" for c in PRODUCER_RECORD_COMMANDS),
    )
    rules = (
        "on",
        password[0],
        "resetchannels",
        *reads(producer_size_keys(keys), PRODUCER_SHARD_SIZES),
        f"%W~{key_pattern(keys.start_urls)}",
        "-@all",
        *(f"+{c}" for c in PRODUCER_COMMANDS),
        *(f"+{c}" for c in (CLUSTER_COMMANDS if keys.cluster else ())),
        # a selector (Redis 7): these commands on these keys only
        "(" + " ".join(records) + ")",
    )
    return AclUser("producer", name, rules, password[1])


def worker_user(
    keys: FrontierKeys, name: str, password: tuple[str, bool], *, functions: bool = True
) -> AclUser:
    check_token("worker user", name)
    rules = (
        "on",
        password[0],
        "resetchannels",
        # the one channel its workers publish and hear holds on (engine/holds.py)
        f"&{key_pattern(keys.holds)}",
        *(f"~{pattern}" for pattern in worker_key_patterns(keys)),
        "-@all",
        *(f"+{c}" for c in worker_commands(keys.cluster, functions)),
    )
    return AclUser("worker", name, rules, password[1])


def roles(
    keys: FrontierKeys,
    *,
    producer: str | None = None,
    worker: str | None = None,
    producer_password_env: str | None = None,
    worker_password_env: str | None = None,
    functions: bool = True,
) -> tuple[AclUser, AclUser]:
    """Both users of one crawl; names default to ``<ns>-producer`` and ``<ns>-worker``."""
    return (
        producer_user(
            keys,
            producer or f"{keys.namespace}-producer",
            password_rule("producer", producer_password_env),
        ),
        worker_user(
            keys,
            worker or f"{keys.namespace}-worker",
            password_rule("worker", worker_password_env),
            functions=functions,
        ),
    )
