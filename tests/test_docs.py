"""The docs agree with the code, without starting anything.

The settings reference (docs/settings.md) has exactly one entry per setting distcrawl reads,
each in one shape (``### NAME``, Type, Default, what it does, an example), and its defaults are
the code's. The Scrapy settings and environment variables the code reads are listed on the same
page. The README's links point at files that exist. The site itself is built with
``mkdocs build --strict`` by .ci/test.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings, default_settings

from distcrawl.config import DistcrawlConfig
from distcrawl.mongo import MongoConfig

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "distcrawl"
SETTINGS_PAGE = ROOT / "docs" / "settings.md"

#: ``settings.get*("NAME"``, ``_get(settings, "NAME"``, ``_optional_*(settings, "NAME"`` and
#: ``settings["NAME"]`` (not an assignment to it)
_READ = re.compile(
    r"(?:\bsettings\.get\w*|\b_get|\b_optional_\w+)\(\s*(?:settings\s*,\s*)?\"([A-Z][A-Z0-9_]*)\""
    r"|\bsettings\[\s*\"([A-Z][A-Z0-9_]*)\"\s*\](?!\s*=[^=])"
)
#: ``os.environ.get("NAME"``, ``os.environ["NAME"]``, ``os.environ.pop("NAME"`` ... and the
#: module constants that name a variable (``NODES_ENV = "DISTCRAWL_SCRAPYD_NODES"``)
_ENV = re.compile(
    r"\bos\.environ(?:\.\w+\(|\[)\s*\"([A-Z][A-Z0-9_]*)\""
    r"|^[A-Z_]*_ENV\s*=\s*\"([A-Z][A-Z0-9_]*)\"",
    re.MULTILINE,
)
_ENTRY = re.compile(r"^### ([A-Z][A-Z0-9_]*)\s*$", re.MULTILINE)
_DEFAULT = re.compile(r"^- \*\*Default:\*\* `([^`]+)`", re.MULTILINE)

#: DISTCRAWL_ names in the code that are neither settings nor environment variables
NOT_SETTINGS = {
    # the layout field it names (the shard count) has no setting yet: always 1
    "DISTCRAWL_SHARDS",
}

#: Scrapy's settings; CONCURRENT_REQUESTS_PER_IP is deprecated since Scrapy 2.19 and no longer
#: listed by its default_settings module, but still read by Scrapy and by distcrawl
SCRAPY_SETTINGS = frozenset(
    {name for name in dir(default_settings) if name.isupper()} | {"CONCURRENT_REQUESTS_PER_IP"}
)


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _read_settings() -> dict[str, set[str]]:
    """Setting name -> the modules that read it."""
    found: dict[str, set[str]] = {}
    for path in _sources():
        for match in _READ.finditer(path.read_text(encoding="utf-8")):
            name = match.group(1) or match.group(2)
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def _own(names: dict[str, set[str]] | set[str]) -> set[str]:
    """distcrawl's settings: those Scrapy does not define."""
    return {name for name in names if name not in SCRAPY_SETTINGS}


def _page() -> str:
    return SETTINGS_PAGE.read_text(encoding="utf-8")


def _entries() -> dict[str, str]:
    """``### NAME`` entry -> its text, up to the next heading."""
    text = _page()
    out: dict[str, str] = {}
    matches = list(_ENTRY.finditer(text))
    for match in matches:
        rest = text[match.end() :]
        following = re.search(r"^#{1,3} ", rest, re.MULTILINE)
        body = rest[: following.start()] if following else rest
        assert match.group(1) not in out, f"{match.group(1)} has two entries in settings.md"
        out[match.group(1)] = body
    return out


def _section(title: str) -> str:
    text = _page()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_the_scan_finds_the_settings_it_should() -> None:
    # the regular expressions above are the test's weak point: they must keep finding reads
    # written in each style the code uses
    read = _read_settings()
    for name in (
        "REDIS_URL",  # _get(settings, ...)
        "DISTCRAWL_RECLAIM_INTERVAL",  # _get( over several lines
        "DISTCRAWL_IDLE_TIMEOUT",  # _optional_float
        "DISTCRAWL_ALLOWED_CALLBACKS",  # _optional_names
        "DISTCRAWL_MONITOR_ENABLED",  # crawler.settings.getbool
        "DISTCRAWL_METRICS_HOST",  # crawler.settings.get
        "DISTCRAWL_MONGO_COLLECTIONS",  # settings.getdict
        "MONGO_URI",
        "ITEM_PIPELINES",  # settings["..."]
    ):
        assert name in read, name
    assert len(_own(read)) >= 55


def test_every_setting_the_code_reads_has_an_entry() -> None:
    entries = _entries()
    missing = {
        name: sorted(modules)
        for name, modules in sorted(_read_settings().items())
        if name not in SCRAPY_SETTINGS and name not in entries
    }
    assert not missing, f"read by the code, no entry in docs/settings.md: {missing}"


def test_every_entry_is_a_setting_the_code_reads() -> None:
    read = _own(_read_settings())
    unread = sorted(set(_entries()) - read)
    assert not unread, f"documented in docs/settings.md, read nowhere in distcrawl/: {unread}"


def test_every_entry_has_the_same_shape() -> None:
    problems = []
    for name, body in _entries().items():
        lines = [line for line in body.strip().splitlines() if line.strip()]
        if not lines or not lines[0].startswith("- **Type:** "):
            problems.append(f"{name}: first line is not '- **Type:** ...'")
        if len(lines) < 2 or not lines[1].startswith("- **Default:** "):
            problems.append(f"{name}: second line is not '- **Default:** ...'")
        prose = [line for line in lines[2:] if not line.startswith(("```", "- **"))]
        if not prose:
            problems.append(f"{name}: no text saying what it does")
        examples = re.findall(r"^```(?:python|sh)\n(.+?)^```$", body, re.MULTILINE | re.DOTALL)
        if not examples:
            problems.append(f"{name}: no example (a python or sh code block)")
        elif not any(name in example for example in examples):
            problems.append(f"{name}: its example does not set it")
    assert not problems, "\n".join(problems)


def _documented_defaults() -> dict[str, Any]:
    """Entries whose default is a Python literal (`30`, `None`, `["http", "https"]`);
    defaults written as words or expressions ("the spider name") are left out."""
    out = {}
    for name, body in _entries().items():
        match = _DEFAULT.search(body)
        if match is None:
            continue
        try:
            out[name] = ast.literal_eval(match.group(1))
        except (ValueError, SyntaxError):
            continue
    return out


def _parsed(settings: dict[str, Any]) -> tuple[Any, Any]:
    base = Settings()
    base.setdict(settings, priority="project")
    return DistcrawlConfig.from_settings(base), MongoConfig.from_settings(base)


def test_documented_defaults_parse_to_the_defaults() -> None:
    """Setting a setting to its documented default changes nothing: the parsed config is the
    one of a project that does not set it."""
    defaults = _documented_defaults()
    assert len(defaults) >= 45, sorted(defaults)
    unset = _parsed({})
    wrong = {name: value for name, value in defaults.items() if _parsed({name: value}) != unset}
    assert not wrong, f"docs/settings.md gives defaults the code does not use: {wrong}"


def _module(path: Path) -> Any:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return importlib.import_module(".".join(p for p in parts if p != "__init__"))


def _literal_defaults_in_code() -> list[tuple[str, Any, str]]:
    """(name, default, where) for every read whose default is a literal, a module constant or
    a settings record's field default: ``_get(settings, "NAME", DEFAULT, ...)`` and
    ``settings.get*("NAME", DEFAULT)``."""
    out = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id == "_get" and len(node.args) >= 3:
                name_node, default_node = node.args[1], node.args[2]
            elif (
                isinstance(func, ast.Attribute)
                and func.attr.startswith("get")
                and len(node.args) >= 2
                and (
                    (isinstance(func.value, ast.Name) and func.value.id == "settings")
                    or (isinstance(func.value, ast.Attribute) and func.value.attr == "settings")
                )
            ):
                name_node, default_node = node.args[0], node.args[1]
            else:
                continue
            if not (isinstance(name_node, ast.Constant) and isinstance(name_node.value, str)):
                continue
            # a record's own defaults: ``cls.serializer``, ``DistcrawlConfig.seen``,
            # ``RetrySettings.jitter``
            if (
                isinstance(default_node, ast.Call)
                and isinstance(default_node.func, ast.Name)
                and default_node.func.id in ("list", "tuple")
                and len(default_node.args) == 1
            ):
                default_node = default_node.args[0]
            if isinstance(default_node, ast.Attribute) and isinstance(default_node.value, ast.Name):
                owner = default_node.value.id
                record = DistcrawlConfig if owner == "cls" else getattr(_module(path), owner, None)
                if not isinstance(record, type):
                    continue  # a local variable's attribute
                value = getattr(record, default_node.attr)
                out.append((name_node.value, value, f"{path.relative_to(ROOT)}:{node.lineno}"))
                continue
            try:
                value = ast.literal_eval(default_node)
            except ValueError:
                if not isinstance(default_node, ast.Name):
                    continue  # an expression, e.g. another setting's value
                if not hasattr(_module(path), default_node.id):
                    continue  # a local variable
                value = getattr(_module(path), default_node.id)
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            out.append((name_node.value, value, where))
    return out


def _same(documented: Any, code: Any) -> bool:
    """Equal as a user reads them: a list in the docs is the code's tuple, 30 is 30.0."""
    if isinstance(documented, list | tuple) and isinstance(code, list | tuple):
        return list(documented) == list(code)
    if isinstance(documented, bool) or isinstance(code, bool):
        return documented is code  # True is not 1 in the docs
    return bool(documented == code)


def test_documented_defaults_are_the_defaults_written_in_the_code() -> None:
    """The same check, for settings no config object parses (the monitor reads its own)."""
    documented = _documented_defaults()
    compared = 0
    wrong = []
    for name, value, where in _literal_defaults_in_code():
        if name in SCRAPY_SETTINGS or name not in documented or value is None:
            continue  # None: unset, as the caller decides (a default of its own follows)
        compared += 1
        if not _same(documented[name], value):
            wrong.append(f"{name}: docs {documented[name]!r}, {where} {value!r}")
    assert compared >= 40
    assert not wrong, "\n".join(wrong)


def test_scrapy_settings_the_code_reads_are_listed() -> None:
    listed = _section("Scrapy settings distcrawl reads")
    read = set(_read_settings()) & SCRAPY_SETTINGS
    missing = sorted(name for name in read if f"`{name}`" not in listed)
    assert not missing, f"Scrapy settings read by distcrawl, not listed in settings.md: {missing}"


def test_environment_variables_the_code_reads_are_listed() -> None:
    listed = _section("Environment variables")
    found: set[str] = set()
    for path in _sources():
        for match in _ENV.finditer(path.read_text(encoding="utf-8")):
            found.add(match.group(1) or match.group(2))
    assert {"REDIS_URL", "DISTCRAWL_SCRAPYD_NODES", "DISTCRAWL_REDIS_SERVER"} <= found
    missing = sorted(name for name in found if f"`{name}`" not in listed)
    assert not missing, f"environment variables read by distcrawl, not in settings.md: {missing}"


def test_every_distcrawl_name_in_the_code_is_documented() -> None:
    """A DISTCRAWL_ name read some other way than the scan above recognises (a table, a
    constant) still has to be on the settings page, as a setting or an environment variable."""
    page = _page()
    documented = set(_entries()) | set(re.findall(r"`([A-Z][A-Z0-9_]*)`", page))
    names: set[str] = set()
    for path in _sources():
        names.update(re.findall(r"\bDISTCRAWL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text("utf-8")))
    missing = sorted(names - NOT_SETTINGS - documented)
    assert not missing, f"named in distcrawl/, on no line of docs/settings.md: {missing}"
    assert not NOT_SETTINGS - names, "NOT_SETTINGS names a name the code no longer has"


@pytest.mark.parametrize("document", ["README.md", "benchmarks/README.md"])
def test_relative_links_point_at_files(document: str) -> None:
    text = (ROOT / document).read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local
    base = (ROOT / document).parent
    broken = sorted(t for t in local if not (base / t).exists())
    assert not broken, f"{document} links to files that do not exist: {broken}"


USER_FACING = (
    "distcrawl.addon.Addon",
    "distcrawl.scheduler.Scheduler",
    "distcrawl.dupefilter.RedisDupeFilter",
    "distcrawl.retry.RetryMiddleware",
    "distcrawl.retry.CallbackRetryMiddleware",
    "distcrawl.robots.RobotsTxtMiddleware",
    "distcrawl.extensions.WorkerMonitor",
    "distcrawl.pipelines.MongoPipeline",
    "distcrawl.spiders.RedisSpider",
    "distcrawl.spiders.RedisCrawlSpider",
    "distcrawl.producer.Producer",
    "distcrawl.producer.AsyncProducer",
)


@pytest.mark.parametrize("path", USER_FACING)
def test_every_component_a_project_names_has_its_own_docstring(path: str) -> None:
    """The classes users put in settings or import: ``help()`` and API docs must say why
    each exists, not fall back to a base class's text."""
    from scrapy.utils.misc import load_object

    cls = load_object(path)
    assert "__doc__" in vars(cls) and (cls.__doc__ or "").strip(), path


def test_the_list_of_known_settings_is_the_settings_the_code_reads() -> None:
    """distcrawl.config.setting_names.KNOWN is what a misspelt setting is told apart from: a setting
    missing from it would be called misspelt at every start, a stale one never would."""
    from distcrawl.config.setting_names import KNOWN

    read = {name for name in _own(_read_settings()) if name.startswith("DISTCRAWL_")}
    assert sorted(read - KNOWN) == [], "read by the code, missing from setting_names.KNOWN"
    assert sorted(KNOWN - read) == [], "in setting_names.KNOWN, read nowhere in distcrawl/"
