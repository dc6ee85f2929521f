"""Scrapyd deployment: many jobs on several real Scrapyd nodes share one frontier.

The integration tests start two Scrapyd 1.6 servers on 127.0.0.1 (own directories, own
config, one with HTTP auth), deploy this project to both, and schedule ``site`` jobs with
``distcrawl scrapyd``. Pages per job come from the demo site's own request log (each job has
its own User-Agent); items from MongoDB itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.request import Request, urlopen

import pymongo
import pytest
import redis

from distcrawl import scrapyd
from distcrawl.cli import main
from distcrawl.demo.site import DemoSite
from distcrawl.scrapyd._egg import _BUILD_IGNORE
from distcrawl.scrapyd._launcher import _take_secrets
from distcrawl.scrapyd._nodes import _auth_header
from distcrawl.testing.mongo_server import MongoServer
from distcrawl.testing.redis_server import HOST, RedisServer, find_free_port
from tests.support import wait_until

ROOT = Path(__file__).resolve().parents[1]
REDIS_PASSWORD = "redis-pw-7f3a"
MONGO_PASSWORD = "mongo-pw-91c2"
NODE_USER, NODE_PASSWORD = "operator", "scrapyd-pw-44d8"
SECRETS = (REDIS_PASSWORD, MONGO_PASSWORD, NODE_PASSWORD)


# ---------------------------------------------------------------------- unit tests


def test_redaction_hides_passwords_and_keeps_the_rest():
    redact = scrapyd.redact_setting
    assert redact("REDIS_URL", "redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    # a "/" in the password: not readable one way only, so nothing after the scheme shows
    assert redact("REDIS_URL", "rediss://user:p@ss/w@h:6380/1") == "rediss://***"
    assert redact("REDIS_URL", "redis://h:6379/0") == "redis://h:6379/0"
    mongo = "mongodb://crawler:s3cret@h1:27017,h2:27017/db?replicaSet=rs&authSource=admin"
    assert redact("MONGO_URI", mongo) == (
        "mongodb://crawler:***@h1:27017,h2:27017/db?replicaSet=rs&authSource=admin"
    )
    assert redact("X", "mongodb://h/?password=abc&w=1") == "mongodb://h/?password=***&w=1"
    aws = "mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:t"
    assert redact("MONGO_URI", aws).endswith("authMechanismProperties=***")
    assert redact("PROXY_PASSWORD", "hunter2") == "***"
    assert redact("API_TOKEN", "abc") == "***"
    assert redact("USER_AGENT", "distcrawl-job-1") == "distcrawl-job-1"
    assert redact("DISTCRAWL_IDLE_TIMEOUT", "3") == "3"
    assert scrapyd.is_secret("REDIS_URL", "redis://:pw@h/0")
    assert not scrapyd.is_secret("USER_AGENT", "ua")
    argv = ["python", "-m", "x", "crawl", "site", "-s", "MONGO_URI=mongodb://u:pw@h/", "-a", "k=v"]
    assert scrapyd.redact_argv(argv)[6] == "MONGO_URI=mongodb://u:***@h/"
    assert scrapyd.redact_argv(argv)[8] == "k=v"


def test_nodes_from_urls_and_deploy_targets(tmp_path, monkeypatch):
    (tmp_path / "scrapy.cfg").write_text(
        "[settings]\ndefault = distcrawl.settings\n\n"
        "[deploy]\nurl = http://127.0.0.1:6800/\nproject = distcrawl\n\n"
        "[deploy:east]\nurl = http://10.0.0.1:6800/\nusername = east\n"
        "password = ${EAST_PASSWORD}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("EAST_PASSWORD", "from-env")
    nodes = scrapyd.parse_nodes("http://a:b@127.0.0.1:6801,east,default", "cli", "clipw")
    assert [n.url for n in nodes] == [
        "http://127.0.0.1:6801/",
        "http://10.0.0.1:6800/",
        "http://127.0.0.1:6800/",
    ]
    assert [(n.username, n.password) for n in nodes] == [
        ("a", "b"),
        ("east", "from-env"),
        ("cli", "clipw"),
    ]
    assert "b" not in repr(nodes[0]).replace("http", "")  # no password in reprs
    assert scrapyd.default_project(None) == "distcrawl"
    with pytest.raises(scrapyd.ConfigProblem, match="unknown node 'west'"):
        scrapyd.parse_nodes("west", None, None)
    with pytest.raises(scrapyd.ConfigProblem, match="listed twice"):
        scrapyd.parse_nodes("http://h:1/,http://h:1", None, None)


def test_plan_spreads_jobs_round_robin_and_expands_placeholders():
    nodes = [scrapyd.Node("http://a/"), scrapyd.Node("http://b/")]
    assert scrapyd.plan(nodes, 2, "run") == [
        (0, 1, "run-1-1"),
        (1, 1, "run-2-1"),
        (0, 2, "run-1-2"),
        (1, 2, "run-2-2"),
    ]
    assert scrapyd.expand("ua-{node}-{n} {job}", node=2, n=1, job="run-2-1") == "ua-2-1 run-2-1"


@pytest.mark.integration
def test_launcher_hides_secrets_from_argv_and_the_runner_puts_them_back(tmp_path):
    message = {
        "_project": "p",
        "_spider": "site",
        "_job": "j",
        "settings": {"REDIS_URL": "redis://:pw@h/0", "USER_AGENT": "ua"},
        "token": "abc",
        "allowed_domains": "example.com",
    }
    secrets = _take_secrets(message)
    assert secrets == {"settings": {"REDIS_URL": "redis://:pw@h/0"}, "args": {"token": "abc"}}
    assert message["settings"] == {"USER_AGENT": "ua"}
    assert "token" not in message and message["allowed_domains"] == "example.com"

    # the runner: secrets from the environment become options of the wrapped runner
    (tmp_path / "fake_runner.py").write_text("import json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        scrapyd.SECRETS_ENV: json.dumps(secrets),
        scrapyd.INNER_RUNNER_ENV: "fake_runner",
    }
    out = subprocess.run(
        [sys.executable, "-m", "distcrawl.scrapyd", "crawl", "site", "-s", "USER_AGENT=ua"],
        env=env,
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    assert json.loads(out) == [
        "crawl",
        "site",
        "-s",
        "USER_AGENT=ua",
        "-s",
        "REDIS_URL=redis://:pw@h/0",
        "-a",
        "token=abc",
    ]


def test_listjobs_redacts_pending_jobs():
    class Queue:
        def list(self):
            return [
                {
                    "name": "site",
                    "_job": "j1",
                    "settings": {"MONGO_URI": "mongodb://u:pw@h/", "USER_AGENT": "ua"},
                    "password": "x",
                }
            ]

    launcher = SimpleNamespace(processes={}, finished=[])
    root = SimpleNamespace(poller=SimpleNamespace(queues={"p": Queue()}), launcher=launcher)
    resource = scrapyd.ListJobs(root)
    data = resource.render_GET(SimpleNamespace(args={b"project": [b"p"]}))
    (pending,) = data["pending"]
    assert pending["settings"] == {"MONGO_URI": "mongodb://u:***@h/", "USER_AGENT": "ua"}
    assert pending["args"]["password"] == "***"


def test_an_old_or_missing_setuptools_is_one_line_before_any_build(tmp_path):
    """The build tool is checked against the project's [build-system] requires before the
    build starts: one line naming the version, the Python and what to install."""
    from packaging.specifiers import SpecifierSet

    from distcrawl.scrapyd import _egg

    assert _egg.required_setuptools(ROOT) == SpecifierSet(">=77")
    assert _egg.build_tool_problem(ROOT, "80.9.0") is None
    old = _egg.build_tool_problem(ROOT, "65.5.0")
    assert old is not None and "\n" not in old
    assert old.startswith(f"setuptools 65.5.0 of {sys.executable} does not satisfy setuptools>=77")
    assert old.endswith("pip install 'setuptools>=77,<81' (the distcrawl[scrapyd] extra pins it)")
    missing = _egg.build_tool_problem(ROOT, None)
    assert missing is not None and missing.startswith("setuptools is not installed for ")
    # no pyproject.toml, or one that names no setuptools: nothing to check before the build
    assert _egg.build_tool_problem(tmp_path, "65.5.0") is None
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools", "x y"]\n')
    assert _egg.build_tool_problem(tmp_path, "65.5.0") is None
    # a failure of the project's own code keeps its traceback
    assert _egg._build_failure("Traceback ...\nNameError: name 'x' is not defined\n", "80") is None
    # and the extra installs what the check asks for
    assert _egg.SETUPTOOLS in scrapyd_extra()


def scrapyd_extra() -> list[str]:
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["optional-dependencies"]["scrapyd"]


@pytest.mark.integration
def test_egg_is_built_outside_the_work_tree_and_runs_zipped(tmp_path):
    before = {p: p.stat().st_mtime for p in ROOT.glob("*.egg-info")}
    egg = scrapyd.build_egg(ROOT, tmp_path)
    assert not (ROOT / "setup.py").exists() and not (ROOT / "build").exists()
    assert {p: p.stat().st_mtime for p in ROOT.glob("*.egg-info")} == before
    assert scrapyd.egg_settings_module(egg) == "distcrawl.settings"
    names = zipfile.ZipFile(egg).namelist()
    assert {f"distcrawl/model/lua/{n}.lua" for n in ("commit", "lease", "renew", "requeue")} <= set(
        names
    )
    # the package, its Lua scripts included, imports straight from the zipped egg
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import distcrawl, distcrawl.model.lua as lua; "
        "print(distcrawl.__file__); print(len(lua.source('commit')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(egg)], capture_output=True, timeout=60, check=True
    ).stdout.decode()
    path, size = out.split()
    assert path.startswith(str(egg)) and int(size) > 100


def _run(cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**clean_env(), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _setuptools_of(venv: Path) -> str:
    code = "import importlib.metadata as m; print(m.version('setuptools'))"
    return _run([str(venv / "bin" / "python"), "-c", code], venv).stdout.strip()


def _old_setuptools(venv: Path) -> str:
    """What installs a setuptools older than 77 here: the wheel ensurepip bundles (what
    ``python -m venv`` put there on Python 3.11), else the index's."""
    code = (
        "import ensurepip, pathlib; "
        "print(*sorted((pathlib.Path(ensurepip.__file__).parent / '_bundled')"
        ".glob('setuptools-*.whl')))"
    )
    wheels = _run([str(venv / "bin" / "python"), "-c", code], venv).stdout.split()
    return wheels[0] if wheels else "setuptools<77"


@pytest.mark.integration
def test_deploy_builds_the_egg_in_a_fresh_venv_made_as_the_docs_say(tmp_path):
    """docs/scrapyd.md step 1 (``python3 -m venv``, ``pip install '.[scrapyd]'``) on a copy
    of the project, then ``distcrawl scrapyd deploy --build-egg`` with that venv's own
    command: the egg builds. With the build tool too old, then missing, the command fails
    with one clear line, no traceback."""
    src = tmp_path / "project"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*_BUILD_IGNORE))
    venv = tmp_path / "venv"
    started = time.monotonic()
    made = _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    assert made.returncode == 0, made.stderr
    fresh = _setuptools_of(venv)
    made_in = time.monotonic() - started
    pip = [str(venv / "bin" / "pip"), "install", "-q"]
    installed = _run([*pip, ".[scrapyd]"], src, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    print(
        f"fresh venv (setuptools {fresh or 'none'}) in {made_in:.1f}s, "
        f"pip install '.[scrapyd]' in {time.monotonic() - started - made_in:.1f}s: "
        f"setuptools {_setuptools_of(venv)}"
    )
    deploy = [str(venv / "bin" / "distcrawl"), "scrapyd", "deploy", "--build-egg"]
    egg = tmp_path / "distcrawl.egg"
    built = _run([*deploy, str(egg)], src, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    assert scrapyd.egg_settings_module(egg) == "distcrawl.settings"

    downgraded = _run([*pip, "--no-deps", _old_setuptools(venv)], src)
    assert downgraded.returncode == 0, downgraded.stderr[-3000:]
    old = _setuptools_of(venv)
    failed = _run([*deploy, str(tmp_path / "old.egg")], src)
    print(f"with setuptools {old}: {failed.stderr.strip()}")
    assert failed.returncode == 2
    assert failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr
    assert f"setuptools {old}" in failed.stderr and "setuptools>=77" in failed.stderr

    # a project whose pyproject.toml names no setuptools floor: what the build itself says
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "scrapy.cfg").write_text("[settings]\ndefault = bare_settings\n")
    (bare / "bare_settings.py").write_text("BOT_NAME = 'bare'\n")
    (bare / "pyproject.toml").write_text(
        '[project]\nname = "bare"\nversion = "1"\nlicense = "MIT"\n'
    )
    failed = _run([*deploy, str(tmp_path / "bare.egg")], bare)
    print(f"a project without a floor, setuptools {old}: {failed.stderr.strip()}")
    assert failed.returncode == 2
    assert failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr
    assert f"setuptools {old} cannot read pyproject.toml" in failed.stderr
    assert "`project.license`" in failed.stderr and "setuptools>=77" in failed.stderr

    removed = _run([str(venv / "bin" / "pip"), "uninstall", "-y", "-q", "setuptools"], src)
    assert removed.returncode == 0, removed.stderr[-3000:]
    failed = _run([*deploy, str(tmp_path / "none.egg")], src)
    print(f"without setuptools: {failed.stderr.strip()}")
    assert failed.returncode == 2
    assert failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr
    assert "setuptools is not installed" in failed.stderr


# ---------------------------------------------------------------------- real Scrapyd nodes


class ScrapydNode:
    """One ``scrapyd`` process on loopback in its own directory with its own scrapyd.conf.

    Scrapyd does not stop the crawl processes it started when it stops: :meth:`stop`
    ends them first, by PID (the node's child processes, read from /proc).
    """

    def __init__(
        self, directory: Path, env: dict[str, str], auth: tuple[str, str] | None = None
    ) -> None:
        self.directory = directory
        self.env = env
        self.auth = auth
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    @property
    def node(self) -> scrapyd.Node:
        user, password = self.auth or (None, None)
        return scrapyd.Node(self.url, user, password)

    def config(self) -> str:
        auth = f"username = {self.auth[0]}\npassword = {self.auth[1]}\n" if self.auth else ""
        return (
            "[scrapyd]\n"
            f"bind_address = {HOST}\nhttp_port = {self.port}\n{auth}"
            "poll_interval = 0.2\nmax_proc = 4\njobs_to_keep = 50\n"
            f"eggs_dir = {self.directory / 'eggs'}\nlogs_dir = {self.directory / 'logs'}\n"
            f"dbs_dir = {self.directory / 'dbs'}\n"
            "launcher = distcrawl.scrapyd.Launcher\n\n"
            "[services]\nlistjobs.json = distcrawl.scrapyd.ListJobs\n"
        )

    def start(self) -> ScrapydNode:
        self.directory.mkdir(parents=True, exist_ok=True)
        env = {
            **self.env,
            "HOME": str(self.directory),  # no ~/.scrapyd.conf or ~/.scrapy.cfg of the user
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        for _attempt in range(3):
            self.port = find_free_port()
            (self.directory / "scrapyd.conf").write_text(self.config())
            with open(self.directory / "scrapyd.log", "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "scrapyd"],
                    cwd=self.directory,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            if wait_until(self._ready, timeout=30, step=0.2):
                return self
            self._terminate()
        raise RuntimeError(f"scrapyd did not start: {self.log()[-3000:]}")

    def _ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return True  # exited: stop waiting
        try:
            return bool(scrapyd.call(self.node, "daemonstatus.json", timeout=2))
        except scrapyd.ScrapydError:
            return False

    def children(self) -> list[int]:
        """PIDs of the node's child processes (its crawl jobs)."""
        if self.proc is None:
            return []
        out = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == self.proc.pid:
                out.append(int(stat.parent.name))
        return out

    def stop(self) -> None:
        pids = self.children()
        for pid in pids:
            with_signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not zombie(pid)]
            time.sleep(0.1)
        for pid in pids:
            with_signal(pid, signal.SIGKILL)
        self._terminate()

    def _terminate(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def log(self) -> str:
        return (self.directory / "scrapyd.log").read_text(errors="replace")

    def job_log(self, job: str) -> str:
        path = self.directory / "logs" / "distcrawl" / "site" / f"{job}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def job_logs(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in (self.directory / "logs").rglob("*.log")
        )


def with_signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("REDIS_URL", "MONGO_URI", "SCRAPY_SETTINGS_MODULE", "SCRAPY_PROJECT"):
        env.pop(name, None)
    env["TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS"] = ""
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """Redis and MongoDB with passwords, and two Scrapyd nodes with the project deployed to
    both: node 1 has REDIS_URL and MONGO_URI in its environment; node 2 asks for HTTP auth
    and knows neither (its jobs get them per job)."""
    base = tmp_path_factory.mktemp("scrapyd")
    started: list[Any] = []
    try:
        server = RedisServer(directory=base / "redis", password=REDIS_PASSWORD).start()
        started.append(server)
        mongo = MongoServer(directory=base / "mongo").start()
        started.append(mongo)
        mongo.enable_auth("crawler", MONGO_PASSWORD)
        node1_env = {**clean_env(), "REDIS_URL": server.url, "MONGO_URI": mongo.uri}
        node1 = ScrapydNode(base / "node1", node1_env)
        started.append(node1)
        node1.start()
        node2 = ScrapydNode(base / "node2", clean_env(), auth=(NODE_USER, NODE_PASSWORD))
        started.append(node2)
        node2.start()
        # deploy targets as a user would write them (here in the user's scrapy.cfg)
        xdg = base / "xdg"
        xdg.mkdir()
        (xdg / "scrapy.cfg").write_text(
            f"[deploy:node1]\nurl = {node1.url}\n\n"
            f"[deploy:node2]\nurl = {node2.url}\nusername = {NODE_USER}\n"
            "password = ${NODE2_PASSWORD}\n"
        )
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(ROOT)
            mp.setenv("XDG_CONFIG_HOME", str(xdg))
            mp.setenv("NODE2_PASSWORD", NODE_PASSWORD)
            egg = base / "distcrawl.egg"
            had = {p: p.stat().st_mtime for p in ROOT.glob("*.egg-info")}
            assert main(["scrapyd", "deploy", "--build-egg", str(egg)]) == 0
            # node 1 with scrapyd-deploy itself, node 2 with distcrawl's command
            deployed = subprocess.run(
                [str(Path(sys.executable).with_name("scrapyd-deploy")), "node1", "--egg", egg],
                cwd=ROOT,
                env={**os.environ, "XDG_CONFIG_HOME": str(xdg)},
                capture_output=True,
                timeout=120,
            )
            assert deployed.returncode == 0, deployed.stderr.decode()
            assert '"spiders": 1' in deployed.stdout.decode()
            assert main(["scrapyd", "deploy", "node2"]) == 0  # builds its own egg
            assert not (ROOT / "setup.py").exists() and not (ROOT / "build").exists()
            assert {p: p.stat().st_mtime for p in ROOT.glob("*.egg-info")} == had
            yield SimpleNamespace(redis=server, mongo=mongo, nodes=(node1, node2))
    finally:
        for item in reversed(started):
            item.stop()


@pytest.fixture
def frontier(cluster) -> Iterator[redis.Redis]:
    """A fresh start: no frontier in Redis, no items in MongoDB."""
    client = cluster.redis.client()
    client.flushdb()
    with pymongo.MongoClient(cluster.mongo.uri, serverSelectionTimeoutMS=5000) as mongo:
        mongo.drop_database("distcrawl")
    try:
        yield client
    finally:
        client.close()


def cli(capsys, *argv: str) -> tuple[int, Any]:
    """``distcrawl --json scrapyd ...`` in-process: (exit code, parsed JSON output)."""
    code = main(["--json", "scrapyd", *argv])
    out, err = capsys.readouterr()
    for secret in SECRETS:
        assert secret not in out + err
    return code, json.loads(out) if out.strip() else None


def schedule_run(capsys, monkeypatch, cluster, prefix: str) -> list[str]:
    """Two ``site`` jobs per node: node 1's jobs take REDIS_URL and MONGO_URI from the node's
    environment; node 2's get them per job, read from this shell's environment."""
    monkeypatch.setenv("REDIS_URL", cluster.redis.url)
    monkeypatch.setenv("MONGO_URI", cluster.mongo.uri)
    common = [
        "--jobs-per-node",
        "2",
        "site",
        "--setting",
        "USER_AGENT=distcrawl-job-{job}",
        # room on the one local host for every job's prefetch (see conftest.worker_settings)
        "--setting",
        "DISTCRAWL_DOMAIN_CONCURRENCY=64",
        "--idle-timeout",
        "3",
    ]
    jobs = []
    per_job = ["--setting", "REDIS_URL", "--setting", "MONGO_URI"]
    for node, more in (("node1", []), ("node2", per_job)):
        code, out = cli(
            capsys, "schedule", "--nodes", node, "--job-prefix", f"{prefix}-{node}", *common, *more
        )
        assert code == 0 and not out["errors"], out
        jobs += [job["id"] for job in out["jobs"]]
    assert len(jobs) == 4
    return jobs


def statuses(capsys, prefix: str) -> dict[str, dict[str, Any]]:
    code, out = cli(capsys, "status", "--nodes", "node1,node2", "--run", prefix)
    assert code == 0, out
    return {job["id"]: job for job in out["jobs"]}


def wait_finished(capsys, prefix: str, jobs: list[str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        found = statuses(capsys, prefix)
        if all(found.get(j, {}).get("state") == "finished" for j in jobs):
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.5)


def pages_per_job(site: DemoSite, jobs: list[str]) -> tuple[Counter[str], Counter[str]]:
    """(fetches per page, fetched pages per job) of the expected pages, status 200."""
    expected = site.expected_pages()
    lines = [ln for ln in site.read_log() if ln.path in expected and ln.status == 200]
    per_job = Counter(ln.user_agent.removeprefix("distcrawl-job-") for ln in lines)
    assert set(per_job) <= set(jobs), per_job
    return Counter(ln.path for ln in lines), per_job


def raw_listjobs(node: ScrapydNode) -> str:
    request = Request(node.url + "listjobs.json?project=distcrawl")
    for name, value in _auth_header(node.node).items():
        request.add_header(name, value)
    with urlopen(request, timeout=10) as response:
        return response.read().decode()


def assert_no_secret_anywhere(cluster) -> None:
    for node in cluster.nodes:
        for where, text in (("scrapyd log", node.log()), ("job logs", node.job_logs())):
            for secret in SECRETS:
                assert secret not in text, f"{secret} in the {where} of {node.url}"
        listing = raw_listjobs(node)
        assert not any(secret in listing for secret in SECRETS)


def crawl_commands(cluster) -> list[str]:
    """Command lines of the running crawl processes of both nodes."""
    out = []
    for node in cluster.nodes:
        for pid in node.children():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue  # ended meanwhile
            text = cmdline.replace(b"\0", b" ").decode(errors="replace")
            if " crawl " in text:
                out.append(text)
    return out


def stored(uri: str) -> list[dict[str, Any]]:
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000) as client:
        return list(client.distcrawl["site"].find({}, {"url": 1}))


def assert_drained(client: redis.Redis) -> None:
    assert client.zcard("site:queue") == 0
    assert client.zcard("site:leases") == 0
    assert client.hlen("site:requests") == 0
    assert client.llen("site:dead") == 0


@pytest.mark.timeout(240)
def test_four_jobs_on_two_nodes_fetch_every_page_once(
    cluster, frontier, demo_site, capsys, monkeypatch
):
    site = demo_site(pages=1000)
    jobs = schedule_run(capsys, monkeypatch, cluster, "full")

    # while the jobs run, no secret is on a crawl process's command line
    assert wait_until(lambda: len(crawl_commands(cluster)) >= 4, timeout=30)
    for cmdline in crawl_commands(cluster):
        assert "-m distcrawl.scrapyd crawl site" in cmdline
        assert not any(secret in cmdline for secret in SECRETS), cmdline
    # work arrives once all four jobs have opened their spider (their first heartbeat), so
    # that a fast crawl cannot end before one of them starts
    assert wait_until(lambda: frontier.hlen("site:workers") >= 4, timeout=90)
    frontier.lpush("site:start_urls", site.url + "/")

    found = wait_finished(capsys, "full", jobs, timeout=150)
    assert {found[j]["reason"] for j in jobs} == {"finished"}, found
    fetched, per_job = pages_per_job(site, jobs)
    print("pages per job:", dict(sorted(per_job.items())))
    assert set(fetched) == site.expected_pages()  # none missing
    assert max(fetched.values()) == 1  # none fetched twice, across four jobs on two nodes
    for job in jobs:
        assert per_job[job] > 0, per_job  # every job took part
    assert_drained(frontier)

    docs = stored(cluster.mongo.uri)
    assert len(docs) == len(site.expected_pages())
    assert {d["url"] for d in docs} == site.expected_urls()
    for node in cluster.nodes:
        for job in jobs:
            log = node.job_log(job)
            if log:
                assert "ERROR" not in log, log[-3000:]
                assert "Spider closed (finished)" in log
    assert_no_secret_anywhere(cluster)


@pytest.mark.timeout(240)
def test_cancelling_a_job_mid_crawl_loses_nothing(
    cluster, frontier, demo_site, capsys, monkeypatch
):
    site = demo_site(pages=800, delay=0.1)  # slow pages: the cancel lands mid-crawl
    jobs = schedule_run(capsys, monkeypatch, cluster, "cancel")
    victim = next(j for j in jobs if "node2" in j)  # on the node with HTTP auth
    # the crawl starts once every job is up, or a job slow to start on a busy machine could
    # find it nearly done
    assert wait_until(lambda: frontier.hlen("site:workers") >= 4, timeout=90)
    frontier.lpush("site:start_urls", site.url + "/")

    def victim_busy() -> bool:
        return pages_per_job(site, jobs)[1][victim] >= 30

    assert wait_until(victim_busy, timeout=90), pages_per_job(site, jobs)[1]
    code, out = cli(capsys, "cancel", "--nodes", "node1,node2", victim)
    assert code == 0 and out["cancelled"] == [
        {"id": victim, "node": cluster.nodes[1].url, "prevstate": "running"}
    ], out
    cancelled_at = time.time()

    found = wait_finished(capsys, "cancel", jobs, timeout=150)
    assert found[victim]["reason"] == "shutdown"
    assert {found[j]["reason"] for j in jobs if j != victim} == {"finished"}, found
    log = cluster.nodes[1].job_log(victim)
    given_back = re.search(r"Frontier closed: (\d+) acknowledged, \d+ pushed, (\d+) leases", log)
    assert given_back, log[-3000:]
    fetched, per_job = pages_per_job(site, jobs)
    duplicates = sum(n - 1 for n in fetched.values())
    print(
        "pages per job:",
        dict(sorted(per_job.items())),
        "leases given back by the cancelled job:",
        given_back.group(2),
        "pages fetched twice:",
        duplicates,
    )
    assert set(fetched) == site.expected_pages(), "pages missing after the cancel"
    assert duplicates <= 16, duplicates  # at most what the cancelled job had in flight
    after = [ln for ln in site.read_log() if ln.time > cancelled_at + 5]
    assert not any(ln.user_agent.endswith(victim) for ln in after)
    assert_drained(frontier)
    docs = stored(cluster.mongo.uri)
    by_url = Counter(d["url"] for d in docs)
    by_id = Counter(d["_id"] for d in docs)
    extra = {
        "urls stored twice": [u for u, n in by_url.items() if n > 1],
        "ids stored twice": [i for i, n in by_id.items() if n > 1],
        "unexpected urls": sorted(set(by_url) - site.expected_urls()),
    }
    # each item exactly once; no /private/ page either (a job whose first lease batch held one
    # used to fetch it: Scrapy's robots.txt waiter bug, see distcrawl.robots)
    assert len(docs) == len(site.expected_pages()), extra
    assert {d["url"] for d in docs} == site.expected_urls(), extra
    assert_no_secret_anywhere(cluster)
