"""The project's egg, built as ``scrapyd-deploy`` builds it but from a temporary copy, so that
the work tree gets no ``setup.py``, ``build/`` or ``*.egg-info``, and checked for the entry point
without which Scrapyd cannot run it."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from distcrawl.scrapyd._nodes import ConfigProblem

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


def build_egg(root: Path, out_dir: Path) -> Path:
    """Build the project's egg from a temporary copy, so the work tree gets no ``setup.py``,
    ``build/`` or ``*.egg-info``; the copy's own ``setup.py`` is used if it has one, else
    the one ``scrapyd-deploy`` would write. Fails if the egg lacks the entry point Scrapyd
    needs (a pyproject.toml ``[project]`` table makes setuptools ignore setup.py's)."""
    settings = _settings_module(root)
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
            output = (result.stderr or result.stdout).decode("utf-8", "replace")[-3000:]
            hint = ""
            if "No module named 'setuptools'" in output:
                hint = " (install setuptools<81, e.g. pip install 'distcrawl[scrapyd]')"
            raise ConfigProblem(f"could not build the egg{hint}:\n{output}")
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
