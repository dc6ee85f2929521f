"""The benchmarks' printed tables, rendered one way: fixed-width columns, the leading ones
(the setup, the configuration) left-aligned and the numbers right-aligned, a blank line
between the rows of two setups. The suites differ in their columns, never in the layout."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: a column: its heading, its width and what a row shows in it
Column = tuple[str, int, Callable[[dict[str, Any]], Any]]


def num(value: Any, fmt: str) -> str:
    """``value`` in format ``fmt``, or ``n/a`` where it was not measured."""
    return "n/a" if value is None else format(value, fmt)


def render(
    columns: Sequence[Column],
    rows: Iterable[dict[str, Any]],
    *,
    left: int = 2,
    group: str = "setup",
) -> str:
    """The table of ``rows``: a heading, a rule, a line a row, the first ``left`` columns
    left-aligned, a blank line where a row's ``group`` differs from the row before."""

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, (_, width, _)) in enumerate(zip(cells, columns, strict=True))
        )

    head = line([name for name, _, _ in columns])
    lines = [head, "-" * len(head)]
    previous = None
    for row in rows:
        if previous is not None and row[group] != previous:
            lines.append("")
        previous = row[group]
        lines.append(line([str(cell(row)) for _, _, cell in columns]))
    return "\n".join(lines)
