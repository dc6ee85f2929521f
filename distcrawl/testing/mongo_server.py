"""A throwaway MongoDB wire-protocol server (SecantusDB) for tests and the quick start.

Tests talk to a real server, not a fake client: the pipeline's behaviour on write errors,
outages and restarts is only worth testing against something that really refuses,
disconnects and comes back. ``secantusd-py`` (``pip install secantusdb``) speaks the
MongoDB wire protocol on top of WiredTiger and keeps its data across restarts.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import pymongo
from pymongo.errors import PyMongoError

from distcrawl.testing.process import HOST, ServerProcess

logger = logging.getLogger(__name__)


def _default_binary() -> str:
    # the venv's own script first: CI runs `.venv/bin/python` without the venv on PATH
    beside = Path(sys.executable).parent / "secantusd-py"
    if beside.exists():
        return str(beside)
    return shutil.which("secantusd-py") or "secantusd-py"


MONGO_BINARY = os.environ.get("DISTCRAWL_MONGO_SERVER") or _default_binary()


@dataclass(eq=False, repr=False, kw_only=True)
class MongoServer(ServerProcess):
    """One ``secantusd-py`` subprocess on loopback, with a storage directory that may outlive it.

    ``standalone=True`` makes drivers see a standalone server (connect with
    ``directConnection=true``, which :attr:`uri` does); ``False`` advertises a single-node
    replica set named ``secantus`` (see :attr:`replica_set_uri`).
    """

    NAME = "secantusd-py"
    START_TIMEOUT = 30.0
    STOP_TIMEOUT = 10.0
    READY_POLL = 0.1
    DIRECTORY_PREFIX = "distcrawl-mongo-"
    LOG_NAME = "secantusd.log"

    standalone: bool = True
    auth: bool = False
    #: (certificate file, key file, CA file) to serve TLS
    tls: tuple[str, str, str] | None = None
    binary: str = MONGO_BINARY
    extra_args: Sequence[str] = ()
    #: (user, password) the readiness check and :meth:`client` use when ``auth`` is on
    credentials: tuple[str, str] | None = field(init=False, default=None)

    # ------------------------------------------------------------------ properties

    @property
    def address(self) -> str:
        if self.port is None:
            raise RuntimeError("mongo server not started")
        return f"{HOST}:{self.port}"

    @property
    def uri(self) -> str:
        """``mongodb://127.0.0.1:PORT/?directConnection=true`` (with TLS options if served)."""
        return f"mongodb://{self._userinfo()}{self.address}/?{self._options(direct=True)}"

    @property
    def replica_set_uri(self) -> str:
        """The URI that discovers the single-node replica set (``standalone=False`` only)."""
        options = "&".join(filter(None, ["replicaSet=secantus", self._options(direct=False)]))
        return f"mongodb://{self._userinfo()}{self.address}/?{options}"

    @property
    def storage_path(self) -> Path:
        assert self.directory is not None
        return Path(self.directory, "data")

    def client(self, **kwargs: Any) -> pymongo.MongoClient[dict[str, Any]]:
        """A new client to :attr:`uri`; the caller closes it."""
        kwargs.setdefault("serverSelectionTimeoutMS", 5000)
        return pymongo.MongoClient(self.uri, **kwargs)

    def _userinfo(self) -> str:
        if self.credentials is None:
            return ""
        user, password = self.credentials
        return f"{quote_plus(user)}:{quote_plus(password)}@"

    def _options(self, *, direct: bool) -> str:
        options = ["directConnection=true"] if direct else []
        if self.tls is not None:
            options += ["tls=true", f"tlsCAFile={quote_plus(self.tls[2])}"]
        if self.credentials is not None:
            options.append("authSource=admin")
        return "&".join(options)

    # ------------------------------------------------------------------ lifecycle

    def command(self) -> list[str]:
        assert self.port is not None and self.directory is not None
        cmd = [self.binary, "--host", HOST, "--port", str(self.port)]
        cmd += ["--storage-path", str(self.storage_path), "--log-level", "WARNING"]
        if self.standalone:
            cmd.append("--standalone")
        if self.auth:
            cmd.append("--auth")
        if self.tls is not None:
            cert, key, ca = self.tls
            cmd += ["--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-file", ca]
        return [*cmd, *self.extra_args]

    def enable_auth(self, user: str, password: str) -> MongoServer:
        """Create a root user, then restart with ``--auth``; :attr:`uri` then carries them."""
        with self.client() as client:
            client.admin.command(
                "createUser", user, pwd=password, roles=[{"role": "root", "db": "admin"}]
            )
        self.auth = True
        self.credentials = (user, password)
        return self.restart()

    # ------------------------------------------------------------------ internals

    def _spawn_options(self) -> dict[str, Any]:
        self.storage_path.mkdir(parents=True, exist_ok=True)
        return {"cwd": self.directory}

    def _ping(self) -> bool:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            self.uri, serverSelectionTimeoutMS=500, connectTimeoutMS=500
        )
        try:
            client.admin.command("ping")
            return True
        except PyMongoError:
            return False
        finally:
            client.close()
