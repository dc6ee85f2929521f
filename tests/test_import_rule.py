"""The import rule of docs/development.md: which of distcrawl's packages may import which,
read from the AST of every module (imports at module level, in functions and under
TYPE_CHECKING alike), so that the layout keeps showing the architecture."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: what each group may import besides itself (docs/development.md, "The import rule")
ALLOWED = {
    "model": set(),
    "config": {"model"},
    "codec": {"model", "config"},
    "engine": {"model", "config", "codec"},
    "producer": {"model", "config", "codec"},
    "admin": {"model", "config", "codec", "producer"},
    "top": {"model", "config", "codec", "engine", "producer"},
    "apps": {"model", "config", "codec", "engine", "producer", "admin", "top"},
}
PACKAGES = ("model", "config", "codec", "engine", "producer", "admin")
#: the commands: distcrawl, python -m distcrawl.demo, distcrawl scrapyd, distcrawl web
APPS = ("cli", "demo", "scrapyd", "web")
#: what the data model never imports
FOREIGN = ("scrapy", "twisted")

#: edges the rule refuses that the code still has, each with what would remove it. Fixing
#: one fails test_every_import_follows_the_rule until its line here is deleted.
KNOWN: dict[tuple[str, str], str] = {
    # connection.py is the client factory (model) and RedisIO, the crawler's Redis thread
    # with Deferreds (engine): RedisIO and redis_io(crawler) belong in engine/
    ("distcrawl.model.connection", "distcrawl.engine._serial"): "RedisIO -> engine/",
    ("distcrawl.model.connection", "distcrawl.config"): "redis_io(crawler) -> engine/",
    ("distcrawl.model.connection", "scrapy"): "redis_io(crawler) -> engine/",
    # the dead-letter record shrinks a request too large to keep with serialize.py's
    # shrink_payload (msgpack only): it belongs with the record, in model/
    ("distcrawl.model.deadrecord", "distcrawl.codec.serialize"): "shrink_payload -> model/",
    # dupefilter.py is the Scrapy component (DUPEFILTER_CLASS) and the fingerprints the
    # seen-set holds (FINGERPRINT_BYTES, get_fingerprint, url_only, legacy_fingerprint,
    # scrapy_redis_fingerprint): the fingerprints belong in codec/, the component stays
    ("distcrawl.codec.entries", "distcrawl.dupefilter"): "fingerprints -> codec/",
    ("distcrawl.producer._sync", "distcrawl.dupefilter"): "fingerprints -> codec/",
    ("distcrawl.admin.importer", "distcrawl.dupefilter"): "fingerprints -> codec/",
    ("distcrawl.engine.intake", "distcrawl.dupefilter"): "fingerprints -> codec/",
    # the scheduler's parts hold the component itself (isinstance, its cache)
    ("distcrawl.engine.opening", "distcrawl.dupefilter"): "the engine holds the component",
    ("distcrawl.engine.report", "distcrawl.dupefilter"): "the engine holds the component",
    ("distcrawl.engine.pump", "distcrawl.dupefilter"): "the engine holds the component",
    # the engine sends distcrawl.signals.frontier_reset, a public name at the top level
    ("distcrawl.engine.pump", "distcrawl.signals"): "signals the engine sends",
    # a producer's entry is refused by the worker's rule: refused_scheme is codec, not batch
    ("distcrawl.codec.entries", "distcrawl.engine.batch"): "refused_scheme -> codec/",
    # migrate refuses to run while workers live: live_workers is a status read (model/)
    ("distcrawl.admin.migrate", "distcrawl.engine.liveness"): "live_workers -> model/",
    # the one pipelined script sender serves the batch runner and the producer's commits;
    # it fills the runner's BatchResult: the sending half belongs in model/
    ("distcrawl.producer._commit", "distcrawl.engine._batch_send"): "pipelined -> model/",
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def group_of(module: str) -> str:
    """The group of a distcrawl module, or the foreign package it is."""
    parts = module.split(".")
    if parts[0] != "distcrawl":
        return parts[0]
    first = parts[1] if len(parts) > 1 else ""
    if first in PACKAGES:
        return first
    if first in APPS:
        return "apps"
    return "top"


def imports(root: Path) -> dict[tuple[str, str], int]:
    """(importer, imported) -> line, for every import of a distcrawl module or of a foreign
    package (FOREIGN) by a module under ``root``/distcrawl."""
    modules = {module_name(p, root): p for p in sorted((root / "distcrawl").rglob("*.py"))}
    found: dict[tuple[str, str], int] = {}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{path}: a relative import (the layout uses absolute)")
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                # from distcrawl.model import keys: the module keys, not the package
                targets = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            else:
                continue
            for target in targets:
                top = target.split(".")[0]
                if top in FOREIGN:
                    target = top
                elif top != "distcrawl":
                    continue
                else:
                    while target not in modules and "." in target:
                        target = target.rsplit(".", 1)[0]
                if target != name:
                    found.setdefault((name, target), node.lineno)
    return found


def refused(root: Path) -> dict[tuple[str, str], int]:
    out = {}
    for (a, b), line in imports(root).items():
        ga, gb = group_of(a), group_of(b)
        if gb in FOREIGN:
            if ga == "model":
                out[(a, b)] = line
        elif gb != ga and gb not in ALLOWED[ga]:
            out[(a, b)] = line
    return out


def test_every_import_follows_the_rule() -> None:
    found = refused(ROOT)
    new = sorted(
        f"{a} -> {b} (line {line})" for (a, b), line in found.items() if (a, b) not in KNOWN
    )
    assert not new, "imports the rule of docs/development.md refuses:\n" + "\n".join(new)
    fixed = sorted(f"{a} -> {b}" for a, b in KNOWN if (a, b) not in found)
    assert not fixed, "no longer imported: delete from KNOWN:\n" + "\n".join(fixed)


def test_the_model_imports_neither_scrapy_nor_twisted() -> None:
    """Beyond the KNOWN exceptions, which all name what moves out to remove them."""
    found = {
        (a, b)
        for a, b in imports(ROOT)
        if group_of(a) == "model" and b in FOREIGN and (a, b) not in KNOWN
    }
    assert not found, sorted(found)


def test_each_package_holds_modules() -> None:
    """A package emptied by a move would pass the rule vacuously."""
    groups = {group_of(m) for m, _ in imports(ROOT)}
    assert set(PACKAGES) | {"top", "apps"} <= groups


def test_the_rule_refuses_what_it_says(tmp_path: Path) -> None:
    """The checker itself, on a made-up tree: each refused kind of edge is found."""
    files = {
        "distcrawl/__init__.py": "",
        "distcrawl/model/__init__.py": "",
        "distcrawl/model/keys.py": "import scrapy\nfrom distcrawl.engine import batch\n",
        "distcrawl/engine/__init__.py": "",
        "distcrawl/engine/batch.py": "from distcrawl.model.keys import K\n",
        "distcrawl/admin/__init__.py": "",
        "distcrawl/admin/doctor.py": "from distcrawl.model import keys\n",
        "distcrawl/scheduler.py": "def f():\n    from distcrawl.admin import doctor\n",
        "distcrawl/cli/__init__.py": "from distcrawl.admin import doctor\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert set(refused(tmp_path)) == {
        ("distcrawl.model.keys", "scrapy"),
        ("distcrawl.model.keys", "distcrawl.engine.batch"),
        ("distcrawl.scheduler", "distcrawl.admin.doctor"),
    }


#: dotted names in the docs that are no Python path: Celery task names, a file, a host
NOT_PATHS = {"distcrawl.push", "distcrawl.push_many", "distcrawl.egg", "distcrawl.site"}


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_dotted_path_in_the_docs_resolves() -> None:
    """A module moved by the layout is named by its new path everywhere users read."""
    pages = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    named = {
        match: page.name
        for page in pages
        for match in re.findall(
            r"(?<![\w./-])distcrawl(?:\.[A-Za-z_]\w*)+", page.read_text(encoding="utf-8")
        )
    }
    broken = sorted(
        f"{d} ({page})" for d, page in named.items() if d not in NOT_PATHS and not _resolves(d)
    )
    assert len(named) > 10, named
    assert not broken, broken


@pytest.mark.parametrize("module", sorted(PACKAGES))
def test_each_package_says_why_it_is_apart(module: str) -> None:
    assert (importlib.import_module(f"distcrawl.{module}").__doc__ or "").strip()
