"""The one way distcrawl shows a URL, or an error message, that may hold a credential.

A password printed once lives on in log files, CI output and bug reports, where nobody can
take it back; so every log line, error and CLI output that shows a Redis, MongoDB or
Scrapyd URL, or the message of an exception raised near one, goes through this module.
One set of rules for every URL form means a form handled in one place is handled in all.

What is hidden, for any ``scheme://`` URL (``redis://``, ``rediss://``, ``unix://``,
``mongodb://``, ``mongodb+srv://``, ``http(s)://``...):

* the password of the userinfo (``user:***@``; the user name is kept, it says who);
* the value of every query option whose name looks secret (:func:`is_secret_name`:
  ``password=``, ``pwd=``, ``passwd=``, ``api_key=``, ``authMechanismProperties=``...);
* everything after the scheme when the URL cannot be read one way only (an ``@`` after the
  host part: a password with an unescaped ``/``, ``?`` or ``#`` in it). Guessing where the
  password ends is how passwords leak.

A URL without a secret comes back byte for byte, so logs stay greppable.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterable
from types import TracebackType
from urllib.parse import quote, quote_plus, unquote, unquote_plus

MASK = "***"

#: names (of URL query options, ``name=value`` pairs and settings) whose value is a secret
_SECRET_NAME = re.compile(r"secret|token|key|auth|pass|pwd|credential", re.IGNORECASE)
#: names the rule above matches that say how to authenticate, not with what; hiding them
#: would only make a wrong ``authSource`` harder to see
_PUBLIC_NAMES = frozenset({"authsource", "authmechanism"})
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)(.*)\Z", re.DOTALL)
#: a URL inside free text: from its scheme to the next blank or quote, without the closing
#: bracket or punctuation of the sentence around it
_URL_IN_TEXT = re.compile(
    r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://(?:[^\s'\"<>`]*[^\s'\"<>`).,;:!?\]}])?"
)
#: ``user:password@host`` without a scheme
_USERINFO_IN_TEXT = re.compile(r"(?<![\w/:@])([\w.%+-]*):[^\s@/:]+@(?=[\w\[])")
#: ``name=value`` outside a URL (a repr, a command line, a connection string)
_OPTION_IN_TEXT = re.compile(r"(?<![\w%.-])([A-Za-z_][\w.-]*)=([^\s&;,'\"()\[\]{}<>]+)")


def is_secret_name(name: str) -> bool:
    """Whether an option or setting called ``name`` holds a secret (case-insensitive)."""
    name = unquote_plus(name)
    return name.lower() not in _PUBLIC_NAMES and _SECRET_NAME.search(name) is not None


def _split(url: str) -> tuple[str, str, str] | None:
    """(scheme, authority, rest) of ``url``; None if it has no ``scheme://``."""
    match = _SCHEME.match(url)
    if match is None:
        return None
    after = match.group(2)
    end = len(after)
    for sep in "/?#":
        index = after.find(sep)
        if index != -1:
            end = min(end, index)
    return match.group(1), after[:end], after[end:]


def _mask_options(query: str) -> str:
    """``a=1&password=x;b=2`` with the secret values masked, separators kept as they were."""
    pieces = re.split(r"([&;])", query)
    for i in range(0, len(pieces), 2):
        name, eq, value = pieces[i].partition("=")
        if eq and value and is_secret_name(name):
            pieces[i] = f"{name}={MASK}"
    return "".join(pieces)


def redact_url(url: str) -> str:
    """``url`` safe to show: userinfo password and secret options replaced by ``***``.

    Text that is not a ``scheme://`` URL comes back as it is unless it has an ``@`` (a
    ``user:password@host`` without its scheme), which is hidden whole.
    """
    parts = _split(url)
    if parts is None:
        return MASK if "@" in url else _mask_options(url)
    scheme, authority, rest = parts
    if "@" in rest:
        # a password with an unescaped "/", "?" or "#" reaches past the host part
        return scheme + MASK
    if "@" in authority:
        # the userinfo ends at the last "@" of the authority, as redis-py and pymongo read it
        userinfo, _, hosts = authority.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        authority = f"{user}:{MASK}@{hosts}" if colon else f"{user}@{hosts}"
    path, qmark, query = rest.partition("?")
    if qmark:
        query, hash_, fragment = query.partition("#")
        rest = f"{path}?{_mask_options(query)}{hash_}{_mask_options(fragment)}"
    elif "#" in path:
        path, _, fragment = path.partition("#")
        rest = f"{path}#{_mask_options(fragment)}"
    return scheme + authority + rest


def url_secrets(url: str | None) -> list[str]:
    """The secret values of ``url`` (password, secret options), to find them in free text
    such as a client library's error message, in the spellings they may appear in."""
    if not url:
        return []
    parts = _split(url)
    found: list[str] = []
    if parts is None:
        if "@" in url:
            found.append(url.rpartition("@")[0].partition(":")[2])
        query = url
    else:
        _scheme, authority, rest = parts
        if "@" in rest:  # unreadable: whatever stands where a password could be
            found.append((authority + rest).rpartition("@")[0].partition(":")[2])
        if "@" in authority:
            found.append(authority.rpartition("@")[0].partition(":")[2])
        query = rest.partition("?")[2]
    for option in re.split(r"[&;#]", query):
        name, eq, value = option.partition("=")
        if eq and value and is_secret_name(name):
            found.append(value)
    return _spellings(found)


def _spellings(secrets: Iterable[str]) -> list[str]:
    """Every secret as written, decoded and encoded, longest first (so that a secret is
    never half-replaced through a shorter one inside it)."""
    out: set[str] = set()
    for secret in secrets:
        if secret:
            out.update(
                {secret, unquote(secret), unquote_plus(secret), quote(secret, safe="")}
                | {quote_plus(secret)}
            )
    out.discard("")
    return sorted(out, key=len, reverse=True)


def _mask_option_in_text(match: re.Match[str]) -> str:
    return f"{match.group(1)}={MASK}" if is_secret_name(match.group(1)) else match.group(0)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Free text (an exception message, a command line) safe to show: every URL in it
    redacted, every ``secret-name=value`` masked, and every known secret value (say, the
    password of the URL in use, which a message may quote without its URL) replaced."""
    text = _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)
    text = _USERINFO_IN_TEXT.sub(rf"\1:{MASK}@", text)
    text = _OPTION_IN_TEXT.sub(_mask_option_in_text, text)
    for secret in _spellings(secrets):
        text = text.replace(secret, MASK)
    return text


def redact_error(exc: BaseException, *urls: str | None) -> str:
    """The message of ``exc`` without any secret of ``urls`` or of a URL it quotes."""
    return redact_text(str(exc), [s for url in urls for s in url_secrets(url)])


class RedactedTraceback(Exception):
    """Stands in for an exception whose traceback is logged: its text, redacted."""


def redacted_exc_info(
    exc: BaseException,
    *urls: str | None,
    tb: TracebackType | None = None,
) -> tuple[type[RedactedTraceback], RedactedTraceback, None]:
    """An ``exc_info`` for logging whose whole formatted traceback (chained causes
    included, each with its message) went through :func:`redact_text`: a traceback quotes
    the message of every exception in the chain, and any may carry a URL."""
    lines = traceback.format_exception(type(exc), exc, tb or exc.__traceback__)
    text = redact_text("".join(lines).rstrip(), [s for url in urls for s in url_secrets(url)])
    return RedactedTraceback, RedactedTraceback(text), None
