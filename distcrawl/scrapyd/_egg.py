"""The project's egg, built as ``scrapyd-deploy`` builds it but from a temporary copy, so that
the work tree gets no ``setup.py``, ``build/`` or ``*.egg-info``, and checked for the entry point
without which Scrapyd cannot run it."""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet

from distcrawl.scrapyd._nodes import ConfigProblem

#: what the ``scrapyd`` extra installs on the machine that deploys (pyproject.toml): from 77
#: setuptools reads an SPDX ``project.license``; 81 removed the pkg_resources Scrapyd imports
SETUPTOOLS = "setuptools>=77,<81"
#: how to get it, in the one line a build tool's problem gets
INSTALL_HINT = f"pip install '{SETUPTOOLS}' (the distcrawl[scrapyd] extra pins it)"

_SETUP_PY = """\
# written by distcrawl scrapyd deploy into a temporary copy of the project
from setuptools import setup, find_packages

setup(
    name="project",
    version="1.0",
    packages=find_packages(),
    entry_points={"scrapy": ["settings = %(settings)s"]},
)
"""
#: not copied into the temporary build tree
_BUILD_IGNORE = (
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "venv",
    ".tox",
    ".nox",
    "node_modules",
    "build",
    "dist",
    "*.egg-info",
    "*.egg",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".scrapy",
    ".demo",
)


def project_root(start: str | os.PathLike[str] | None = None) -> Path:
    """The directory of the closest scrapy.cfg."""
    from scrapy.utils.conf import closest_scrapy_cfg

    cfg = closest_scrapy_cfg(str(start) if start is not None else ".")
    if not cfg:
        raise ConfigProblem("no scrapy.cfg here or above: run this inside the Scrapy project")
    return Path(cfg).resolve().parent


def _settings_module(root: Path) -> str:
    cfg = configparser.ConfigParser()
    cfg.read(root / "scrapy.cfg")
    module = cfg.get("settings", "default", fallback="")
    if not module:
        raise ConfigProblem(f"{root / 'scrapy.cfg'} has no [settings] default = MODULE")
    return module


def egg_settings_module(egg: Path) -> str | None:
    """The ``scrapy``/``settings`` entry point of an egg: what Scrapyd runs it with."""
    with zipfile.ZipFile(egg) as archive:
        try:
            text = archive.read("EGG-INFO/entry_points.txt").decode()
        except KeyError:
            return None
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(text)
    return cfg.get("scrapy", "settings", fallback=None)


def setuptools_version() -> str | None:
    """The setuptools of this Python (the one that builds the egg), None when it has none."""
    try:
        return importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return None


def required_setuptools(root: Path) -> SpecifierSet | None:
    """The setuptools versions the project's pyproject.toml asks for in ``[build-system]
    requires``; None when it names none (or cannot be read here: the build then says)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return None
    try:
        with open(root / "pyproject.toml", "rb") as handle:
            requires = tomllib.load(handle).get("build-system", {}).get("requires", [])
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        return None
    for text in requires if isinstance(requires, list) else []:
        try:
            requirement = Requirement(str(text))
        except InvalidRequirement:
            continue
        if requirement.name.lower() == "setuptools" and requirement.specifier:
            return requirement.specifier
    return None


def build_tool_problem(root: Path, installed: str | None) -> str | None:
    """Why the setuptools ``installed`` here (None: none) cannot build the project's egg,
    in one line; None when it can. A build started anyway would end in a traceback of
    setuptools' (an SPDX license read by a setuptools older than 77) or of Python's."""
    python = sys.executable
    if installed is None:
        return (
            f"setuptools is not installed for {python} (the egg is built with it): {INSTALL_HINT}"
        )
    wanted = required_setuptools(root)
    if wanted is not None and not wanted.contains(installed, prereleases=True):
        return (
            f"setuptools {installed} of {python} does not satisfy setuptools{wanted}, which "
            f"{root / 'pyproject.toml'} requires to build: {INSTALL_HINT}"
        )
    return None


def _build_failure(output: str, installed: str | None) -> str | None:
    """One line for a build that failed because of the build tool, None for another
    failure (the project's own setup.py, say: its traceback is the user's to read)."""
    if "No module named 'setuptools'" in output:
        return f"setuptools is not installed for {sys.executable}: {INSTALL_HINT}"
    for line in output.splitlines():
        if line.startswith("ValueError: invalid pyproject.toml config"):
            reason = line.removeprefix("ValueError: ").rstrip(".")
            return f"setuptools {installed} cannot read pyproject.toml ({reason}): {INSTALL_HINT}"
    return None


def build_egg(root: Path, out_dir: Path) -> Path:
    """Build the project's egg from a temporary copy, so the work tree gets no ``setup.py``,
    ``build/`` or ``*.egg-info``; the copy's own ``setup.py`` is used if it has one, else
    the one ``scrapyd-deploy`` would write. Fails if the egg lacks the entry point Scrapyd
    needs (a pyproject.toml ``[project]`` table makes setuptools ignore setup.py's)."""
    settings = _settings_module(root)
    installed = setuptools_version()
    problem = build_tool_problem(root, installed)
    if problem is not None:
        raise ConfigProblem(f"cannot build the egg: {problem}")
    with tempfile.TemporaryDirectory(prefix="distcrawl-egg-") as tmp:
        copy = Path(tmp, "project")
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns(*_BUILD_IGNORE), symlinks=True)
        if not (copy / "setup.py").exists():
            (copy / "setup.py").write_text(_SETUP_PY % {"settings": settings})
        dist = Path(tmp, "dist")
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            result = subprocess.run(
                [sys.executable, "setup.py", "-q", "bdist_egg", "-d", str(dist)],
                cwd=copy,
                env=env,
                capture_output=True,
                timeout=300,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigProblem(f"could not build the egg: {exc}") from None
        eggs = sorted(dist.glob("*.egg"))
        if result.returncode != 0 or not eggs:
            output = (result.stderr or result.stdout).decode("utf-8", "replace")
            problem = _build_failure(output, installed)
            if problem is not None:
                raise ConfigProblem(f"cannot build the egg: {problem}")
            raise ConfigProblem(f"could not build the egg:\n{output[-3000:]}")
        out_dir.mkdir(parents=True, exist_ok=True)
        egg = out_dir / eggs[0].name
        shutil.copyfile(eggs[0], egg)
    found = egg_settings_module(egg)
    if found != settings:
        raise ConfigProblem(
            f"the egg has no Scrapy settings entry point (Scrapyd could not run it); add to "
            f'pyproject.toml:\n\n[project.entry-points.scrapy]\nsettings = "{settings}"\n'
        )
    return egg
