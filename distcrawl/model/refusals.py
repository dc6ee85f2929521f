"""What a Redis error says about a commit: that Redis takes no write right now, whoever sends
it (an outage: the commit waits and is sent again unchanged), or that it refuses this commit
for what it holds (the commit is split to find the entry it refuses, which is dead-lettered).

Getting this wrong dead-letters good requests: a full Redis refuses every commit, and a split
of a commit Redis cannot take ends with every entry of it dead-lettered. The reply's code
cannot be read from the text alone: redis-py 8 strips it and raises a subclass instead
(``OutOfMemoryError("command not allowed when used memory > 'maxmemory'. script: ...")``,
``ReadOnlyError``, ``MasterDownError``...), keeping the code in ``status_code``; it maps no
class to ``BUSY`` or ``NOREPLICAS`` (the code stays in the text); Redis 6.2 wraps the reply
of a command that failed inside a script as ``Error running script (...): ... -OOM ...``. So
the code is read from each: the class, ``status_code``, a code where a reply puts one, and
the server's own wording of the reply.
"""

from __future__ import annotations

import re

import redis
from redis import exceptions as rex

#: replies that say Redis can take no write now, whoever sends it: the commit waits for
#: the outage to pass, then goes again unchanged
OUTAGE_REPLIES = (
    "OOM",
    "READONLY",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "NOREPLICAS",
)
#: replies that are not about a commit's content either, yet no outage that passes by
#: itself: a redirection redis-py follows, a script cache to reload, a refused credential
OTHER_REPLIES = ("MOVED", "ASK", "NOSCRIPT", "EXECABORT", "NOAUTH", "WRONGPASS", "NOPERM")
#: every reply that says nothing against the commit Redis refused
TRANSIENT_REPLIES = OUTAGE_REPLIES + OTHER_REPLIES

#: redis-py's classes and the code each stands for; a subclass before its base
_CLASSES: tuple[tuple[type[BaseException], str], ...] = (
    (rex.OutOfMemoryError, "OOM"),
    (rex.ReadOnlyError, "READONLY"),
    (rex.BusyLoadingError, "LOADING"),
    (rex.MasterDownError, "MASTERDOWN"),
    (rex.ClusterDownError, "CLUSTERDOWN"),
    (rex.TryAgainError, "TRYAGAIN"),
    (rex.MovedError, "MOVED"),
    (rex.AskError, "ASK"),
    (rex.NoScriptError, "NOSCRIPT"),
    (rex.ExecAbortError, "EXECABORT"),
    (rex.NoPermissionError, "NOPERM"),
    (rex.AuthenticationError, "NOAUTH"),
)
#: a code where replies put one: first, or after the ``-`` or ``: `` of a wrapped reply
_CODE = re.compile(r"(?:^|-|: )(" + "|".join(TRANSIENT_REPLIES) + r")(?![A-Za-z])")
#: the server's wording of these replies (Redis 6.2 to 8, Valkey), found in a text whose
#: code was stripped or never there
_WORDING = (
    ("command not allowed when used memory > 'maxmemory'", "OOM"),
    ("can't write against a read only replica", "READONLY"),
    ("is loading the dataset in memory", "LOADING"),
    ("is busy running a script", "BUSY"),
    ("link with master is down", "MASTERDOWN"),
    ("the cluster is down", "CLUSTERDOWN"),
    ("not enough good replicas to write", "NOREPLICAS"),
    ("has no permissions to", "NOPERM"),
    # Redis 7 inside a script: no code at all ("ERR The user executing the script can't run
    # this command or subcommand script: ...", "... can't access at least one of the keys")
    ("the user executing the script can't", "NOPERM"),
    ("no permissions to access a key", "NOPERM"),
)


def reply_code(exc: BaseException) -> str | None:
    """The code of a reply in TRANSIENT_REPLIES that ``exc`` carries, None when it carries
    none (a script's own error, a bug in it, or no reply of Redis at all)."""
    for cls, code in _CLASSES:
        if isinstance(exc, cls):
            return code
    status = getattr(exc, "status_code", None)
    if isinstance(status, str) and status in TRANSIENT_REPLIES:
        return status
    text = str(exc)
    found = _CODE.search(text.lstrip())
    if found is not None:
        return found.group(1)
    lowered = text.lower()
    for wording, code in _WORDING:
        if wording in lowered:
            return code
    return None


def outage_code(exc: BaseException) -> str | None:
    """The code, when ``exc`` says Redis takes no write now (OUTAGE_REPLIES)."""
    code = reply_code(exc)
    return code if code in OUTAGE_REPLIES else None


def refused(exc: BaseException) -> bool:
    """Whether Redis refused a commit for what it holds (a script error), as opposed to
    being unreachable, busy, out of memory, read-only or refusing the user, when any commit
    would fail."""
    return isinstance(exc, redis.ResponseError) and reply_code(exc) is None
