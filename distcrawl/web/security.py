"""Who may see the console and who may act through it.

* Bound to a loopback address, the console needs no credential (only this host reaches
  it), but it answers only requests whose ``Host`` is that address or ``localhost``: a page
  of another site cannot reach it through DNS rebinding.
* Bound to any other address, it refuses to start without a token (``--token`` or
  ``DISTCRAWL_WEB_TOKEN``), and every request must carry it: HTTP basic auth with the
  token as the password (any user name; what a browser asks for by itself) or
  ``Authorization: Bearer <token>``. Compared in constant time.
* An action is a POST only, and only with the per-process CSRF token of the form the page
  was rendered with and, when the browser sends them, an ``Origin`` (else ``Referer``) of
  this same host and a ``Sec-Fetch-Site`` of ``same-origin``: another site's page cannot
  make a browser that holds the credential act.

Neither the token nor the Redis URL's password is ever put in a page or a log line.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import logging
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

logger = logging.getLogger(__name__)

#: the environment variable the token may come from (a command line is seen by ``ps``)
TOKEN_ENV = "DISTCRAWL_WEB_TOKEN"  # noqa: S105 (a variable's name, not its value)
LOOPBACK_NAMES = ("localhost",)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reached from this host only."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Guard:
    """The console's checks (see the module docstring), as aiohttp middleware."""

    def __init__(self, host: str, token: str | None) -> None:
        if not is_loopback(host) and not token:
            raise ValueError(
                f"refusing to serve on {host}, which is not a loopback address, without a "
                f"token: give --token or set ${TOKEN_ENV}"
            )
        self.host = host
        self.token = token
        #: the per-process token every form carries
        self.csrf = secrets.token_urlsafe(32)

    def _authorized(self, request: web.Request) -> bool:
        if not self.token:
            return True
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        given = ""
        if scheme.lower() == "bearer":
            given = value.strip()
        elif scheme.lower() == "basic":
            try:
                given = base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
            except (binascii.Error, UnicodeDecodeError):
                given = ""
        return hmac.compare_digest(given.encode(), self.token.encode())

    def _host_allowed(self, request: web.Request) -> bool:
        """On loopback, only a Host of a loopback name or address (DNS rebinding)."""
        if not is_loopback(self.host):
            return True
        name = urlsplit(f"//{request.host}").hostname or ""
        return is_loopback(name)

    def same_origin(self, request: web.Request) -> bool:
        """Whether a POST comes from a page of this console (see the module docstring)."""
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            return False
        origin = request.headers.get("Origin") or request.headers.get("Referer")
        if origin is None:
            return True  # not a browser (curl, a script): the CSRF token still has to match
        return urlsplit(origin).netloc == request.host

    def csrf_ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.csrf.encode())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self._host_allowed(request):
            raise web.HTTPForbidden(text="this console answers to its loopback address only")
        if not self._authorized(request):
            raise web.HTTPUnauthorized(
                text="a token is needed", headers={"WWW-Authenticate": 'Basic realm="distcrawl"'}
            )
        response = await handler(request)
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        )
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response
