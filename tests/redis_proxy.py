"""A TCP proxy in front of Redis that can lose one reply on purpose.

A worker whose command ran on the server but whose reply never arrived cannot tell that
case from a command that never ran; only a faithful reproduction of it shows whether the
worker then stores something twice. Killing Redis or the client cannot produce it (the
command would be lost as well), so this proxy forwards commands unchanged, lets Redis
execute the chosen one, reads and discards its reply, then closes the client connection.

The proxy understands RESP just enough to find message boundaries: commands from the
client (arrays of bulk strings, several per write when pipelined, or inline commands) and
replies from the server (RESP2 and RESP3, nested aggregates, attributes and out-of-band
pushes). It assumes one reply per command, which holds for everything distcrawl sends;
SUBSCRIBE, MONITOR and ``CLIENT REPLY OFF|SKIP`` break that assumption (the trap would then
drop the wrong reply) and are not supported while a trap is armed.

Usage::

    with RedisProxy("127.0.0.1", server.port) as proxy:
        client = redis.Redis.from_url(proxy.url)
        proxy.drop_reply_once(lambda args: args[0].upper() == b"INCRBY")
        with pytest.raises(redis.ConnectionError):
            client.incr("k")  # ran on the server; the reply was thrown away

redis-py's ``incr()`` sends ``INCRBY k 1``: predicates see the command as sent on the
wire, not the method name. The client must not retry on ConnectionError (``Redis.from_url``
clients do not by default; ``Redis(host=...)`` ones do), or it re-sends the command.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

Predicate = Callable[[list[bytes]], bool]

CRLF = b"\r\n"
# a header line longer than this is not RESP (Redis itself caps inline commands at 64 KiB)
MAX_LINE = 64 * 1024
RECV_SIZE = 256 * 1024
# how often blocked loops wake up to notice stop() or the end of the proxy's lifetime
POLL_INTERVAL = 0.2

_SCALARS = frozenset(b"+-:_#,(")  # one line: simple string, error, integer, null, bool, ...
_BLOBS = frozenset(b"$!=")  # length-prefixed: bulk string, blob error, verbatim string
_AGGREGATES = frozenset(b"*~>")  # n values: array, set, push
_PAIRS = frozenset(b"%|")  # 2n values: map, attribute
PUSH = ord(">")
ATTRIBUTE = ord("|")


class ProtocolError(ValueError):
    """Bytes that are not RESP: the proxy closes the connection rather than guess."""


def _line(buf: bytes | bytearray, pos: int) -> tuple[bytes, int] | None:
    """The line starting at ``pos`` without its CRLF, and where the next one starts."""
    end = buf.find(CRLF, pos, pos + MAX_LINE + 2)
    if end < 0:
        if len(buf) - pos > MAX_LINE:
            raise ProtocolError(f"no line end within {MAX_LINE} bytes")
        return None
    return bytes(buf[pos:end]), end + 2


def _length(text: bytes) -> int:
    try:
        return int(text)
    except ValueError:
        raise ProtocolError(f"bad length {text[:40]!r}") from None


def reply_end(buf: bytes | bytearray, pos: int = 0) -> int | None:
    """Where the reply starting at ``pos`` ends, or None while it is incomplete.

    Iterative rather than recursive so a deeply nested reply cannot exhaust the stack.
    Each frame is [values still expected, is an attribute]: an attribute is metadata that
    comes before a value, so finishing one does not count as a value of its parent.
    """
    frames: list[list[int]] = [[1, 0]]
    size = len(buf)
    while True:
        found = _line(buf, pos)
        if found is None:
            return None
        header, pos = found
        if not header:
            raise ProtocolError("empty reply line")
        kind, rest = header[0], header[1:]
        if kind in _SCALARS:
            pass
        elif kind in _BLOBS:
            length = _length(rest)
            if length >= 0:
                if size < pos + length + 2:
                    return None
                if buf[pos + length : pos + length + 2] != CRLF:
                    raise ProtocolError("blob not followed by CRLF")
                pos += length + 2
        elif kind in _AGGREGATES or kind in _PAIRS:
            count = _length(rest) * (2 if kind in _PAIRS else 1)
            if count > 0:
                frames.append([count, int(kind == ATTRIBUTE)])
                continue
            # empty and null aggregates are complete values, like scalars
        else:
            raise ProtocolError(f"unknown reply type {header[:40]!r}")
        # one value is complete: close every frame it completes
        while True:
            frames[-1][0] -= 1
            if frames[-1][0] > 0:
                break
            _done, is_attribute = frames.pop()
            if not frames:
                return pos
            if is_attribute:
                break


def command_end(buf: bytes | bytearray, pos: int = 0) -> tuple[int, list[bytes]] | None:
    """Where the command starting at ``pos`` ends and its arguments, or None if incomplete.

    Clients send arrays of bulk strings; an inline command (``PING\\r\\n``, as typed in
    telnet) is accepted too so a hand-written test client cannot confuse the parser.
    """
    found = _line(buf, pos)
    if found is None:
        return None
    header, pos = found
    if not header.startswith(b"*"):
        return pos, header.split()
    count = _length(header[1:])
    args: list[bytes] = []
    size = len(buf)
    for _ in range(max(count, 0)):
        found = _line(buf, pos)
        if found is None:
            return None
        header, pos = found
        if not header.startswith(b"$"):
            raise ProtocolError(f"command argument is not a bulk string: {header[:40]!r}")
        length = _length(header[1:])
        if length < 0 or size < pos + length + 2:
            if length < 0:
                raise ProtocolError("null bulk string in a command")
            return None
        if buf[pos + length : pos + length + 2] != CRLF:
            raise ProtocolError("argument not followed by CRLF")
        args.append(bytes(buf[pos : pos + length]))
        pos += length + 2
    return pos, args


def _shutdown(sock: socket.socket | None) -> None:
    """Wakes any thread blocked on the socket; closing alone would not, on Linux."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Link:
    """One client connection and its own connection to Redis, relayed by two threads.

    One thread per direction, both blocking on plain ``sendall``: a client that writes a
    whole pipeline before reading replies cannot deadlock a relay that would otherwise wait
    for it to read. The sockets are closed by whichever thread ends last, so neither thread
    ever touches a file descriptor number that was closed and reused under it.
    """

    def __init__(self, proxy: RedisProxy, client: socket.socket, number: int) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.number = number
        self.closed = threading.Event()
        self.lock = threading.Lock()
        self.users = 2
        #: the request side stopped because of the trap: the reply side closes, later
        self.trapped = False
        #: index of the command whose reply must be dropped (commands counted from 0)
        self.trap_index: int | None = None
        self.trap_args: list[bytes] = []
        self.upstream_ready = threading.Event()
        self.threads = [
            threading.Thread(target=self._run_requests, name=f"redis-proxy-{number}-c2s"),
            threading.Thread(target=self._run_replies, name=f"redis-proxy-{number}-s2c"),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.daemon = True  # a test that forgets stop() must not hang the interpreter
            thread.start()

    def close(self) -> None:
        """Idempotent; safe from any thread, including stop()."""
        self.closed.set()
        self.upstream_ready.set()
        _shutdown(self.client)
        _shutdown(self.upstream)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            if thread.ident is not None and thread is not threading.current_thread():
                thread.join(max(deadline - time.monotonic(), 0))

    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def _release(self, close: bool = True) -> None:
        with self.lock:
            self.users -= 1
            last = self.users == 0
        if close or last:
            self.close()
        if last:
            self.client.close()
            if self.upstream is not None:
                self.upstream.close()

    def _recv(self, sock: socket.socket, selector: selectors.BaseSelector) -> bytes:
        """The next bytes, or b"" when the peer, stop() or the proxy's lifetime ended it.

        ``selector`` watches ``sock`` only; waiting in short slices is what bounds this loop.
        """
        while not self.closed.is_set() and not self.proxy.expired():
            if selector.select(POLL_INTERVAL):
                try:
                    return sock.recv(RECV_SIZE)
                except OSError:
                    return b""
        return b""

    # ------------------------------------------------------------ client -> redis

    def _run_requests(self) -> None:
        try:
            self._connect()
            if self.upstream is not None:
                self._relay_requests(self.upstream)
        except Exception:
            logger.exception("redis proxy: connection %d, client side failed", self.number)
        finally:
            self._release(close=not self.trapped)

    def _connect(self) -> None:
        try:
            self.upstream = socket.create_connection(
                self.proxy.target, timeout=self.proxy.connect_timeout
            )
            self.upstream.settimeout(None)
            self.upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            logger.info("redis proxy: cannot reach %s:%s: %s", *self.proxy.target, exc)
            self.close()
        finally:
            self.upstream_ready.set()
        if self.closed.is_set():  # stop() ran while connecting: it could not shut this one
            _shutdown(self.upstream)

    def _relay_requests(self, upstream: socket.socket) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.client, selectors.EVENT_READ)
            self._relay_requests_with(upstream, selector)

    def _relay_requests_with(
        self, upstream: socket.socket, selector: selectors.BaseSelector
    ) -> None:
        buf = bytearray()
        sent = 0  # commands forwarded so far on this connection
        while True:
            chunk = self._recv(self.client, selector)
            if not chunk:
                return
            buf += chunk
            pos = 0
            while True:
                try:
                    found = command_end(buf, pos)
                except ProtocolError as exc:
                    logger.warning("redis proxy: connection %d: %s", self.number, exc)
                    self._forward(upstream, buf[:pos])
                    return
                if found is None:
                    break
                pos, args = found
                if args and self.proxy._claim(args):
                    with self.lock:
                        self.trap_index, self.trap_args = sent, args
                        self.trapped = True
                    # the reply side may see this command's reply once it is sent: the
                    # index is set first, and later commands are never sent
                    self._forward(upstream, buf[:pos])
                    return
                if args:
                    sent += 1
            if pos and not self._forward(upstream, buf[:pos]):
                return
            del buf[:pos]

    def _forward(self, sock: socket.socket, data: bytes | bytearray) -> bool:
        if not data:
            return True
        try:
            sock.sendall(data)
            return True
        except OSError:
            self.close()
            return False

    # ------------------------------------------------------------ redis -> client

    def _run_replies(self) -> None:
        try:
            self.upstream_ready.wait(self.proxy.connect_timeout + 1)
            if self.upstream is not None and not self.closed.is_set():
                self._relay_replies(self.upstream)
        except Exception:
            logger.exception("redis proxy: connection %d, server side failed", self.number)
        finally:
            self._release()

    def _relay_replies(self, upstream: socket.socket) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(upstream, selectors.EVENT_READ)
            self._relay_replies_with(upstream, selector)

    def _relay_replies_with(
        self, upstream: socket.socket, selector: selectors.BaseSelector
    ) -> None:
        buf = bytearray()
        replied = 0  # replies forwarded so far (pushes are not replies to a command)
        while True:
            chunk = self._recv(upstream, selector)
            if not chunk:
                return
            buf += chunk
            pos = 0
            while True:
                start = pos
                try:
                    end = reply_end(buf, pos)
                except ProtocolError as exc:
                    logger.warning("redis proxy: connection %d: %s", self.number, exc)
                    self._forward(self.client, buf[:start])
                    return
                if end is None:
                    break
                pos = end
                if buf[start] == PUSH:
                    continue
                with self.lock:
                    trapped = replied == self.trap_index
                if trapped:
                    self._forward(self.client, buf[:start])
                    self.proxy._fired(self.trap_args, bytes(buf[start:end]))
                    return  # _release() closes both sides: the client sees the connection drop
                replied += 1
            if pos and not self._forward(self.client, buf[:pos]):
                return
            del buf[:pos]


class RedisProxy:
    """Listens on 127.0.0.1 (a free port) and relays every connection to ``target``.

    ``lifetime`` bounds how long any of its threads may run, in case a test never calls
    stop(); the default outlasts pytest's own timeout.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        host: str = "127.0.0.1",
        connect_timeout: float = 5.0,
        lifetime: float = 900.0,
        url_auth: str = "",
        url_db: int = 0,
    ) -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port: int | None = None
        self.connect_timeout = connect_timeout
        self.lifetime = lifetime
        self._url_auth = url_auth
        self._url_db = url_db
        #: set when a trapped reply was read from Redis and thrown away
        self.trap_fired = threading.Event()
        #: arguments of the command whose reply was dropped
        self.dropped: list[bytes] | None = None
        #: the reply Redis sent for it, kept so a test can show what the client never saw
        self.dropped_reply: bytes | None = None
        #: client connections accepted so far
        self.accepted = 0
        self._trap: Predicate | None = None
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._stopping = threading.Event()
        self._deadline = 0.0

    @classmethod
    def for_url(cls, url: str, **kwargs: Any) -> RedisProxy:
        """A proxy for a ``redis://`` URL whose own url keeps the credentials and database."""
        parts = urlsplit(url)
        if parts.scheme != "redis" or parts.hostname is None:
            raise ValueError("only redis://host:port URLs can be proxied")
        auth = parts.netloc.rpartition("@")[0]
        db = int(parts.path.strip("/") or 0)
        return cls(
            parts.hostname,
            parts.port or 6379,
            url_auth=auth + "@" if auth else "",
            url_db=db,
            **kwargs,
        )

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("RedisProxy.url before start()")
        return f"redis://{self._url_auth}{self.host}:{self.port}/{self._url_db}"

    # ------------------------------------------------------------ the trap

    def drop_reply_once(self, predicate: Predicate) -> None:
        """Arm the trap: the reply to the first command (on any connection) for which
        ``predicate(args)`` is true is read from Redis and dropped, and that client
        connection is closed; commands after it on that connection never reach Redis.

        Arming again replaces a trap that has not fired yet and resets ``trap_fired``. If
        Redis closes the connection before that reply arrives, the trap is spent without
        firing: nobody can tell whether the command ran, which is not the case under test.
        """
        with self._lock:
            self._trap = predicate
            self.trap_fired.clear()
            self.dropped = None
            self.dropped_reply = None

    def disarm(self) -> None:
        with self._lock:
            self._trap = None

    @property
    def armed(self) -> bool:
        return self._trap is not None

    def _claim(self, args: list[bytes]) -> bool:
        """Whether this command is the trapped one; the lock makes the trap one-shot even
        when several connections send matching commands at once."""
        with self._lock:
            if self._trap is None:
                return False
            try:
                matched = bool(self._trap(args))
            except Exception:
                logger.exception("redis proxy: trap predicate failed on %r", args[:1])
                return False
            if matched:
                self._trap = None
            return matched

    def _fired(self, args: list[bytes], reply: bytes) -> None:
        # set before the client connection is closed, so a test that saw the error can
        # rely on it without waiting
        self.dropped = args
        self.dropped_reply = reply
        self.trap_fired.set()

    # ------------------------------------------------------------ lifecycle

    def expired(self) -> bool:
        return self._stopping.is_set() or time.monotonic() > self._deadline

    def start(self) -> RedisProxy:
        if self._acceptor is not None:
            raise RuntimeError("a RedisProxy starts once")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(128)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._stopping.clear()
        self._deadline = time.monotonic() + self.lifetime
        self._acceptor = threading.Thread(
            target=self._accept_loop, args=(listener,), name="redis-proxy-accept", daemon=True
        )
        self._acceptor.start()
        return self

    def _accept_loop(self, listener: socket.socket) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ)
            while not self.expired():
                if not selector.select(POLL_INTERVAL):
                    continue
                try:
                    client, _ = listener.accept()
                except OSError:
                    continue
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with self._lock:
                    if self._stopping.is_set():
                        client.close()
                        break
                    self.accepted += 1
                    link = _Link(self, client, self.accepted)
                    # finished links are dropped here so a long test does not accumulate them
                    self._links = [old for old in self._links if old.alive()] + [link]
                link.start()

    def close_connections(self) -> int:
        """Drop every client connection now, as a Redis restart would; the listener stays."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        return len(links)

    def active_connections(self) -> int:
        with self._lock:
            return sum(1 for link in self._links if link.alive())

    def threads(self) -> list[threading.Thread]:
        """Threads of this proxy still running (empty after a successful stop())."""
        with self._lock:
            found = [t for link in self._links for t in link.threads if t.is_alive()]
        if self._acceptor is not None and self._acceptor.is_alive():
            found.append(self._acceptor)
        return found

    def join_idle(self, timeout: float = 5.0) -> bool:
        """Wait until no client connection is open (bounded); True if none is."""
        deadline = time.monotonic() + timeout
        while self.active_connections() and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.active_connections() == 0

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every connection, and wait for every thread (bounded)."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        if self._acceptor is not None:
            self._acceptor.join(timeout)
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            links = list(self._links)  # kept, so threads() can still report stragglers
        for link in links:
            link.close()
        for link in links:
            link.join(max(deadline - time.monotonic(), 0))
        alive = [thread.name for thread in self.threads()]
        if alive:
            logger.warning("redis proxy: threads still running after stop(): %s", alive)

    def __enter__(self) -> RedisProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
