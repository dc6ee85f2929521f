import pytest
import redis

from distcrawl.model.connection import RedisIO, make_redis, redact_url
from distcrawl.testing.redis_server import RedisServer


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("rediss://alice:s3cret@127.0.0.1:6380/2", "rediss://alice:***@127.0.0.1:6380/2"),
        ("redis://alice@127.0.0.1/0", "redis://alice@127.0.0.1/0"),
    ],
)
def test_redact_url_hides_passwords(url, shown):
    assert redact_url(url) == shown
    assert "s3cret" not in redact_url(url)


def test_make_redis_does_no_io():
    # nothing listens on port 1: a client must still be created without error
    client = make_redis("redis://127.0.0.1:1/0", socket_timeout=0.5)
    with pytest.raises(redis.ConnectionError):
        client.ping()


@pytest.mark.integration
def test_password_from_url_authenticates(tmp_path):
    with RedisServer(directory=tmp_path, password="s3cret") as server:
        assert make_redis(server.url).ping()
        bad = server.url.replace("s3cret", "wrong")
        with pytest.raises(redis.AuthenticationError):
            make_redis(bad).ping()


def test_tls_url_is_accepted():
    client = make_redis("rediss://user:pw@127.0.0.1:6380/1")
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["username"] == "user"
    assert kwargs["password"] == "pw"
    assert client.connection_pool.connection_class.__name__ == "SSLConnection"


def test_acl_user_from_url_authenticates(redis_server):
    admin = redis_server.client()
    admin.acl_setuser(
        "crawler", enabled=True, passwords=["+crawlpw"], keys=["site:*"], commands=["+@all"]
    )
    url = f"redis://crawler:crawlpw@127.0.0.1:{redis_server.port}/0"
    client = make_redis(url)
    assert client.acl_whoami() in ("crawler", b"crawler")
    assert "crawlpw" not in redact_url(url)


def test_auto_decides_on_connect_and_a_single_server_keeps_its_client(redis_server):
    """DISTCRAWL_REDIS_CLUSTER=auto: no client (no I/O) before connect(), which the
    scheduler runs on its Redis thread; a single server then gets the plain client."""
    io = RedisIO(redis_server.url, cluster=None)
    with pytest.raises(RuntimeError):
        io.client  # noqa: B018 - the property is the point
    client = io.connect()
    try:
        assert io.cluster is False and io.client is client
        assert type(client) is redis.Redis and client.ping()
    finally:
        client.close()


def test_auto_against_nothing_is_an_outage_not_a_bug():
    io = RedisIO("redis://127.0.0.1:1/0", socket_timeout=0.5, cluster=None)
    with pytest.raises(redis.ConnectionError):
        io.connect()
    assert io.cluster is None  # asked again at the next attempt
