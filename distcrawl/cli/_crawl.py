"""The commands on the frontier itself: push, status, watch, domains, limit, pause, resume,
doctor, reset."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from distcrawl._commandline import EXIT_FULL, EXIT_OK, EXIT_PARTIAL, _emit_json, count_option
from distcrawl.cli._common import (
    Context,
    UsageError,
    _json_object,
    _one_line,
    _project_settings,
    _show_entry,
    command_maker,
    delete_confirmed,
    settings_option,
)
from distcrawl.engine.liveness import live_workers
from distcrawl.producer import Outcome

# ---------------------------------------------------------------------- push


def _input_lines(paths: Iterable[str]) -> Iterator[bytes]:
    """Entries of each file (``-`` is stdin) as bytes; blank and ``#`` lines skipped."""
    for path in paths:
        if path == "-":
            stream = getattr(sys.stdin, "buffer", None)
            lines: Iterable[bytes] = (
                stream if stream is not None else (s.encode() for s in sys.stdin)
            )
            yield from _entries_of(lines)
            continue
        try:
            with open(path, "rb") as handle:
                yield from _entries_of(handle)
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def _entries_of(lines: Iterable[bytes]) -> Iterator[bytes]:
    for line in lines:
        entry = line.strip()
        if entry and not entry.startswith(b"#"):
            yield entry


def _wrap(raw: bytes, priority: int | None, meta: dict[str, Any] | None) -> bytes:
    """A plain URL as the JSON object that adds ``--priority``/``--meta``; JSON entries
    keep their own fields and are pushed as they are."""
    if (priority is None and meta is None) or raw.lstrip().startswith(b"{"):
        return raw
    try:
        url = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return raw  # parse_entry refuses it with the right reason
    data: dict[str, Any] = {"url": url}
    if priority is not None:
        data["priority"] = priority
    if meta is not None:
        data["meta"] = meta
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def cmd_push(args: argparse.Namespace, ctx: Context) -> int:
    if not args.urls and not args.files:
        raise UsageError("nothing to push: give URLs and/or --file PATH (- for stdin)")
    # workers validate what they read with the spider's settings: the producer applies them
    producer = ctx.producer(args.spider, _project_settings(args.set or []), target="start_urls")
    ctx.warn_if_unknown(args.spider)
    given = (u.encode("utf-8", errors="surrogateescape") for u in args.urls)
    raws = [*given, *_input_lines(args.files or ())]
    results = producer.push_many(
        (_wrap(raw, args.priority, args.meta) for raw in raws), atomic=True
    )
    refused = 0
    for raw, result in zip(raws, results, strict=True):
        if result.outcome is Outcome.REFUSED:
            refused += 1
            print(f"refused: {_show_entry(raw)} ({result.reason})", file=sys.stderr)
    full = sum(1 for r in results if r.outcome is Outcome.FULL)
    if full:
        room = producer.last_room
        print(
            f"refused: the crawl is at its pending cap (DISTCRAWL_MAX_PENDING); room for "
            f"{room} more entries, {full} given; nothing pushed",
            file=sys.stderr,
        )
        if ctx.as_json:
            _emit_json({"pushed": 0, "refused": refused + full, "room": room})
        return EXIT_FULL
    pushed = len(results) - refused
    if ctx.as_json:
        _emit_json({"pushed": pushed, "refused": refused})
    else:
        print(f"pushed {pushed}, refused {refused}")
    return EXIT_PARTIAL if refused else EXIT_OK


# ---------------------------------------------------------------------- politeness


def cmd_domains(args: argparse.Namespace, ctx: Context) -> int:
    admin = ctx.admin(args.spider)
    states = admin.slot_states(args.limit, scan=args.scan)
    total = admin.slot_count()
    if total > 2 * args.scan:
        print(
            f"looked at {args.scan} slots with requests queued and {args.scan} with requests "
            f"in flight, of {total}: --scan {total} looks at all",
            file=sys.stderr,
        )
    if ctx.as_json:
        _emit_json(states)
        return EXIT_OK
    print(
        f"{'slot':<32} {'queued':>8} {'in flight':>9} {'next in':>8} {'throttle':>8} "
        f"{'cap':>4} {'crawl-delay':>11}  override"
    )
    for st in states:
        crawl_delay = "-" if st["crawl_delay"] is None else f"{st['crawl_delay']:.1f}s"
        cap = "-" if st["throttle_concurrency"] is None else st["throttle_concurrency"]
        print(
            f"{st['slot']:<32} {st['queued']:>8} {st['in_flight']:>9} {st['next_in']:>7.1f}s "
            f"{st['throttle_delay']:>7.1f}s {cap:>4} {crawl_delay:>11}  {st['override'] or '-'}"
        )
    return EXIT_OK


def cmd_limit(args: argparse.Namespace, ctx: Context) -> int:
    if args.clear and (args.delay is not None or args.concurrency is not None):
        raise UsageError("--clear cannot be combined with --delay or --concurrency")
    if not args.clear and args.delay is None and args.concurrency is None:
        raise UsageError("give --delay and/or --concurrency, or --clear")
    ctx.admin(args.spider).set_limit(args.slot, args.delay, args.concurrency)
    if ctx.as_json:
        _emit_json({"slot": args.slot, "delay": args.delay, "concurrency": args.concurrency})
    elif args.clear:
        print(f"{args.slot}: override removed, the workers' settings apply")
    else:
        print(
            f"{args.slot}: delay {args.delay}, concurrency {args.concurrency} (from the next lease)"
        )
    return EXIT_OK


# ---------------------------------------------------------------------- status


def cmd_status(args: argparse.Namespace, ctx: Context) -> int:
    from distcrawl.model import dashboard

    ctx.warn_if_unknown(args.spider)
    snap = ctx.producer(args.spider, target="start_urls").status(args.stale_after)
    if ctx.as_json:
        _emit_json(snap)
    else:
        print(dashboard.render_status(snap))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace, ctx: Context) -> int:
    from distcrawl.model import dashboard

    producer = ctx.producer(args.spider, target="start_urls")
    watch = dashboard.Watch()
    deadline = time.monotonic() + args.duration if args.duration else None
    try:
        while deadline is None or time.monotonic() < deadline:
            snap = producer.status(args.stale_after)
            watch.add(snap)
            if ctx.as_json:
                print(
                    json.dumps(
                        {
                            "time": snap["time"],
                            "totals": snap["totals"],
                            "queue": snap["queue"],
                            "leased": snap["leased"],
                        }
                    ),
                    flush=True,
                )
            else:
                print("\x1b[H\x1b[2J" + watch.render(snap), flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _set_paused(args: argparse.Namespace, ctx: Context, paused: bool) -> int:
    ctx.warn_if_unknown(args.spider)
    keys = ctx.keys(args.spider)
    ctx.admin(keys).set_paused(paused)
    word = "paused" if paused else "resumed"
    if ctx.as_json:
        _emit_json({"paused": paused})
    else:
        print(f"{word} {keys.namespace!r}: workers see it within one heartbeat")
    return EXIT_OK


def cmd_pause(args: argparse.Namespace, ctx: Context) -> int:
    return _set_paused(args, ctx, True)


def cmd_resume(args: argparse.Namespace, ctx: Context) -> int:
    return _set_paused(args, ctx, False)


# ---------------------------------------------------------------------- doctor


def _doctor_text(report: Any) -> str:
    """The summary of a :class:`distcrawl.admin.doctor.Report`: counts per problem, samples."""
    from distcrawl.admin.doctor import KINDS

    scanned = ", ".join(f"{key} {n}" for key, n in report.scanned.items())
    verb = "repaired" if report.repair else "checked"
    lines = [f"doctor {verb} {report.namespace!r} (scanned {scanned})"]
    for kind, finding in report.findings.items():
        if not finding.found:
            continue
        what, fix = KINDS[kind]
        line = f"  {finding.found:>8}  {what} [{kind}]"
        if report.repair:
            line += f": {finding.repaired} {fix}"
            if finding.found > finding.repaired:
                line += f", {finding.found - finding.repaired} gone meanwhile"
        lines.append(line)
        for sample in finding.samples:
            text = ", ".join(f"{k} {'-' if v is None else v}" for k, v in sample.items())
            lines.append("            " + _one_line(text))
        if finding.found > len(finding.samples):
            lines.append(f"            ... and {finding.found - len(finding.samples)} more")
    if report.incomplete:
        lines.append("  a scan stopped early (a key kept growing): run the doctor again")
    if report.problems == 0:
        lines.append("  no problems found")
    elif not report.repair:
        lines.append(f"  {report.problems} problems; distcrawl doctor --repair fixes them")
    return "\n".join(lines)


def cmd_doctor(args: argparse.Namespace, ctx: Context) -> int:
    """Exit 0 when the frontier is clean or was repaired, 1 when problems were left."""
    from distcrawl.admin.doctor import Doctor, scrapy_redis_leftovers

    doctor = Doctor(ctx.client, ctx.keys(args.spider), batch=args.batch, samples=args.samples)
    report = doctor.examine(repair=args.repair)
    try:
        leftovers = scrapy_redis_leftovers(_project_settings([]))
    except UsageError as exc:  # the frontier check stands on its own
        print(f"warning: {exc}: scrapy-redis settings not checked", file=sys.stderr)
        leftovers = []
    for name, advice in leftovers:
        print(f"warning: scrapy-redis setting {name} in the project: {advice}", file=sys.stderr)
    if ctx.as_json:
        _emit_json({**report.as_dict(), "scrapy_redis_settings": dict(leftovers)})
    else:
        print(_doctor_text(report))
    return EXIT_OK if report.resolved else EXIT_PARTIAL


# ---------------------------------------------------------------------- reset


def cmd_reset(args: argparse.Namespace, ctx: Context) -> int:
    keys = ctx.keys(args.spider)
    live = live_workers(ctx.client, keys, args.worker_timeout)
    if live:
        # a live worker goes on with the crawl there after the reset (it notices the reset
        # at its next lease and forgets its caches), and a page it is fetching meanwhile
        # pushes its links into it
        beat = (
            f"{len(live)} worker(s) of {keys.namespace!r} beat within the last "
            f"{args.worker_timeout:g}s ({', '.join(live)})"
        )
        if not args.force:
            print(
                f"error: {beat}: stop them first (or pause the crawl and let them finish), "
                "or reset with --force: they then forget this crawl and go on with the next "
                "one pushed, and the pages they are fetching push their links into it",
                file=sys.stderr,
            )
            return EXIT_PARTIAL
        print(
            f"warning: {beat}; resetting anyway (--force): they go on with the next crawl",
            file=sys.stderr,
        )
    # the workers' claim lists too: entries claimed and not stored are start URLs as well
    admin = ctx.admin(keys)
    existing = int(ctx.client.exists(*keys.all(), *admin.claim_keys()))
    existing += len(admin.netloc_keys())
    return delete_confirmed(args, ctx, keys, "keys", existing, admin.clear)


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    command = command_maker(common)
    push = command(commands, "push", cmd_push, "validate entries and LPUSH them to start_urls")
    push.add_argument("urls", nargs="*", metavar="URL", help="URL or JSON entry")
    push.add_argument(
        "--file",
        dest="files",
        action="append",
        metavar="PATH",
        help="one entry per line (URL or JSON object), - for stdin; # and blank lines "
        "skipped; repeatable",
    )
    push.add_argument(
        "--priority", type=int, metavar="N", help="wrap plain URLs into JSON with this priority"
    )
    push.add_argument(
        "--meta",
        type=_json_object,
        metavar="JSON",
        help="wrap plain URLs into JSON with this meta object",
    )
    settings_option(
        push,
        "a project setting, as on `scrapy crawl` (e.g. DISTCRAWL_START_META_KEYS=cookiejar); "
        "repeatable",
    )

    status = command(commands, "status", cmd_status, "queue sizes, workers, totals, domains")
    watch = command(commands, "watch", cmd_watch, "live dashboard with rates, every second")
    for sub in (status, watch):
        sub.add_argument(
            "--stale-after",
            type=float,
            default=10.0,
            metavar="SECONDS",
            help="report a worker as stale when its last heartbeat is older (default 10)",
        )
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    watch.add_argument(
        "--duration", type=float, default=0, help="stop after this many seconds (0: never)"
    )
    domains = command(
        commands, "domains", cmd_domains, "per-domain queue, in-flight count and delays"
    )
    count_option(domains, "--limit", 20)
    count_option(
        domains,
        "--scan",
        10_000,
        "look at N slots with queued requests and N with requests in flight (default "
        "10000): each is a read of Redis, a broad crawl has millions",
    )
    limit = command(commands, "limit", cmd_limit, "set a domain's delay or concurrency live")
    limit.add_argument("slot", metavar="DOMAIN", help="host name, IP or download_slot")
    limit.add_argument("--delay", type=float, metavar="SECONDS", help="minimum gap, cluster-wide")
    limit.add_argument("--concurrency", type=int, metavar="N", help="most requests in flight")
    limit.add_argument("--clear", action="store_true", help="remove the override")
    command(commands, "pause", cmd_pause, "workers stop taking requests and finish theirs")
    command(commands, "resume", cmd_resume, "workers take requests again")

    doctor = command(
        commands,
        "doctor",
        cmd_doctor,
        "find frontier state that should never exist (unparsable queue entries, slots "
        "missing from ready, leases/retries/records without their counterpart, wrong "
        "in-flight counts); exit 1 if any is left",
    )
    doctor.add_argument(
        "--repair",
        action="store_true",
        help="fix what is found (each item re-checked atomically; safe while workers run)",
    )
    count_option(
        doctor,
        "--batch",
        1000,
        "SCAN count and items per repair script (default 1000)",
        at_least_one=True,
    )
    count_option(doctor, "--samples", 5, "examples shown per problem (default 5)")

    reset = command(commands, "reset", cmd_reset, "delete every key of this crawl")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    reset.add_argument(
        "--force",
        action="store_true",
        help="reset even while workers are live (they notice, forget what they remember of "
        "this crawl and go on with the next)",
    )
    reset.add_argument(
        "--worker-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a worker that beat more recently is live (DISTCRAWL_WORKER_TIMEOUT, default 10)",
    )
