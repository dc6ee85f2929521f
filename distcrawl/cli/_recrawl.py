"""``distcrawl recrawl``: the crawl's revisits (DISTCRAWL_RECRAWL_INTERVAL): how many are
due and how late, per domain, and making a page's or a domain's revisits due now.

The reading and the writes are :mod:`distcrawl.model.revisits_admin`'s; this module parses the
arguments and prints."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, cast

from scrapy import Request

from distcrawl._commandline import EXIT_OK, EXIT_PARTIAL, _emit_json, _non_negative_int
from distcrawl.cli._common import Context, UsageError, _one_line, _project_settings, command_maker
from distcrawl.dupefilter import FINGERPRINT_BYTES, get_fingerprint
from distcrawl.model.frontier import wake_idle
from distcrawl.model.keys import FrontierKeys
from distcrawl.model.layout import class_path
from distcrawl.model.revisits_admin import (
    RevisitStatus,
    crawl_parts,
    make_domain_due,
    make_page_due,
    revisit_status,
)
from distcrawl.model.shards import shard_of_url
from distcrawl.producer import ProducerError

#: Scrapy's own fingerprinter, whose fingerprint of a plain GET get_fingerprint computes
SCRAPY_FINGERPRINTER = "scrapy.utils.request.RequestFingerprinter"

# ---------------------------------------------------------------------- status


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f}s"
    if value < 7200:
        return f"{value / 60:.1f}m"
    return f"{value / 3600:.1f}h"


def _status_text(status: RevisitStatus, limit: int) -> str:
    shards = f" ({status.shards} shards)" if status.shards > 1 else ""
    totals = status.totals
    lines = [
        f"revisits of {status.namespace!r}{shards}",
        f"  scheduled   {totals.scheduled:>10}   (waiting {totals.waiting}, "
        f"due in the revisit queue {totals.queued})",
        f"  due now     {totals.due:>10}",
        f"  next hour   {totals.next_hour:>10}",
        f"  most late   {_seconds(status.overdue_seconds):>10}   (of those still waiting)",
    ]
    if status.missing or status.unparsable:
        lines.append(
            f"  records missing {status.missing}, unparsable {status.unparsable} "
            "(not in the per-domain counts)"
        )
    rows = status.top(limit)
    if rows:
        lines.append(f"{'domain':<40} {'scheduled':>10} {'due':>8} {'next hour':>10}")
        for row in rows:
            lines.append(
                f"{_one_line(row.domain, 40):<40} {row.scheduled:>10} {row.due:>8} "
                f"{row.next_hour:>10}"
            )
    return "\n".join(lines)


def cmd_recrawl_status(args: argparse.Namespace, ctx: Context) -> int:
    status = revisit_status(ctx.client, ctx.keys(args.spider))
    if ctx.as_json:
        _emit_json(status.as_dict(args.limit))
        return EXIT_OK
    print(_status_text(status, args.limit))
    if len(status.domains) > args.limit:
        print(f"({len(status.domains) - args.limit} more domains; see --limit)", file=sys.stderr)
    return EXIT_OK


# ---------------------------------------------------------------------- now


def _targets(values: list[str]) -> list[tuple[str, str]]:
    """Each argument as ("url", URL) or ("domain", host); a usage error for what is neither,
    before anything is written."""
    out = []
    for value in values:
        text = value.strip()
        if "://" in text:
            try:
                Request(text)
            except ValueError as exc:
                raise UsageError(f"invalid URL {_one_line(text)!r}: {exc}") from None
            out.append(("url", text))
            continue
        domain = text.lower().rstrip(".")
        if not domain or any(c in domain for c in "/?#@ \t") or domain.startswith("."):
            raise UsageError(
                f"{_one_line(text)!r} is neither a URL (with its scheme) nor a domain name"
            )
        out.append(("domain", domain))
    return out


def _fingerprinter(
    args: argparse.Namespace, ctx: Context, keys: FrontierKeys
) -> Callable[[str], bytes]:
    """``url -> fingerprint`` exactly as the crawl's workers compute it: the project's
    spider and REQUEST_FINGERPRINTER_CLASS through the Producer (as ``push`` makes them);
    without the spider, Scrapy's own fingerprinter's through get_fingerprint, the worker's
    own shortcut. Refused when the crawl's layout record names another fingerprinter: the
    page would never be found."""
    recorded = cast("bytes | None", ctx.client.hget(keys.meta, "fingerprinter"))
    theirs = recorded.decode(errors="replace") if recorded is not None else None
    producer = ctx.producer(args.spider, _project_settings([]), target="start_urls")
    try:
        fingerprinter = producer.fingerprinter
    except ProducerError:
        fingerprinter = None
    mine = class_path(fingerprinter) if fingerprinter is not None else SCRAPY_FINGERPRINTER
    if theirs is not None and theirs != mine:
        raise UsageError(
            f"the crawl's REQUEST_FINGERPRINTER_CLASS is {theirs}, this project's {mine}: "
            "run the command in the crawl's project (scrapy.cfg or SCRAPY_SETTINGS_MODULE)"
        )
    if fingerprinter is None:
        return lambda url: get_fingerprint(url)[:FINGERPRINT_BYTES]
    return lambda url: producer.fingerprint(Request(url))


def cmd_recrawl_now(args: argparse.Namespace, ctx: Context) -> int:
    """Exit 0 when every argument had a revisit waiting to make due (or due already), else
    1: no revisit scheduled, or the page's is queued or being fetched already."""
    targets = _targets(args.targets)
    keys = ctx.keys(args.spider)
    parts = crawl_parts(ctx.client, keys)
    fingerprint: Callable[[str], bytes] | None = None
    if any(kind == "url" for kind, _ in targets):
        fingerprint = _fingerprinter(args, ctx, keys)
    results: list[dict[str, Any]] = []
    nothing = made_due = 0
    for kind, value in targets:
        if kind == "url":
            assert fingerprint is not None
            shard = parts[shard_of_url(value, len(parts))]
            page = make_page_due(ctx.client, shard, fingerprint(value))
            results.append({"url": value, "result": page.state, "shard": page.shard})
            if page.was_due_in is not None:
                results[-1]["was_due_in"] = page.was_due_in
            nothing += page.state in ("not_scheduled", "not_waiting")
            made_due += page.state == "made_due"
            if not ctx.as_json:
                print(_page_line(value, page.state, page.was_due_in))
        else:
            done = make_domain_due(ctx.client, parts, value)
            results.append(
                {"domain": value, "made_due": done.made_due, "already_due": done.already_due}
            )
            nothing += not (done.made_due or done.already_due)
            made_due += done.made_due
            if not ctx.as_json:
                print(
                    f"{value}: {done.made_due} revisits made due now, "
                    f"{done.already_due} due already"
                )
    # parked workers wait for the next revisit their last lease saw due, not for these
    wake_idle(ctx.client, keys, made_due)
    if ctx.as_json:
        _emit_json(results)
    return EXIT_PARTIAL if nothing else EXIT_OK


def _page_line(url: str, state: str, was_due_in: float | None) -> str:
    shown = _one_line(url)
    if state == "made_due":
        return f"{shown}: made due now (was due in {_seconds(was_due_in)})"
    if state == "already_due":
        return f"{shown}: due already, waiting for its domain's turn"
    if state == "not_waiting":
        return f"{shown}: its revisit is queued or being fetched already"
    return f"{shown}: no revisit scheduled"


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    command = command_maker(common)
    recrawl = commands.add_parser(
        "recrawl",
        parents=[common],
        help="revisits (DISTCRAWL_RECRAWL_INTERVAL)",
        description="revisits of pages already crawled (DISTCRAWL_RECRAWL_INTERVAL)",
    )
    actions = recrawl.add_subparsers(dest="recrawl_command", required=True, metavar="ACTION")
    status = command(
        actions,
        "status",
        cmd_recrawl_status,
        "revisits scheduled, due now, due within the hour and how late, per domain",
    )
    status.add_argument(
        "--limit",
        type=_non_negative_int,
        default=20,
        metavar="N",
        help="domains shown, most due first (default 20)",
    )
    now = command(
        actions,
        "now",
        cmd_recrawl_now,
        "make revisits due now: a URL's (with its scheme), or every one of a domain and its "
        "subdomains; exit 1 if an argument had none",
    )
    now.add_argument("targets", nargs="+", metavar="URL|DOMAIN")
