"""Which MongoDB failures are worth retrying (the server or the network, not the document), and
what to tell the operator when MongoDB refuses the credentials."""

from __future__ import annotations

from pymongo.errors import (
    ConnectionFailure,
    OperationFailure,
    PyMongoError,
    WTimeoutError,
)

from distcrawl.model.redact import redact_text, url_secrets

#: server error codes that say "try again", not "this document is bad"
TRANSIENT_CODES = frozenset(
    {6, 7, 50, 89, 91, 112, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436}
)


def is_transient(exc: BaseException) -> bool:
    """Whether a failure of a whole batch is the kind that goes away (outage, failover)."""
    if isinstance(exc, ConnectionFailure | WTimeoutError):
        return True
    if isinstance(exc, PyMongoError) and exc.has_error_label("RetryableWriteError"):
        return True
    return isinstance(exc, OperationFailure) and exc.code in TRANSIENT_CODES


#: OperationFailure codes of a refused login (AuthenticationFailed) and a refused action
#: (Unauthorized): retrying will not help, and "unreachable" would point at the network
AUTH_FAILED, UNAUTHORIZED = 18, 13


AUTH_REFUSALS = {
    AUTH_FAILED: "MongoDB refused the credentials",
    UNAUTHORIZED: "MongoDB refused the user's permissions",
}


def auth_refusal(exc: BaseException) -> str | None:
    """What MongoDB refused, when ``exc`` is a failed login or a missing permission."""
    if isinstance(exc, OperationFailure):
        return AUTH_REFUSALS.get(exc.code or 0)
    return None


def error_reason(exc: BaseException, uri: str) -> str:
    """``exc``'s message fit for a log line: pymongo appends its whole topology to a server
    selection timeout, and the message may quote the URI's password."""
    text = str(exc).split(", Timeout: ")[0].split(", full error: ")[0]
    text = redact_text(text, url_secrets(uri))
    text = text if len(text) <= 300 else text[:300] + "..."
    refusal = auth_refusal(exc)
    return f"{refusal}: {text}" if refusal else text


class WriteConcernFailed(PyMongoError):
    """The writes were applied but not acknowledged as durable: the batch is retried."""
