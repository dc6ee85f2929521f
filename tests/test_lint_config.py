"""The pre-commit hooks are .ci/test's lint steps, command for command: a commit the hooks
let through is not refused by CI's lint, and a step added to one is added to the other."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pre_commit.clientlib import load_config

ROOT = Path(__file__).resolve().parent.parent


def ci_lint_steps() -> list[str]:
    """The ruff and mypy commands .ci/test runs, in order."""
    text = (ROOT / ".ci" / "test").read_text()
    return re.findall(r"^(\.venv/bin/(?:ruff|mypy) .+)$", text, flags=re.MULTILINE)


def hooks() -> list[dict[str, Any]]:
    # load_config validates the file as pre-commit does (a misspelt key or language fails)
    config = load_config(str(ROOT / ".pre-commit-config.yaml"))
    return [hook for repo in config["repos"] for hook in repo["hooks"]]


def test_the_hooks_run_the_lint_steps_of_ci_test() -> None:
    steps = ci_lint_steps()
    assert [s.split()[:2] for s in steps] == [
        [".venv/bin/ruff", "check"],
        [".venv/bin/ruff", "format"],
        [".venv/bin/mypy", "distcrawl"],
    ]
    assert [hook["entry"] for hook in hooks()] == steps


def test_the_hooks_use_the_project_venv_and_download_nothing() -> None:
    for hook in hooks():
        # a local hook of language `unsupported` runs its entry as is: no environment of
        # its own is built (nothing fetched), and the tools are the venv's, at CI's versions
        assert hook["language"] == "unsupported", hook["id"]
        assert hook["entry"].startswith(".venv/bin/"), hook["id"]
        # the whole tree, as CI checks it, whichever files the commit touches
        assert hook["pass_filenames"] is False, hook["id"]
        assert re.search(hook["files"], "pyproject.toml"), hook["id"]
        assert re.search(hook["files"], "distcrawl/scheduler.py"), hook["id"]
