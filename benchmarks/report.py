"""The printed table and the targets of issue 8, checked against the measured values.

Kept apart from the measuring code so that the JSON (the complete record) and the table
(what a reader looks at) cannot drift: the table is only ever rendered from the JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.table import num

Row = dict[str, Any]


COLUMNS: list[tuple[str, int, Callable[[Row, Row], str]]] = [
    ("configuration", 24, lambda r, b: str(r["label"])),
    ("pages/s", 8, lambda r, b: num(r["pages_per_s"], ".1f")),
    ("x scrapy", 8, lambda r, b: num(r["pages_per_s"] / b["pages_per_s"], ".2f")),
    ("dup", 4, lambda r, b: str(r["duplicates"])),
    ("miss", 5, lambda r, b: str(r["missing"])),
    ("cmd/pg", 7, lambda r, b: num(_redis(r, "commands"), ".2f")),
    ("evalsha/pg", 10, lambda r, b: num(_redis(r, "scripts"), ".3f")),
    ("RT/pg", 6, lambda r, b: num(_redis(r, "round_trips"), ".2f")),
    ("seen B/URL", 10, lambda r, b: num(r.get("seen_set", {}).get("bytes_per_url"), ".1f")),
    ("push->1st s", 11, lambda r, b: num(r["push_to_first_fetch_s"], ".3f")),
    ("RSS MiB", 7, lambda r, b: num(r["peak_rss_mib_max"], ".0f")),
    ("CPU ms/pg", 9, lambda r, b: num(r["cpu_ms_per_page"]["workers"], ".2f")),
    ("other CPU", 9, lambda r, b: num(r.get("background_cpu_cores"), ".2f")),
]


def _redis(row: Row, key: str) -> float | None:
    redis = row.get("redis")
    return None if redis is None else float(redis["per_page"][key])


def crawl_table(results: dict[str, Any]) -> str:
    rows: dict[str, Row] = results["configurations"]
    base = rows.get("scrapy") or next(iter(rows.values()))
    head = "  ".join(name.rjust(width) for name, width, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for row in rows.values():
        lines.append("  ".join(cell(row, base).rjust(width) for _, width, cell in COLUMNS))
    return "\n".join(lines)


def storage_table(storage: dict[str, Any]) -> str:
    lines = [
        f"{'':16}{'payload B':>10}{'queued B/req':>14}{'seen B/URL':>12}{'used_memory B/req':>19}"
    ]
    for name, row in storage.items():
        if not isinstance(row, dict) or "queue_bytes_per_request" not in row:
            continue
        lines.append(
            f"{name:16}{row['payload_bytes_per_request']:10.1f}"
            f"{row['queue_bytes_per_request']:14.1f}{row['seen_bytes_per_url']:12.1f}"
            f"{row['used_memory_bytes_per_request']:19.1f}"
        )
    return "\n".join(lines)


def protocol_table(protocol: dict[str, Any]) -> str:
    lines = [f"{'':30}{'sent/pg':>9}{'in scripts/pg':>15}{'RT/pg':>8}  top commands sent"]
    for row in protocol.values():
        top = ", ".join(f"{k} {v}" for k, v in list(row["client_commands"].items())[:5])
        lines.append(
            f"{row['label']:30}{row['client_commands_per_page']:9.2f}"
            f"{row['script_commands_per_page']:15.2f}"
            f"{row.get('round_trips_per_page', 0.0):8.2f}  {top}"
        )
    return "\n".join(lines)


def _target(
    name: str, measured: float | None, goal: str, limit: float, unit: str = "", note: str = ""
) -> Row:
    """``goal`` starts with ">=" for a floor, anything else means a ceiling of ``limit``."""
    if measured is None:
        shown, state = "n/a", "n/a"
    else:
        ok = measured >= limit if goal.startswith(">=") else measured <= limit
        shown, state = f"{measured:.3g}{unit}", "met" if ok else "NOT met"
    return {
        "target": name,
        "goal": goal,
        "measured": measured,
        "shown": shown,
        "status": state,
        "note": note,
    }


def _worst(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return max(known) if known else None


def _cpu_note(rows: dict[str, Row], a: str, b: str) -> str:
    """The same ratio from CPU per page, which other load on the machine barely moves."""
    r = _ratio(_get(rows, a, "pages_per_cpu_s"), _get(rows, b, "pages_per_cpu_s"))
    return "" if r is None else f"pages per CPU-second: {r:.2f}x"


def _get(rows: dict[str, Row], key: str, *path: str) -> Any:
    value: Any = rows.get(key)
    for part in path:
        if value is None:
            return None
        value = value.get(part)
    return value


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def targets(results: dict[str, Any]) -> list[Row]:
    """Issue 8's targets; each one names the measurement it is judged on."""
    rows: dict[str, Row] = results["configurations"]
    storage, protocol = results.get("storage", {}), results.get("protocol", {})
    pps = {k: _get(rows, k, "pages_per_s") for k in rows}
    out = []
    r = _ratio(pps.get("distcrawl-1"), pps.get("scrapy"))
    note = _cpu_note(rows, "distcrawl-1", "scrapy")
    out.append(_target("distcrawl 1 worker vs plain Scrapy", r, ">= 0.95x", 0.95, "x", note))
    for n in (1, 2):
        r = _ratio(pps.get(f"distcrawl-{n}"), pps.get(f"scrapy-redis-{n}"))
        name = f"distcrawl vs scrapy-redis, {n} worker{'s' if n > 1 else ''}"
        note = _cpu_note(rows, f"distcrawl-{n}", f"scrapy-redis-{n}")
        out.append(_target(name, r, ">= 1.4x", 1.4, "x", note))
    sent = _get(protocol, "distcrawl-1", "client_commands_per_page")
    out.append(_target("Redis commands sent per page", sent, "<= 2", 2))
    ours = [k for k in ("distcrawl-1", "distcrawl-2") if k in rows]
    delay = _worst([_get(rows, k, "push_to_first_fetch_s") for k in ours])
    out.append(_target("LPUSH to first fetch (worst)", delay, "<= 0.5 s", 0.5, " s"))
    bad = _worst([rows[k]["duplicates"] + rows[k]["missing"] for k in ours])
    out.append(_target("duplicates + missing (distcrawl)", bad, "0", 0))
    seen = _worst([_get(rows, k, "seen_set", "bytes_per_url") for k in ours])
    out.append(_target("seen-set bytes/URL, crawl", seen, "<= 60", 60, " B"))
    filled = _get(storage, "distcrawl", "seen_bytes_per_url")
    out.append(_target("seen-set bytes/URL, filled", filled, "<= 60", 60, " B"))
    r = _ratio(
        _get(storage, "distcrawl", "queue_bytes_per_request"),
        _get(storage, "scrapy-redis", "queue_bytes_per_request"),
    )
    out.append(_target("bytes/queued request vs scrapy-redis", r, "<= 0.5x", 0.5, "x"))
    bloom = _get(storage, "distcrawl bloom", "seen_bytes_per_url")
    out.append(_target("Bloom seen-set bytes/URL at 1e-6", bloom, "<= 4", 4, " B"))
    return out


def targets_table(rows: list[Row]) -> str:
    lines = [f"{'target':46}{'goal':>10}{'measured':>12}  {'status':9}note"]
    for row in rows:
        lines.append(
            f"{row['target']:46}{row['goal']:>10}{row['shown']:>12}  {row['status']:9}{row['note']}"
        )
    return "\n".join(lines)


LOAD_WARNING = 0.25  # CPUs used by other processes during a timed crawl


def load_warning(results: dict[str, Any]) -> str | None:
    """Pages/s compares crawls run one after the other: only valid on an otherwise idle box."""
    loads = [
        float(row.get("background_cpu_cores") or 0.0) for row in results["configurations"].values()
    ]
    worst = max(loads, default=0.0)
    if worst < LOAD_WARNING:
        return None
    return (
        f"WARNING: other processes used up to {worst:.2f} CPUs during the timed crawls "
        f"(column 'other CPU'); pages/s ratios are unreliable, CPU ms/page much less so."
    )
