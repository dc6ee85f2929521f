"""Secrets never printed: the redaction rules, and real workers and CLI runs grepped for them.

The matrix pins :mod:`distcrawl.model.redact` for every URL form distcrawl is given; the process
tests give a real password-protected redis-server (TCP and unix socket) and MongoDB to real
``scrapy crawl`` workers and the ``distcrawl`` command, then grep every byte they wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pymongo.errors import OperationFailure

from distcrawl import mongo
from distcrawl.model.connection import auth_refusal
from distcrawl.model.redact import (
    RedactedTraceback,
    is_secret_name,
    redact_error,
    redact_text,
    redact_url,
    redacted_exc_info,
    url_secrets,
)
from distcrawl.testing.mongo_server import MongoServer
from distcrawl.testing.redis_server import RedisServer
from distcrawl.testing.workers import ROOT, Worker
from tests.conftest import worker_settings
from tests.support import page_fetches

pytestmark = pytest.mark.timeout(180)

S = "s3cret"
#: the password of the real servers below: characters a URL must escape, and long enough
#: that finding it in a log cannot be a coincidence
SECRET = "Sup3r-S3cret-9f2c"
WRONG = "Wr0ng-Passw0rd-77aa"

# ---------------------------------------------------------------------- the rules

URLS = [
    # redis://, rediss://: userinfo, query options, IPv6
    ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
    ("redis://user:s3cret@host:6379/0", "redis://user:***@host:6379/0"),
    ("redis://:s3%40cr%2Fet@host/0", "redis://:***@host/0"),
    ("redis://:p@ss@host/0", "redis://:***@host/0"),
    ("redis://127.0.0.1:6379/0?password=s3cret", "redis://127.0.0.1:6379/0?password=***"),
    (
        "redis://h/0?socket_timeout=5&PassWord=s3cret&db=1",
        "redis://h/0?socket_timeout=5&PassWord=***&db=1",
    ),
    (
        "rediss://default:s3cret@[::1]:6380/2?ssl_cert_reqs=none",
        "rediss://default:***@[::1]:6380/2?ssl_cert_reqs=none",
    ),
    ("rediss://[2001:db8::1]:6380/0?pwd=s3cret", "rediss://[2001:db8::1]:6380/0?pwd=***"),
    ("redis://u:s3cret@[fe80::1%25eth0]:6379", "redis://u:***@[fe80::1%25eth0]:6379"),
    # unix://: the password only fits in the query (or an empty-host userinfo)
    ("unix:///run/redis.sock?password=s3cret&db=0", "unix:///run/redis.sock?password=***&db=0"),
    ("unix://:s3cret@/run/redis.sock?db=0", "unix://:***@/run/redis.sock?db=0"),
    ("unix:///run/redis.sock?db=0&passwd=s3cret", "unix:///run/redis.sock?db=0&passwd=***"),
    # mongodb://, mongodb+srv://: several hosts, secret options, options that only look so
    (
        "mongodb://crawler:s3cret@db1:27017,db2:27017/items?replicaSet=rs0&tls=true",
        "mongodb://crawler:***@db1:27017,db2:27017/items?replicaSet=rs0&tls=true",
    ),
    (
        "mongodb+srv://crawler:s3cret@cluster0.example.net/?retryWrites=true",
        "mongodb+srv://crawler:***@cluster0.example.net/?retryWrites=true",
    ),
    (
        "mongodb://u:p%40s3cret@db/?tls=true&tlsCertificateKeyFilePassword=s3cret",
        "mongodb://u:***@db/?tls=true&tlsCertificateKeyFilePassword=***",
    ),
    (
        "mongodb://db/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:s3cret",
        "mongodb://db/?authMechanism=MONGODB-AWS&authMechanismProperties=***",
    ),
    ("mongodb://[::1]:27017/?passwd=s3cret;w=1", "mongodb://[::1]:27017/?passwd=***;w=1"),
    # http(s):// Scrapyd nodes
    ("http://admin:s3cret@scrapyd:6800/", "http://admin:***@scrapyd:6800/"),
    (
        "https://node.example/api?api_key=s3cret&X-Auth-Token=s3cret&client_secret=s3cret&a=1",
        "https://node.example/api?api_key=***&X-Auth-Token=***&client_secret=***&a=1",
    ),
    ("http://h/#access_token=s3cret", "http://h/#access_token=***"),
    # no secret: byte for byte
    ("redis://127.0.0.1:6379/0", None),
    ("rediss://user@[::1]:6380/0?ssl_cert_reqs=required", None),
    ("unix:///run/redis.sock?db=0", None),
    ("mongodb://127.0.0.1:27017/?directConnection=true", None),
    ("mongodb://cn%3Dme@db:27017/?authMechanism=MONGODB-X509&authSource=%24external", None),
    ("https://scrapyd.example:6800/", None),
    ("127.0.0.1:6379", None),
    ("", None),
    # not readable one way only (an "@" past the host part): everything after the scheme
    ("mongodb://u:s3c?ret@db/items", "mongodb://***"),
    ("mongodb://u:s3c/ret@db/items", "mongodb://***"),
    ("rediss://user:s3c@ret/x@h:6380/1", "rediss://***"),
    ("redis://:s3c#ret@h/0", "redis://***"),
    # unparsable for urllib, still nothing shown
    ("redis://:s3cret@[::1/0", "redis://:***@[::1/0"),
    ("redis://:s3cret@host:port/0", "redis://:***@host:port/0"),
    ("user:s3cret@host:6379", "***"),
    ("host/0?password=s3cret", "host/0?password=***"),
]


@pytest.mark.parametrize(("url", "shown"), URLS)
def test_redact_url(url: str, shown: str | None) -> None:
    assert redact_url(url) == (url if shown is None else shown)
    assert S not in redact_url(url)
    # a URL inside a sentence is redacted the same way
    in_text = redact_text(f"cannot use {url} now")
    assert S not in in_text
    if "://" in url:
        assert in_text == f"cannot use {redact_url(url)} now"
    assert redact_url(redact_url(url)) == redact_url(url)


@pytest.mark.parametrize(
    ("text", "secrets", "shown"),
    [
        (
            "Error connecting to redis://:s3cret@h:6379/0.",
            (),
            "Error connecting to redis://:***@h:6379/0.",
        ),
        (
            "bad (redis://h/0?password=s3cret) and 'mongodb://u:s3cret@db/x'",
            (),
            "bad (redis://h/0?password=***) and 'mongodb://u:***@db/x'",
        ),
        ("Connection(host=h,port=1,password=s3cret)", (), "Connection(host=h,port=1,password=***)"),
        ("user:s3cret@host:6379 is down", (), "user:***@host:6379 is down"),
        (
            "see http://h/a.html. Or (unix:///r.sock?pwd=s3cret).",
            (),
            "see http://h/a.html. Or (unix:///r.sock?pwd=***).",
        ),
        ("{'password': 's3cret'}", [S], "{'password': '***'}"),
        ("could not log in with s3cret", [S], "could not log in with ***"),
        ("Authentication failed.", [S], "Authentication failed."),
        ("WRONGPASS invalid username-password pair", [], None),
        ("authSource=admin, authMechanism=SCRAM-SHA-256", [], None),
        ("Error 111 connecting to 127.0.0.1:6379. Connection refused.", ["x" * 20], None),
        ("", [S], None),
    ],
)
def test_redact_text(text: str, secrets: list[str], shown: str | None) -> None:
    assert redact_text(text, secrets) == (text if shown is None else shown)


def test_known_secrets_are_found_in_every_spelling() -> None:
    url = "mongodb://crawler:p%40ss%3Aword@db/?tlsCertificateKeyFilePassword=k3y"
    found = url_secrets(url)
    assert {"p@ss:word", "p%40ss%3Aword", "k3y"} <= set(found)
    text = "auth failed for p@ss:word (p%40ss%3Aword), key k3y"
    assert redact_text(text, found) == "auth failed for *** (***), key ***"
    assert url_secrets("redis://127.0.0.1:6379/0") == []
    assert url_secrets(None) == []
    assert "s3c/ret" in url_secrets("redis://:s3c/ret@h/0")  # unreadable: still known


def test_errors_and_tracebacks_are_redacted() -> None:
    url = f"redis://:{S}@h/0"
    try:
        try:
            raise ValueError(f"first {S}")
        except ValueError as first:
            raise RuntimeError(f"while using {url}") from first
    except RuntimeError as exc:
        assert redact_error(exc, url) == "while using redis://:***@h/0"
        kind, value, tb = redacted_exc_info(exc, url)
    assert kind is RedactedTraceback and tb is None
    assert "RuntimeError: while using redis://:***@h/0" in str(value)
    assert "ValueError: first ***" in str(value)  # the chained cause, redacted too
    assert S not in str(value)


def test_secret_names() -> None:
    secret = ["password", "PWD", "passwd", "x_auth_token", "API_KEY", "client_secret"]
    public = ["authSource", "authmechanism", "db", "user", "USER_AGENT", "REDIS_URL", "ssl"]
    assert all(is_secret_name(n) for n in secret)
    assert not any(is_secret_name(n) for n in public)


def test_auth_refusals_are_told_apart_from_outages() -> None:
    password = "Redis refused the password"
    assert auth_refusal(redis.AuthenticationError("invalid password")) == password
    assert auth_refusal(redis.ResponseError("WRONGPASS invalid username-password")) == password
    assert auth_refusal(redis.ResponseError("NOAUTH Authentication required.")) == password
    assert auth_refusal(redis.exceptions.NoPermissionError("NOPERM no")) == (
        "Redis refused the user's permissions"
    )
    assert auth_refusal(redis.ConnectionError("Error 111 connecting")) is None
    assert auth_refusal(redis.ResponseError("ERR syntax")) is None
    assert mongo.auth_refusal(OperationFailure("Authentication failed.", 18)) == (
        "MongoDB refused the credentials"
    )
    assert mongo.auth_refusal(OperationFailure("not authorized", 13)) == (
        "MongoDB refused the user's permissions"
    )
    assert mongo.auth_refusal(OperationFailure("other", 2)) is None


# ---------------------------------------------------------------------- real servers


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory for a unix socket (tmp_path can pass the ~100-byte limit)."""
    path = Path(tempfile.mkdtemp(prefix="dcr-"))
    try:
        yield path
    finally:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


@pytest.fixture
def secret_redis(tmp_path: Path, socket_dir: Path) -> Iterator[RedisServer]:
    """A redis-server that wants SECRET, on TCP and on a unix socket, with a user
    ``reader`` (password SECRET) that may only read."""
    server = RedisServer(
        directory=tmp_path / "redis", password=SECRET, unixsocket=socket_dir / "r.sock"
    ).start()
    try:
        with server.client() as admin:
            admin.acl_setuser(
                "reader",
                enabled=True,
                passwords=[f"+{SECRET}"],
                categories=["+@read"],
                commands=["+ping", "+hello", "+auth"],
                keys=["*"],
            )
        yield server
    finally:
        server.stop()


def query_url(server: RedisServer, password: str = SECRET) -> str:
    """The password as a query option: redis-py's form for options and unix sockets."""
    return f"redis://127.0.0.1:{server.port}/0?password={password}"


@pytest.mark.integration
def test_redis_py_reads_the_password_from_the_query(secret_redis: RedisServer) -> None:
    for url in (query_url(secret_redis), secret_redis.unix_url):
        with redis.Redis.from_url(url) as client:
            assert client.ping()
    for url in (query_url(secret_redis, WRONG), secret_redis.unix_url.replace(SECRET, WRONG)):
        with redis.Redis.from_url(url) as client, pytest.raises(redis.RedisError) as raised:
            client.ping()
        assert auth_refusal(raised.value) == "Redis refused the password"
    with redis.Redis(host="127.0.0.1", port=secret_redis.port) as client:
        with pytest.raises(redis.RedisError) as raised:
            client.ping()  # NOAUTH: no password at all
        assert auth_refusal(raised.value) == "Redis refused the password"
    reader = f"redis://reader:{SECRET}@127.0.0.1:{secret_redis.port}/0"
    with redis.Redis.from_url(reader) as client:
        with pytest.raises(redis.RedisError) as raised:
            client.lpush("site:start_urls", "http://a.example/")
        assert auth_refusal(raised.value) == "Redis refused the user's permissions"


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """``distcrawl`` as a separate process running this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "distcrawl.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=str(ROOT),
    )


def assert_no_secret(*outputs: str) -> None:
    for output in outputs:
        for secret in (SECRET, WRONG):
            assert secret not in output, output


@pytest.mark.integration
@pytest.mark.parametrize("form", ["query", "unix"])
def test_cli_never_prints_the_password(secret_redis: RedisServer, form: str) -> None:
    good = query_url(secret_redis) if form == "query" else secret_redis.unix_url
    wrong = good.replace(SECRET, WRONG)

    pushed = cli("--redis-url", good, "push", "site", "http://a.example/")
    status = cli("--redis-url", good, "--json", "status", "site")
    assert pushed.returncode == 0 and status.returncode == 0, pushed.stderr + status.stderr
    assert '"start_urls": 1' in status.stdout
    refused = cli("--redis-url", wrong, "status", "site")
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"error: Redis refused the password at {redact_url(wrong)}")
    assert "cannot reach" not in refused.stderr
    no_perm = cli(
        "--redis-url",
        f"redis://reader:{SECRET}@127.0.0.1:{secret_redis.port}/0",
        "push",
        "site",
        "http://b.example/",
    )
    assert no_perm.returncode == 1
    assert "error: Redis refused the user's permissions at redis://reader:***@" in no_perm.stderr
    secret_redis.stop()
    down = cli("--redis-url", good, "status", "site")
    assert down.returncode == 3
    assert down.stderr.startswith(f"error: cannot reach Redis at {redact_url(good)}: ")
    for run in (pushed, status, refused, no_perm, down):
        assert_no_secret(run.stdout, run.stderr)


def secret_worker(tmp_path: Path, index: int, url: str, **settings: object) -> Worker:
    return Worker(
        index,
        redis_url=url,
        settings=worker_settings(settings),
        log_path=tmp_path / f"worker-{index}.log",
    ).start()


def worker_output(worker: Worker) -> str:
    return worker.log() + worker.log_path.with_suffix(".stderr").read_text(errors="replace")


@pytest.mark.parametrize("form", ["query", "unix"])
def test_worker_never_logs_the_password(
    secret_redis: RedisServer, demo_site, tmp_path: Path, form: str
) -> None:
    good = query_url(secret_redis) if form == "query" else secret_redis.unix_url
    site = demo_site(pages=20)
    with secret_redis.client() as client:
        client.lpush("site:start_urls", site.url + "/")
    # in the environment (as deployed) and on the command line (``-s``), where Scrapy could
    # echo it among the overridden settings
    crawled = secret_worker(tmp_path, 1, good, DISTCRAWL_IDLE_TIMEOUT=2, REDIS_URL=good)
    assert crawled.wait(120) == 0, crawled.log()[-3000:]
    assert len(page_fetches(site)) == 21
    assert f"distcrawl frontier 'site' on {redact_url(good)}" in crawled.log()
    assert "password=***" in crawled.log()

    refused = secret_worker(tmp_path, 2, good.replace(SECRET, WRONG))
    try:
        # no retry mends a wrong password: the worker says so and stops, exit code 1
        # (never the password in what it says: below)
        assert refused.wait(60) == 1, refused.log()[-3000:]
        assert "Redis refused the password" in refused.log(), refused.log()[-3000:]
    finally:
        refused.stop()
    assert "Redis unreachable" not in refused.log()

    secret_redis.stop()
    down = secret_worker(tmp_path, 3, good)
    try:
        assert down.wait_for_log("Redis unreachable at"), down.log()[-3000:]
    finally:
        down.stop()
    for worker in (crawled, refused, down):
        assert_no_secret(worker_output(worker))


def test_worker_never_logs_the_mongo_password(
    secret_redis: RedisServer, demo_site, tmp_path: Path
) -> None:
    server = MongoServer(directory=tmp_path / "mongo").start()
    try:
        server.enable_auth("crawler", SECRET)
        site = demo_site(pages=10)
        with secret_redis.client() as client:
            client.lpush("site:start_urls", site.url + "/")
        worker = Worker(
            1,
            redis_url=query_url(secret_redis),
            settings=worker_settings({"DISTCRAWL_IDLE_TIMEOUT": 2}),
            log_path=tmp_path / "worker-mongo.log",
            mongo_uri=server.uri,
        ).start()
        assert worker.wait(120) == 0, worker.log()[-3000:]
        with server.client() as client:
            assert client.distcrawl["site"].count_documents({}) == 11
        assert f"at {redact_url(server.uri)}" in worker.log()
        assert "mongodb://crawler:***@127.0.0.1" in worker.log()
    finally:
        server.stop()
    assert_no_secret(worker_output(worker))
