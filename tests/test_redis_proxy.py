"""The reply-losing Redis proxy is test infrastructure: it must relay faithfully until told
otherwise, and then lose exactly one reply of a command that did run."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from distcrawl.testing.redis_server import RedisServer, find_free_port
from tests.redis_proxy import ProtocolError, RedisProxy, command_end, reply_end
from tests.support import wait_until

MB = 1024 * 1024


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """No retries: a retrying client would re-send the command and hide the lost reply."""
    options: dict[str, Any] = {"retry": Retry(NoBackoff(), 0), "socket_timeout": 10}
    return redis.Redis.from_url(url, **{**options, **kwargs})


@pytest.fixture
def client(redis_proxy: RedisProxy) -> Iterator[redis.Redis]:
    proxied = connect(redis_proxy.url)
    try:
        yield proxied
    finally:
        proxied.close()


def is_command(name: bytes) -> Any:
    """Matches by command name; mind that redis-py's ``incr()`` sends INCRBY, not INCR."""
    return lambda args: args[0].upper() == name


def raw(proxy: RedisProxy) -> socket.socket:
    assert proxy.port is not None
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=10)


def recv_all(sock: socket.socket, limit: int = 64 * 1024) -> bytes:
    """Everything until the peer closes (bounded by the socket timeout and ``limit``)."""
    out = b""
    while len(out) < limit:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return out


def resp_command(*args: bytes) -> bytes:
    out = b"*%d\r\n" % len(args)
    for arg in args:
        out += b"$%d\r\n%s\r\n" % (len(arg), arg)
    return out


# ------------------------------------------------------------------ RESP framing

REPLIES = [
    b"+OK\r\n",
    b"-ERR wrong\r\n",
    b":42\r\n",
    b"$5\r\nhello\r\n",
    b"$0\r\n\r\n",
    b"$-1\r\n",
    b"$4\r\n\r\n\r\n\r\n",  # a value that contains CRLF
    b"*-1\r\n",
    b"*0\r\n",
    b"*3\r\n:1\r\n*2\r\n$1\r\na\r\n*-1\r\n$-1\r\n",
    b"*2\r\n*1\r\n*1\r\n:1\r\n+x\r\n",
    # RESP3
    b"_\r\n",
    b"#t\r\n",
    b",3.14\r\n",
    b"(3492890328409238509324850943850943825024385\r\n",
    b"!9\r\nERR oops!\r\n",
    b"=15\r\ntxt:Some string\r\n",
    b"%2\r\n+a\r\n:1\r\n+b\r\n*1\r\n%0\r\n",
    b"~2\r\n+x\r\n+y\r\n",
    b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
    b"|1\r\n+ttl\r\n:3600\r\n*2\r\n:1\r\n:2\r\n",  # attribute, then the reply it annotates
    b"*2\r\n|1\r\n+k\r\n+v\r\n:1\r\n:2\r\n",  # attribute inside an array
]


@pytest.mark.parametrize("reply", REPLIES)
def test_reply_end_finds_exactly_one_reply(reply: bytes) -> None:
    assert reply_end(reply) == len(reply)
    for cut in range(len(reply)):
        assert reply_end(reply[:cut]) is None, cut
    assert reply_end(reply + b":7\r\n") == len(reply)
    assert reply_end(b":0\r\n" + reply, 4) == 4 + len(reply)


def test_reply_end_over_a_concatenated_stream() -> None:
    stream = b"".join(REPLIES)
    pos, found = 0, []
    for _ in range(len(REPLIES) + 1):
        end = reply_end(stream, pos)
        if end is None:
            break
        found.append(stream[pos:end])
        pos = end
    assert found == REPLIES and pos == len(stream)


def test_reply_end_deep_nesting_and_garbage() -> None:
    deep = b"*1\r\n" * 100_000 + b":1\r\n"
    assert reply_end(deep) == len(deep)
    for garbage in (b"?what\r\n", b"$x\r\n", b"\r\n", b"$3\r\nabcde\r\n"):
        with pytest.raises(ProtocolError):
            reply_end(garbage)
    with pytest.raises(ProtocolError):
        reply_end(b"+" + b"x" * (100 * 1024))  # no line end in sight


def test_command_end_splits_a_pipeline_and_inline_commands() -> None:
    first = resp_command(b"SET", b"k", b"v\r\nv")
    second = resp_command(b"GET", b"k")
    stream = first + b"PING hello\r\n" + second
    assert command_end(stream) == (len(first), [b"SET", b"k", b"v\r\nv"])
    assert command_end(stream, len(first)) == (len(first) + 12, [b"PING", b"hello"])
    assert command_end(stream, len(first) + 12) == (len(stream), [b"GET", b"k"])
    for cut in range(len(first)):
        assert command_end(first[:cut]) is None, cut
    assert command_end(b"*0\r\n") == (4, [])
    with pytest.raises(ProtocolError):
        command_end(b"*1\r\n:1\r\n")


# ------------------------------------------------------------------ faithful relay


def test_get_set_and_url(redis_proxy: RedisProxy, client: redis.Redis) -> None:
    assert redis_proxy.url == f"redis://127.0.0.1:{redis_proxy.port}/0"
    assert client.ping()
    assert client.set("k", "v")
    assert client.get("k") == b"v"
    assert client.get("missing") is None
    client.rpush("list", *range(100))
    assert client.lrange("list", 0, -1) == [str(i).encode() for i in range(100)]
    with pytest.raises(redis.ResponseError):
        client.incr("list")  # an error reply is relayed like any other


def test_pipelines(client: redis.Redis, redis_client: redis.Redis) -> None:
    with client.pipeline(transaction=False) as pipe:
        for i in range(500):
            pipe.set(f"p{i}", i)
            pipe.incr("count")
        results = pipe.execute()
    assert results == [x for i in range(500) for x in (True, i + 1)]
    with client.pipeline() as pipe:  # MULTI ... EXEC
        pipe.get("p7")
        pipe.incr("count")
        pipe.hgetall("nothing")
        assert pipe.execute() == [b"7", 501, {}]
    assert redis_client.get("count") == b"501"


def test_scripts(client: redis.Redis, redis_client: redis.Redis) -> None:
    script = client.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    assert script(keys=["s"], args=[5]) == 5  # EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA
    assert script(keys=["s"], args=[2]) == 7
    redis_client.script_flush()
    assert script(keys=["s"], args=[1]) == 8
    assert client.eval("return {KEYS[1], ARGV[1], {1, 2}}", 1, "a", "b") == [b"a", b"b", [1, 2]]
    with client.pipeline() as pipe:
        script(keys=["s"], args=[10], client=pipe)
        pipe.get("s")
        assert pipe.execute() == [18, b"18"]


def test_large_values(client: redis.Redis, redis_client: redis.Redis) -> None:
    big = bytes(range(256)) * (4 * 1024)  # 1 MiB, every byte value, CRLF included
    assert len(big) == MB
    client.set("big", big)
    assert redis_client.get("big") == big
    assert client.get("big") == big
    with client.pipeline(transaction=False) as pipe:
        for i in range(4):
            pipe.set(f"big{i}", big + bytes([i]))
        for i in range(4):
            pipe.get(f"big{i}")
        results = pipe.execute()
    assert results[:4] == [True] * 4
    assert results[4:] == [big + bytes([i]) for i in range(4)]


def test_resp3_client(redis_proxy: RedisProxy, redis_client: redis.Redis) -> None:
    resp3 = connect(redis_proxy.url, protocol=3)
    try:
        resp3.hset("h", mapping={"a": "1", "b": "2"})
        assert resp3.hgetall("h") == {b"a": b"1", b"b": b"2"}
        resp3.sadd("set", "x", "y")
        assert resp3.smembers("set") == {b"x", b"y"}
        redis_proxy.drop_reply_once(is_command(b"HGETALL"))
        with pytest.raises(redis.ConnectionError):
            resp3.hgetall("h")
        assert redis_proxy.dropped == [b"HGETALL", b"h"]
        assert redis_proxy.dropped_reply is not None
        assert redis_proxy.dropped_reply.startswith(b"%2\r\n")  # a RESP3 map
        assert resp3.hget("h", "a") == b"1"
    finally:
        resp3.close()


def test_many_concurrent_connections(redis_proxy: RedisProxy, redis_client: redis.Redis) -> None:
    value = b"x" * (100 * 1024)
    errors: list[BaseException] = []

    def work(index: int) -> None:
        own = connect(redis_proxy.url)
        try:
            for _ in range(20):
                own.incr("shared")
            own.set(f"v{index}", value + b"%d" % index)
            assert own.get(f"v{index}") == value + b"%d" % index
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert redis_client.get("shared") == b"640"
    assert redis_proxy.accepted >= 32
    assert redis_proxy.join_idle(10)


# ------------------------------------------------------------------ the lost reply


def test_lost_incr_reply(
    redis_proxy: RedisProxy, client: redis.Redis, redis_client: redis.Redis
) -> None:
    assert client.incr("k") == 1
    redis_proxy.drop_reply_once(is_command(b"INCR"))
    assert client.incr("k") == 2  # redis-py's incr() is INCRBY k 1: no match
    assert not redis_proxy.trap_fired.is_set()
    redis_proxy.drop_reply_once(is_command(b"INCRBY"))
    assert redis_proxy.armed and not redis_proxy.trap_fired.is_set()
    with pytest.raises(redis.ConnectionError):
        client.incr("k")
    assert redis_proxy.trap_fired.is_set()
    assert redis_proxy.dropped == [b"INCRBY", b"k", b"1"]
    assert redis_proxy.dropped_reply == b":3\r\n"
    assert redis_client.get("k") == b"3"  # it ran: the client just never heard of it
    assert client.incr("k") == 4  # redis-py reconnects; the trap is spent
    assert client.incr("k") == 5
    assert not redis_proxy.armed
    assert redis_proxy.dropped == [b"INCRBY", b"k", b"1"]


def test_lost_reply_of_a_literal_incr(
    redis_proxy: RedisProxy, client: redis.Redis, redis_client: redis.Redis
) -> None:
    redis_proxy.drop_reply_once(lambda a: a[0].upper() == b"INCR")
    with pytest.raises(redis.ConnectionError):
        client.execute_command("INCR", "k")
    assert redis_proxy.dropped == [b"INCR", b"k"]
    assert redis_client.get("k") == b"1"
    assert client.execute_command("INCR", "k") == 2


def test_trap_ignores_other_commands_and_can_be_rearmed(
    redis_proxy: RedisProxy, client: redis.Redis, redis_client: redis.Redis
) -> None:
    redis_proxy.drop_reply_once(lambda args: args[:2] == [b"INCRBY", b"target"])
    assert client.incr("other") == 1
    assert client.set("target", 10)
    assert not redis_proxy.trap_fired.is_set()
    with pytest.raises(redis.ConnectionError):
        client.incr("target")
    assert redis_client.get("target") == b"11"
    redis_proxy.drop_reply_once(is_command(b"GET"))
    assert not redis_proxy.trap_fired.is_set() and redis_proxy.dropped is None
    with pytest.raises(redis.ConnectionError):
        client.get("target")
    assert redis_proxy.dropped_reply == b"$2\r\n11\r\n"
    redis_proxy.drop_reply_once(is_command(b"GET"))
    redis_proxy.disarm()
    assert client.get("target") == b"11"


def test_lost_reply_in_a_pipeline_stops_the_rest(
    redis_proxy: RedisProxy, client: redis.Redis, redis_client: redis.Redis
) -> None:
    redis_proxy.drop_reply_once(is_command(b"INCRBY"))
    with client.pipeline(transaction=False) as pipe:
        pipe.set("before", 1)
        pipe.incr("k")
        pipe.set("after", 1)
        with pytest.raises(redis.ConnectionError):
            pipe.execute()
    assert redis_proxy.dropped == [b"INCRBY", b"k", b"1"]
    assert redis_client.get("before") == b"1"
    assert redis_client.get("k") == b"1"
    assert redis_client.get("after") is None  # never forwarded
    assert client.get("k") == b"1"


def test_lost_exec_reply_of_a_transaction(
    redis_proxy: RedisProxy, client: redis.Redis, redis_client: redis.Redis
) -> None:
    """The reply of EXEC is the one to lose for "the transaction ran, the client thinks it
    failed"; losing a command's +QUEUED instead aborts the transaction with the connection."""
    redis_proxy.drop_reply_once(is_command(b"EXEC"))
    with client.pipeline() as pipe:
        pipe.incr("a")
        pipe.incr("b")
        with pytest.raises(redis.ConnectionError):
            pipe.execute()
    assert redis_client.mget("a", "b") == [b"1", b"1"]
    assert redis_proxy.dropped_reply == b"*2\r\n:1\r\n:1\r\n"

    redis_proxy.drop_reply_once(is_command(b"INCRBY"))
    with client.pipeline() as pipe:
        pipe.incr("a")
        pipe.incr("b")
        with pytest.raises(redis.ConnectionError):
            pipe.execute()
    assert redis_proxy.dropped_reply == b"+QUEUED\r\n"
    assert redis_client.mget("a", "b") == [b"1", b"1"]  # discarded with the connection


def test_lost_evalsha_reply_matched_by_sha(
    redis_proxy: RedisProxy, client: redis.Redis, redis_client: redis.Redis
) -> None:
    script = client.register_script("return redis.call('INCR', KEYS[1])")
    other = client.register_script("return redis.call('INCR', KEYS[1]) + 100")
    assert script(keys=["n"]) == 1
    assert other(keys=["n"]) == 102
    sha = script.sha.encode()
    redis_proxy.drop_reply_once(lambda args: args[0].upper() == b"EVALSHA" and args[1] == sha)
    assert other(keys=["n"]) == 103
    with pytest.raises(redis.ConnectionError):
        script(keys=["n"])
    assert redis_proxy.dropped == [b"EVALSHA", sha, b"1", b"n"]
    assert redis_client.get("n") == b"4"
    assert script(keys=["n"]) == 5


def test_a_retrying_client_runs_the_command_twice(
    redis_proxy: RedisProxy, redis_client: redis.Redis
) -> None:
    """What the proxy is for: redis-py's retry on ConnectionError re-sends a command that
    already ran. (``Redis.from_url`` connections do not retry by default; ``Redis(host=...)``
    ones do.)"""
    retrying = connect(redis_proxy.url, retry=Retry(NoBackoff(), 1))
    try:
        redis_proxy.drop_reply_once(is_command(b"INCRBY"))
        assert retrying.incr("twice") == 2
        assert redis_client.get("twice") == b"2"
    finally:
        retrying.close()


def test_trap_with_a_command_split_in_single_bytes(
    redis_proxy: RedisProxy, redis_client: redis.Redis
) -> None:
    redis_proxy.drop_reply_once(is_command(b"SET"))
    sock = raw(redis_proxy)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(resp_command(b"PING"))
        pong = b""
        for _ in range(100):  # bounded: the reply is 7 bytes
            pong += sock.recv(7 - len(pong))
            if len(pong) == 7:
                break
        assert pong == b"+PONG\r\n"
        trapped = resp_command(b"SET", b"slow", b"v" * 50)
        data = trapped + resp_command(b"SET", b"never", b"1")
        for i in range(len(data)):
            try:
                sock.sendall(data[i : i + 1])
            except (BrokenPipeError, ConnectionResetError):
                # the proxy closed the connection once the trapped SET ran: what follows
                # it may be cut off, never what the trap needed
                assert i >= len(trapped), i
                break
        assert recv_all(sock) == b""  # the trapped reply is never delivered
    finally:
        sock.close()
    assert redis_proxy.dropped == [b"SET", b"slow", b"v" * 50]
    assert redis_client.get("slow") == b"v" * 50
    assert redis_client.get("never") is None


def test_predicate_that_raises_matches_nothing(
    redis_proxy: RedisProxy, client: redis.Redis
) -> None:
    redis_proxy.drop_reply_once(lambda args: args[5] == b"x")  # IndexError on short commands
    assert client.set("k", 1)
    assert not redis_proxy.trap_fired.is_set()


# ------------------------------------------------------------------ robustness


def test_client_closing_mid_command(
    redis_proxy: RedisProxy, client: redis.Redis, redis_client: redis.Redis
) -> None:
    sock = raw(redis_proxy)
    sock.sendall(resp_command(b"SET", b"half", b"x" * 1000)[:500])
    sock.close()
    assert wait_until(lambda: redis_proxy.active_connections() <= 1, 10)
    assert redis_client.get("half") is None
    assert client.ping()


def test_garbage_from_the_client_closes_only_that_connection(
    redis_proxy: RedisProxy, client: redis.Redis
) -> None:
    assert client.ping()
    sock = raw(redis_proxy)
    try:
        sock.sendall(b"*1\r\n:1\r\n")
        assert recv_all(sock) == b""  # closed, as Redis closes on a protocol error
    finally:
        sock.close()
    assert client.ping()


def test_server_closing_the_connection(
    redis_proxy: RedisProxy, client: redis.Redis, redis_client: redis.Redis
) -> None:
    assert client.set("k", 1)
    assert redis_proxy.active_connections() == 1
    assert redis_client.client_kill_filter(_type="normal", skipme=True) >= 1
    assert wait_until(lambda: redis_proxy.active_connections() == 0, 10)
    try:
        assert client.get("k") == b"1"  # redis-py may notice the closed socket first
    except redis.ConnectionError:
        assert client.get("k") == b"1"


def test_unreachable_target(tmp_path: Any) -> None:
    with RedisProxy("127.0.0.1", find_free_port(), connect_timeout=2) as proxy:
        unreachable = connect(proxy.url)
        try:
            with pytest.raises(redis.ConnectionError):
                unreachable.ping()
        finally:
            unreachable.close()
        assert proxy.join_idle(10)
    assert not proxy.threads()


def test_stop_closes_open_connections(redis_server: RedisServer) -> None:
    proxy = RedisProxy.for_url(redis_server.url).start()
    clients = [connect(proxy.url) for _ in range(5)]
    try:
        for each in clients:
            assert each.ping()
        sock = raw(proxy)
        sock.sendall(b"*2\r\n$4\r\nECHO\r\n$10\r\nabc")  # an incomplete command, left hanging
        assert proxy.active_connections() >= 5
        proxy.stop()
        assert not proxy.threads()
        assert recv_all(sock) == b""
        sock.close()
        with pytest.raises(redis.ConnectionError):
            clients[0].ping()
    finally:
        for each in clients:
            each.close()
        proxy.stop()


@pytest.mark.integration
def test_for_url_keeps_password_and_database(tmp_path: Any) -> None:
    with RedisServer(directory=tmp_path, password="s3cret") as server:
        with RedisProxy.for_url(server.url.replace("/0", "/3")) as proxy:
            assert proxy.url == f"redis://:s3cret@127.0.0.1:{proxy.port}/3"
            through = connect(proxy.url)
            try:
                through.set("k", "v")
            finally:
                through.close()
        direct = redis.Redis.from_url(server.url.replace("/0", "/3"))
        try:
            assert direct.get("k") == b"v"
        finally:
            direct.close()
