"""distcrawl's modules import each other without a circle.

A circle means neither module can be read (or changed) without the other, and Python only
copes with it by the order modules happen to be loaded in. The graph is built from the source
(the AST of every module), not by importing: imports at module level and inside functions
count, those under ``if TYPE_CHECKING:`` do not (mypy reads them, Python never runs them).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import distcrawl

ROOT = Path(distcrawl.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str) -> Iterator[str]:
    """The dotted names a module's code imports (a ``from x import y`` yields ``x.y`` and
    ``x``: y may be a module or a name in x), skipping ``if TYPE_CHECKING:`` bodies."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module
            for alias in node.names:
                yield f"{module}.{alias.name}"
        todo.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """Module -> the distcrawl modules it imports (a package counts as its __init__)."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        # a module's own packages are initialised before it runs: importing them is no edge
        ancestors = {name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)}
        graph[name] = {
            target
            for target in _imports(tree, package)
            if target in files and target != name and target not in ancestors
        }
    # importing a.b.c runs a/__init__ and a/b/__init__ first
    for name in list(graph):
        for target in list(graph[name]):
            parts = target.split(".")
            for n in range(1, len(parts)):
                parent = ".".join(parts[:n])
                if parent in files and parent != name and not name.startswith(parent + "."):
                    graph[name].add(parent)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_checker_finds_a_circle_and_ignores_type_checking_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from distcrawl.model.frontier import Frontier\n"
        "def f():\n    from distcrawl.model import keys\n"
    )
    found = set(_imports(tree, "distcrawl"))
    assert "distcrawl.model.frontier" not in found
    assert "distcrawl.model.keys" in found


def test_distcrawl_has_no_import_cycle():
    graph = import_graph()
    assert (
        "distcrawl.model.frontier" in graph
        and "distcrawl.model.keys" in graph["distcrawl.model.frontier"]
    )
    assert cycles(graph) == []


def test_no_module_imports_a_name_as_itself():
    """``from m import X as X`` is how a module re-exports a name it does not define: the
    compatibility alias of a path never released (0.1.0 is unreleased). Import it from m."""
    aliases = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [a.name for a in node.names if a.asname == a.name.rpartition(".")[2]]
                aliases += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names]
    assert aliases == []
