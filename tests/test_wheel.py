"""The release a stranger installs: the sdist and the wheel that ``python -m build`` makes.

They are built from a copy of the checkout (nothing is written into it), offline
(``--no-isolation``: the build backend comes from this venv), and must pass ``twine check``.
The wheel must hold the package data distcrawl loads at run time (its Lua scripts, ``py.typed``)
and the entry points. Then the wheel is installed, with ``--no-index --no-deps``, into a fresh
venv that sees Scrapy, redis and pymongo through a ``.pth`` line to this venv's site-packages but
imports distcrawl from the wheel only. A new project made there by ``scrapy startproject``, with
only the README's ``ADDONS`` line and ``REDIS_URL`` added to its settings.py, crawls the demo site
with two ``scrapy crawl`` workers: every page fetched once, none missing, by the site's own log.
"""

from __future__ import annotations

import email
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import venv
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "distcrawl"
#: what never goes into a build: .gitignore's entries, and the repository itself
NOT_SOURCE = (
    ".git",
    ".venv",
    "__pycache__",
    "*.egg-info",
    "build",
    "dist",
    "site",
    ".demo",
    ".mypy_cache",
    ".ruff_cache",
    "results",
)
SPIDER = "follow"
#: the spider a newcomer writes: follows every link of every HTML page, stores nothing
SPIDER_SOURCE = """
import distcrawl
import scrapy
from scrapy.http import TextResponse


class FollowSpider(scrapy.Spider):
    name = "follow"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logger.info("distcrawl imported from %s", distcrawl.__file__)

    def parse(self, response):
        if isinstance(response, TextResponse):
            yield from response.follow_all(css="a")
"""


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path
    version: str


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """``python -m build`` of a copy of the checkout, offline; the sdist, then the wheel built
    from the sdist, as a release is made."""
    src = tmp_path_factory.mktemp("src") / "distcrawl"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    out = src.parent / "dist"
    started = time.monotonic()
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    print(f"python -m build: {time.monotonic() - started:.1f}s")
    (wheel,) = out.glob("distcrawl-*-py3-none-any.whl")
    (sdist,) = out.glob("distcrawl-*.tar.gz")
    version = wheel.name.split("-")[1]
    return Dist(wheel=wheel, sdist=sdist, version=version)


def test_sdist_and_wheel_pass_twine_check(dist: Dist) -> None:
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dist.sdist), str(dist.wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout


def test_wheel_holds_the_package_data_and_the_entry_points(dist: Dist) -> None:
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
        info = f"distcrawl-{dist.version}.dist-info"
        metadata = email.message_from_bytes(wheel.read(f"{info}/METADATA"))
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    lua = {path.relative_to(ROOT).as_posix() for path in PACKAGE.glob("model/lua/*.lua")}
    assert len(lua) > 10, lua
    assert lua <= names, sorted(lua - names)
    assert "distcrawl/py.typed" in names
    # the web console's pages, script and styles (distcrawl web serves them from the package)
    console = {
        path.relative_to(ROOT).as_posix()
        for pattern in ("web/templates/*.html", "web/static/*")
        for path in PACKAGE.glob(pattern)
    }
    assert len(console) >= 6 and console <= names, sorted(console - names)
    sources = {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py")}
    assert sources <= names, sorted(sources - names)  # the demo and the spiders too
    assert not {name for name in names if name.startswith("tests/") or "__pycache__" in name}
    assert f"{info}/licenses/LICENSE" in names

    assert "distcrawl = distcrawl.cli:main" in entry_points
    assert "[scrapy]" in entry_points and "settings = distcrawl.settings" in entry_points
    assert metadata["Name"] == "distcrawl"
    assert metadata["Requires-Python"] == ">=3.10"
    assert metadata["License-Expression"] == "BSD-3-Clause"
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert "## Use it in your project" in metadata.get_payload()
    classifiers = set(metadata.get_all("Classifier"))
    for classifier in ("Framework :: Scrapy", "Typing :: Typed", "Topic :: Internet :: WWW/HTTP"):
        assert classifier in classifiers
    requires = " ".join(metadata.get_all("Requires-Dist"))
    for dependency in ("scrapy", "redis", "msgpack", "itemadapter", "pymongo"):
        assert dependency in requires

    with tarfile.open(dist.sdist) as sdist:
        members = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md", "LICENSE", "distcrawl/py.typed"} <= members
    assert lua <= members, sorted(lua - members)
    assert console <= members, sorted(console - members)


# ---------------------------------------------------------------- a stranger's project


def _fresh_venv(directory: Path, dist: Dist) -> Path:
    """A venv with the wheel installed offline and without its dependencies, which it finds
    through a ``.pth`` line to this venv's site-packages: a plain directory on sys.path, so
    this venv's own .pth files (the editable install's finder among them) are not run."""
    venv.create(directory, with_pip=False)
    python = directory / "bin" / "python"
    installed = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(python), "install"),
            *("--no-index", "--no-deps", "--no-cache-dir", "--disable-pip-version-check"),
            str(dist.wheel),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    )
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (purelib / "_distcrawl_test_dependencies.pth").write_text("\n".join(ours) + "\n")
    return python


def _env(fresh: Path) -> dict[str, str]:
    """This process's environment less what would point a command at the checkout."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in {"PYTHONPATH", "SCRAPY_SETTINGS_MODULE", "SCRAPY_PROJECT", "REDIS_URL", "MONGO_URI"}
    }
    env.update(
        {
            "VIRTUAL_ENV": str(fresh),
            "PATH": os.pathsep.join([str(fresh / "bin"), env.get("PATH", "")]),
            "PYTHONNOUSERSITE": "1",
            "TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS": "",  # tldextract's bundled list, offline
        }
    )
    return env


def _readme_line(prefix: str) -> str:
    """The line of the README's "Use it in your project" that starts with ``prefix``."""
    section = (ROOT / "README.md").read_text().split("## Use it in your project", 1)[1]
    return next(line for line in section.splitlines() if line.startswith(prefix))


class _Worker:
    def __init__(self, python: Path, project: Path, env: dict[str, str], index: int) -> None:
        self.log_path = project / f"worker-{index}.log"
        self.agent = f"wheel-worker-{index}"
        settings = {
            "USER_AGENT": self.agent,
            "LOG_FILE": str(self.log_path),
            # the startproject template's politeness (1 s apart, one at a time) would make a
            # test of minutes; a crawl of one's own site may lift it on the command line
            "DOWNLOAD_DELAY": "0",
            "CONCURRENT_REQUESTS_PER_DOMAIN": "4",
            # long enough for the other worker to start before the push, which comes once both
            # are up (an empty frontier is already "out of work"); the crawl then ends by it
            "DISTCRAWL_IDLE_TIMEOUT": "8",
            "DISTCRAWL_IDLE_POLL_MAX": "0.5",  # and closes soon after its timeout
        }
        command = [str(python), "-m", "scrapy", "crawl", SPIDER]
        for name, value in settings.items():
            command += ["-s", f"{name}={value}"]
        self.stderr = open(project / f"worker-{index}.stderr", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            command, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=self.stderr
        )

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """By PID: SIGTERM, then SIGKILL if it has not exited within 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.stderr.close()


@pytest.fixture
def stranger(tmp_path: Path, dist: Dist) -> tuple[Path, dict[str, str]]:
    fresh = tmp_path / "fresh-venv"
    python = _fresh_venv(fresh, dist)
    return python, _env(fresh)


def test_a_new_scrapy_project_crawls_with_two_workers_from_the_wheel(
    tmp_path, dist, stranger, demo_site, redis_server
):
    started = time.monotonic()
    python, env = stranger
    fresh = python.parent.parent

    def run(program: Path, *args: str, cwd: Path = tmp_path) -> str:
        done = subprocess.run(
            [str(program), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    imported = run(
        python,
        "-c",
        "import distcrawl, importlib.metadata as m, scrapy; "
        "print(distcrawl.__file__); print(m.version('distcrawl')); print(scrapy.__file__)",
    ).splitlines()
    assert Path(imported[0]).is_relative_to(fresh), imported  # the wheel, not the checkout
    assert imported[1] == dist.version
    assert not Path(imported[2]).is_relative_to(fresh)  # dependencies: from this venv

    run(python, "-m", "scrapy", "startproject", "newcomer")
    project = tmp_path / "newcomer"
    settings = project / "newcomer" / "settings.py"
    addons = _readme_line("ADDONS = ")
    assert addons == 'ADDONS = {"distcrawl.Addon": 0}'
    assert _readme_line("REDIS_URL = ").startswith('REDIS_URL = "redis://')
    with settings.open("a") as fh:
        fh.write(f"\n{addons}\nREDIS_URL = {redis_server.url!r}\n")
    (project / "newcomer" / "spiders" / f"{SPIDER}.py").write_text(SPIDER_SOURCE)

    site = demo_site(pages=40, links=5, delay=0.05)
    pool = [_Worker(python, project, env, index) for index in (1, 2)]
    try:
        for worker in pool:  # both up and idle before the push: the frontier is shared
            assert wait_until(
                lambda w=worker: "Frontier: 0 queued" in w.log() or w.proc.poll() is not None,
                timeout=60,
            )
            assert worker.proc.poll() is None, worker.log()[-3000:]
        # the installed console script, run in the project as a newcomer would: no
        # --redis-url and no $REDIS_URL, so it must find the REDIS_URL of settings.py
        pushed = run(fresh / "bin" / "distcrawl", "push", SPIDER, site.url + "/", cwd=project)
        assert "pushed 1, refused 0" in pushed, pushed
        for worker in pool:  # DISTCRAWL_IDLE_TIMEOUT: they close once the crawl is done
            assert wait_until(lambda w=worker: w.proc.poll() is not None, timeout=60)
            assert worker.proc.returncode == 0, worker.log()[-3000:]
    finally:
        for worker in pool:
            worker.stop()

    lines = site.read_log()
    fetched = Counter(line.path for line in lines if line.status == 200)
    expected = site.expected_pages()
    assert expected <= set(fetched), sorted(expected - set(fetched))  # none missing
    pages = Counter({path: n for path, n in fetched.items() if path != "/robots.txt"})
    assert max(pages.values()) == 1, pages.most_common(3)  # none fetched twice
    assert not [line for line in lines if line.path.startswith("/private/")]  # robots.txt obeyed
    by_worker = Counter(line.user_agent for line in lines if line.path in expected)
    assert set(by_worker) == {worker.agent for worker in pool}, by_worker  # both crawled
    for worker in pool:
        log = worker.log()
        assert f"distcrawl imported from {fresh}" in log
        assert "Spider closed (finished)" in log
        assert not re.search(r"\] (ERROR|CRITICAL):|Traceback", log), log[-3000:]
    print(
        f"wheel crawl: {sum(pages.values())} pages by {dict(by_worker)} "
        f"in {time.monotonic() - started:.1f}s"
    )
