"""The frontier's Lua scripts, read from the ``.lua`` files beside this module.

Each file starts with a header naming its KEYS and ARGV. ``lib.lua`` (the layout of a
queue entry and the politeness helpers) is prepended to every script. Scripts are
registered once per client; redis-py sends EVALSHA and falls back to EVAL after a server
restart or flush. The batch runner (batch.py) pipelines EVALSHA itself and, on NOSCRIPT,
loads them all (``Scripts.load``) and sends again the steps that were refused.

The seen-set is pluggable: ``seen_set.lua`` and ``seen_bloom.lua`` each define
``seen_add(fp)`` and ``seen_has(fp)``, and the scripts that deduplicate (``commit.lua``,
``seen.lua``) are built by prepending one of them, so that the check stays atomic with the
push whichever seen-set is used, and each script keeps a single copy of the logic.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

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
)
SEEN_MODES = ("set", "bloom")

#: Each script's KEYS in order, named by the :class:`~distcrawl.keys.FrontierKeys` member
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
    "places": ("requests", "leases", "inflight", "robots", "ready", "slots", "placeless"),
    "redrive": ("dead", "queue", "seq", "start_urls", "ready", "slots"),
    "renew": ("leases", "requests"),
    "requeue": (
        *("leases", "queue", "requests", "ready", "slots", "inflight", "robots", "alive"),
        *("commits", "placeless", "claimants"),
    ),
    "robots": ("robots", "slots", "ready", "limits", "throttle"),
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


def script_source(name: str, seen: str = "set") -> str:
    """The source of script ``name``: the seen-set snippet if it uses one, lib.lua, then
    the script itself."""
    if seen not in SEEN_MODES:
        raise ValueError(f"unknown seen-set {seen!r}: expected one of {', '.join(SEEN_MODES)}")
    parts = [source("lib"), source(name)]
    at = SEEN_KEYS.get((name, seen))
    if at is not None:
        parts[:0] = [f"local SEEN_KEYS = {at}", source(f"seen_{seen}")]
    return "\n".join(parts)


@dataclass(frozen=True)
class Scripts:
    commit: Script
    lease: Script
    redrive: Script
    renew: Script
    requeue: Script
    robots: Script
    robots_store: Script
    seen: Script
    bloom_grow: Script
    sent: Script
    places: Script
    claim: Script
    unclaim: Script
    claimed: Script
    sweep: Script
    alive: Script

    @classmethod
    def register(cls, client: redis.Redis, seen: str = "set") -> Scripts:
        return cls(**{name: client.register_script(script_source(name, seen)) for name in NAMES})

    def load(self, client: redis.Redis) -> None:
        """Load every script into the server's cache in one round trip: after NOSCRIPT (a
        restarted or flushed server), before EVALSHA is sent again."""
        if isinstance(client, RedisCluster):
            # redis-py's cluster pipeline refuses SCRIPT LOAD; RedisCluster sends it to
            # every master, one call per script
            for name in NAMES:
                client.script_load(getattr(self, name).script)
            return
        pipe = client.pipeline(transaction=False)
        for name in NAMES:
            pipe.script_load(getattr(self, name).script)
        pipe.execute()
