"""A throwaway Redis Cluster of three masters (no replicas) for tests: real processes.

Each node is a ``redis-server --cluster-enabled yes`` in a directory of its own; ``redis-cli
--cluster create`` assigns the slots, and ``start()`` returns once every node reports
``cluster_state:ok`` and agrees on the slot map (bounded waits). Stopped by PID.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

from distcrawl.testing.redis_server import HOST, REDIS_BINARY, find_free_port


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
START_TIMEOUT = 20.0


class RedisClusterNodes:
    def __init__(self, directory: Path, masters: int = 3, binary: str = REDIS_BINARY) -> None:
        self.directory = directory
        self.masters = masters
        #: the server every node runs (``redis-server``, or ``valkey-server`` for the tests
        #: marked ``valkey``); ``redis-cli --cluster`` speaks to either
        self.binary = binary
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def url(self, port: int) -> str:
        return f"redis://{HOST}:{port}/0"

    def node(self, port: int) -> redis.Redis:
        """A plain client of one node (no redirection); the caller closes it."""
        return redis.Redis(host=HOST, port=port, socket_timeout=5)

    def start(self) -> RedisClusterNodes:
        self.directory.mkdir(parents=True, exist_ok=True)
        while len(self.ports) < self.masters:
            port = find_free_port()
            # the cluster bus listens on port + 10000, which must exist and be free too
            if port in self.ports or port > 55535 or not _free(port + 10000):
                continue
            work = self.directory / str(port)
            work.mkdir()
            cmd = [self.binary, "--port", str(port), "--bind", HOST, "--dir", str(work)]
            cmd += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
            cmd += ["--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no"]
            log = open(work / "redis.log", "wb")  # noqa: SIM115 - kept for the process' life
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
            self.ports.append(port)
        for port in self.ports:
            self._wait(lambda p=port: self._ping(p), f"node {port} answers")
        nodes = [f"{HOST}:{p}" for p in self.ports]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *nodes, "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT,
        )
        self._wait(self._settled, "cluster_state:ok on every node")
        return self

    def add_replica(self, master: int) -> int:
        """Start one more node and make it a replica of the master at ``master``; returns its
        port once it has synced."""
        port = find_free_port()
        while port > 55535 or port in self.ports or not _free(port + 10000):
            port = find_free_port()
        work = self.directory / str(port)
        work.mkdir()
        cmd = [self.binary, "--port", str(port), "--bind", HOST, "--dir", str(work)]
        cmd += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
        cmd += ["--cluster-node-timeout", "1000", "--save", "", "--appendonly", "no"]
        log = open(work / "redis.log", "wb")  # noqa: SIM115 - kept for the process' life
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        self._wait(lambda: self._ping(port), f"node {port} answers")
        replica_of = ["--cluster-slave", "--cluster-master-id", self.node_id(master)]
        subprocess.run(
            [REDIS_CLI, "--cluster", "add-node", f"{HOST}:{port}", f"{HOST}:{master}", *replica_of],
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT,
        )

        def synced() -> bool:
            client = self.node(port)
            try:
                info = client.info("replication")
            except redis.RedisError:
                return False
            finally:
                client.close()
            return info.get("role") == "slave" and info.get("master_link_status") == "up"

        self._wait(synced, f"replica {port} of {master} in sync")
        return port

    def kill(self, port: int) -> None:
        """SIGKILL the node at ``port`` (a crash: its replica is promoted after the node
        timeout)."""
        for proc in self.procs:
            if any(arg == str(port) for arg in proc.args):  # type: ignore[union-attr]
                proc.kill()
                proc.wait(5)
                return
        raise LookupError(port)

    def is_master(self, port: int) -> bool:
        client = self.node(port)
        try:
            return bool(client.info("replication").get("role") == "master")
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    # ------------------------------------------------------------------ slots

    def flush(self) -> None:
        """Empty every node: a module shares one cluster, each test starts from nothing."""
        for port in self.ports:
            node = self.node(port)
            try:
                node.flushall()
            finally:
                node.close()

    def url_away_from(self, key: str) -> str:
        """The URL of a master that does not hold ``key``'s slot: a client there must follow
        MOVED to reach the crawl, as most workers of a real cluster do."""
        owner = self.owner(self.keyslot(key))
        return self.url(next(p for p in self.ports if p != owner))

    def keyslot(self, key: str | bytes) -> int:
        client = self.node(self.ports[0])
        try:
            return int(client.execute_command("CLUSTER", "KEYSLOT", key))
        finally:
            client.close()

    def owner(self, slot: int) -> int:
        """Port of the master serving ``slot``."""
        client = self.node(self.ports[0])
        try:
            for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        finally:
            client.close()
        raise LookupError(slot)

    def node_id(self, port: int) -> str:
        client = self.node(port)
        try:
            return str(client.execute_command("CLUSTER", "MYID").decode())
        finally:
            client.close()

    def keys_of(self, port: int) -> list[bytes]:
        client = self.node(port)
        try:
            return list(client.scan_iter(count=1000))
        finally:
            client.close()

    def migrate_slot(self, slot: int, target: int) -> int:
        """Move ``slot`` with its keys to the master at ``target`` as ``redis-cli --cluster
        reshard`` does: IMPORTING/MIGRATING, MIGRATE of the keys, SETSLOT NODE on every
        master. Returns how many keys moved."""
        source = self.owner(slot)
        src, dst = self.node(source), self.node(target)
        moved = 0
        try:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))
            while True:
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
                if not keys:
                    break
                src.execute_command("MIGRATE", HOST, target, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
            for port in self.ports:
                node = self.node(port)
                try:
                    node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", self.node_id(target))
                finally:
                    node.close()
        finally:
            src.close()
            dst.close()
        return moved

    # ------------------------------------------------------------------ internals

    def _ping(self, port: int) -> bool:
        client = self.node(port)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _settled(self) -> bool:
        for port in self.ports:
            client = self.node(port)
            try:
                info = client.execute_command("CLUSTER", "INFO").decode()
                slots = client.execute_command("CLUSTER", "SLOTS")
            except redis.RedisError:
                return False
            finally:
                client.close()
            if "cluster_state:ok" not in info or len(slots) != self.masters:
                return False
        return True

    def _wait(self, predicate: object, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if predicate():  # type: ignore[operator]
                return
            time.sleep(0.05)
        raise RuntimeError(f"Redis Cluster in {self.directory}: no {what} after {START_TIMEOUT}s")
