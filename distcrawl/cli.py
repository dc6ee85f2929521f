"""The ``distcrawl`` command: seed, inspect and clean one crawl's shared frontier.

Operators otherwise do this with ``redis-cli`` and hand-typed key names, which pushes
entries the workers will only dead-letter later and makes it easy to delete another
crawl's keys. So this command validates every entry with the same :func:`parse_entry` the
workers use, with the project's settings, *before* it reaches Redis (push, status and the
dead-letter commands are :class:`distcrawl.Producer`'s, which Python code calls too), builds
every key through :class:`FrontierKeys` (``reset`` removes exactly one crawl's keys and
nothing else), gets its client only from :func:`make_redis`, and only ever shows the Redis
URL through :func:`redact_url`.

Exit codes: 0 success, 1 partial failure or refusal (some entries refused, confirmation
declined, problems ``doctor`` found and did not repair, Redis refused the password, other
Redis error), 2 usage error, 3 Redis unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from scrapy.settings import BaseSettings, Settings
from scrapy.utils.project import get_project_settings, inside_project

from distcrawl._version import VersionAction
from distcrawl.config import DEFAULT_REDIS_URL, ConfigError, cluster_mode
from distcrawl.connection import auth_refusal, is_cluster, make_redis
from distcrawl.frontier import Frontier
from distcrawl.keys import FrontierKeys
from distcrawl.producer import Outcome, Producer
from distcrawl.redact import redact_text, redact_url, url_secrets

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_FULL = 4

#: how much of an entry or dead-letter field a human-readable line shows
SHOW_CHARS = 200


class UsageError(Exception):
    """Bad input found after argument parsing (e.g. an unreadable --file): exit 2."""


class Context:
    """The parsed global options and the one lazily made Redis client of this run."""

    def __init__(self, redis_url: str, as_json: bool, cluster: bool | None = False) -> None:
        self.redis_url = redis_url
        self.as_json = as_json
        #: --cluster: whether the URL is a Redis Cluster node (None: ask it when connecting)
        self.cluster = cluster
        self._client: redis.Redis | None = None

    @property
    def shown_url(self) -> str:
        return redact_url(self.redis_url)

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            try:
                client = make_redis(self.redis_url, cluster=self.cluster)
            except (ValueError, redis.exceptions.RedisClusterException) as exc:
                raise UsageError(
                    f"invalid --redis-url {self.shown_url}: {self.scrub(str(exc))}"
                ) from None
            self.cluster = is_cluster(client)
            # A CLI should fail at once on a dead server, not after redis-py's backoff.
            client.set_retry(Retry(NoBackoff(), 0))
            self._client = client
        return self._client

    def keys(self, keys: FrontierKeys) -> FrontierKeys:
        """``keys`` named as on this Redis (hash-tagged on a cluster); connects."""
        return keys.on_cluster(is_cluster(self.client))

    def frontier(self, keys: FrontierKeys) -> Frontier:
        return Frontier(self.client, self.keys(keys))

    def producer(
        self, keys: FrontierKeys, settings: BaseSettings | None = None, **kwargs: Any
    ) -> Producer:
        """The :class:`Producer` of crawl ``keys`` on this run's client: the commands that
        push, show the status or handle dead letters share its code with Python callers.
        Without ``settings``, Scrapy's defaults (no project is loaded)."""
        try:
            return Producer(
                lambda: self.client,
                keys.namespace,
                settings if settings is not None else Settings(),
                namespace=keys.namespace,
                **kwargs,
            )
        except ConfigError as exc:
            raise UsageError(str(exc)) from None

    def scrub(self, text: str) -> str:
        """``text`` without the URL's secrets, should an error message quote them."""
        return redact_text(text, url_secrets(self.redis_url))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


# ---------------------------------------------------------------------- helpers


def _spider(value: str) -> FrontierKeys:
    try:
        return FrontierKeys(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid spider/namespace {value!r}: must be non-empty, without whitespace"
        ) from None


def _cluster_option(value: str) -> bool | None:
    try:
        return cluster_mode(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected auto, yes or no") from None


def _json_object(value: str) -> dict[str, Any]:
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError('must be a JSON object, e.g. \'{"tag": "x"}\'')
    return data


def _non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return number


def _positive_int(value: str) -> int:
    number = _non_negative_int(value)
    if number == 0:
        raise argparse.ArgumentTypeError("must be >= 1")
    return number


def _one_line(text: str, limit: int | None = SHOW_CHARS) -> str:
    """``text`` safe for one terminal line: control characters escaped, long text cut."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    return text


def _show_entry(raw: bytes) -> str:
    return _one_line(raw.decode("utf-8", errors="backslashreplace"))


def _emit_json(data: Any) -> None:
    print(json.dumps(data, ensure_ascii=False, default=repr))


def _confirm(args: argparse.Namespace, question: str) -> bool:
    """True if ``--yes`` was given or a person at a terminal answered y/yes."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        print(
            "error: stdin is not a terminal, so nothing can be confirmed; "
            "pass --yes to delete without asking",
            file=sys.stderr,
        )
        return False
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer in ("y", "yes"):
        return True
    print("aborted", file=sys.stderr)
    return False


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


def default_redis_url() -> str:
    """Where the commands go without ``--redis-url``: ``$REDIS_URL``, else the ``REDIS_URL``
    of the Scrapy project the command runs in (found as ``scrapy crawl`` finds it: scrapy.cfg
    or SCRAPY_SETTINGS_MODULE), so that ``distcrawl push`` from a project reaches the Redis
    its workers use; else the local default."""
    from_env = os.environ.get("REDIS_URL")
    if from_env:
        return from_env
    if inside_project():
        try:
            configured = get_project_settings().get("REDIS_URL")
        except Exception:  # a broken settings module: the commands that read it say so
            configured = None
        if configured:
            return str(configured)
    return DEFAULT_REDIS_URL


def _project_settings(overrides: list[str]) -> BaseSettings:
    """The settings the project's workers run with (scrapy.cfg or SCRAPY_SETTINGS_MODULE, then
    ``-s NAME=VALUE`` as on ``scrapy crawl``), so that push accepts what they accept."""
    try:
        settings = get_project_settings()
    except Exception as exc:  # a broken settings module is the user's to fix, not a traceback
        raise UsageError(f"cannot load the project settings: {type(exc).__name__}: {exc}") from None
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError("-s expects NAME=VALUE")  # the text itself may be a secret
        settings.set(name.strip(), value, priority="cmdline")
    return settings


def cmd_push(args: argparse.Namespace, ctx: Context) -> int:
    if not args.urls and not args.files:
        raise UsageError("nothing to push: give URLs and/or --file PATH (- for stdin)")
    # workers validate what they read with the spider's settings: the producer applies them
    producer = ctx.producer(args.spider, _project_settings(args.set or []), target="start_urls")
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
    frontier = ctx.frontier(args.spider)
    states = frontier.slot_states(args.limit, scan=args.scan)
    total = frontier.slot_count()
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
    ctx.frontier(args.spider).set_limit(args.slot, args.delay, args.concurrency)
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
    from distcrawl import dashboard

    snap = ctx.producer(args.spider, target="start_urls").status(args.stale_after)
    if ctx.as_json:
        _emit_json(snap)
    else:
        print(dashboard.render_status(snap))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace, ctx: Context) -> int:
    from distcrawl import dashboard

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
    keys = ctx.keys(args.spider)
    if paused:
        ctx.client.set(keys.paused, b"1")
    else:
        ctx.client.delete(keys.paused)
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
    """The summary of a :class:`distcrawl.doctor.Report`: counts per problem, samples."""
    from distcrawl.doctor import KINDS

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
    from distcrawl.doctor import Doctor, scrapy_redis_leftovers

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
    # the workers' claim lists too: entries claimed and not stored are start URLs as well
    frontier = ctx.frontier(keys)
    existing = int(ctx.client.exists(*keys.all(), *frontier.claim_keys()))
    existing += len(frontier.netloc_keys())
    if existing == 0:
        removed = 0
    else:
        question = f"Delete all {existing} keys of {keys.namespace!r} at {ctx.shown_url}?"
        if not _confirm(args, question):
            return EXIT_PARTIAL
        removed = ctx.frontier(keys).clear()
    if ctx.as_json:
        _emit_json({"removed": removed})
    else:
        print(f"removed {removed} keys of {keys.namespace!r}")
    return EXIT_OK


# ---------------------------------------------------------------------- dead letters


def _iso(timestamp: Any) -> str:
    try:
        moment = datetime.fromtimestamp(float(timestamp), tz=timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"
    return moment.isoformat(timespec="seconds")


def _dead_line(record: dict[str, Any]) -> str:
    subject = record.get("url") or record.get("raw") or "-"
    fields = (
        _iso(record.get("time")),
        _one_line(str(record.get("source") or "-")),
        _one_line(str(record.get("reason") or "-")),
        _one_line(str(subject)),
    )
    return "  ".join(fields)


def cmd_dead_list(args: argparse.Namespace, ctx: Context) -> int:
    producer = ctx.producer(args.spider, target="start_urls")
    records = producer.dead_letters(args.limit)
    if ctx.as_json:
        _emit_json(records)
        return EXIT_OK
    for record in records:
        print(_dead_line(record))
    total = producer.dead_count()
    if total > len(records):
        print(f"(newest {len(records)} of {total}; see --limit)", file=sys.stderr)
    return EXIT_OK


def cmd_dead_count(args: argparse.Namespace, ctx: Context) -> int:
    count = ctx.producer(args.spider, target="start_urls").dead_count()
    if ctx.as_json:
        _emit_json({"dead": count})
    else:
        print(count)
    return EXIT_OK


def cmd_dead_purge(args: argparse.Namespace, ctx: Context) -> int:
    keys = ctx.keys(args.spider)
    count = int(ctx.client.llen(keys.dead))
    if count:
        question = (
            f"Delete all {count} dead-letter records of {keys.namespace!r} at {ctx.shown_url}?"
        )
        if not _confirm(args, question):
            return EXIT_PARTIAL
        # Count and delete atomically, so records added meanwhile are counted too.
        pipe = ctx.client.pipeline(transaction=True)
        pipe.llen(keys.dead)
        pipe.unlink(keys.dead)
        count = int(pipe.execute()[0])
    if ctx.as_json:
        _emit_json({"removed": count})
    else:
        print(f"removed {count} dead-letter records of {keys.namespace!r}")
    return EXIT_OK


def cmd_dead_redrive(args: argparse.Namespace, ctx: Context) -> int:
    # the project's spider makes the request of a record that holds only its URL
    producer = ctx.producer(args.spider, _project_settings([]), target="start_urls")
    result = producer.redrive(
        error=args.error, domain=args.domain, source=args.source, serializer=args.serializer
    )
    moved, unusable = result.redriven, result.not_redrivable
    if ctx.as_json:
        _emit_json({"redriven": moved, "not_redrivable": unusable})
    else:
        print(f"re-drove {moved} dead letters of {args.spider.namespace!r}")
        if unusable:
            print(f"{unusable} matching records hold no request to re-drive", file=sys.stderr)
    return EXIT_PARTIAL if unusable else EXIT_OK


# ---------------------------------------------------------------------- acl


def cmd_acl(args: argparse.Namespace, ctx: Context) -> int:
    """Print the producer and worker ACL users of a crawl; talks to no Redis (so a
    cluster's key names are only used with ``--cluster yes``)."""
    from distcrawl import acl

    keys: FrontierKeys = (args.namespace or args.spider).on_cluster(ctx.cluster is True)
    try:
        users = acl.roles(
            keys,
            producer=args.producer_user,
            worker=args.worker_user,
            producer_password_env=args.producer_password_env,
            worker_password_env=args.worker_password_env,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if ctx.as_json:
        _emit_json(
            {
                "namespace": keys.namespace,
                "users": [
                    {
                        "role": u.role,
                        "user": u.name,
                        "rules": list(u.rules),
                        "command": u.command(),
                        "password_placeholder": u.placeholder,
                    }
                    for u in users
                ],
            }
        )
    else:
        for user in users:
            print(user.aclfile_line() if args.format == "aclfile" else user.command())
    for user in users:
        if user.placeholder:
            print(
                f"note: replace <{user.role}-password> before use, or pass "
                f"--{user.role}-password-env VAR to print its SHA-256 instead",
                file=sys.stderr,
            )
    return EXIT_OK


# ---------------------------------------------------------------------- mongo


def cmd_mongo_replay(args: argparse.Namespace, ctx: Context) -> int:
    """Write spill files (items a worker could not store at close) into MongoDB."""
    from pymongo.errors import ConfigurationError, ConnectionFailure, InvalidURI, PyMongoError

    from distcrawl.mongo import auth_refusal as mongo_auth_refusal
    from distcrawl.mongo import replay

    uri = args.mongo_uri
    if not uri:
        raise UsageError("no MongoDB: pass --mongo-uri URI or set MONGO_URI")
    shown = redact_url(uri)

    def scrub(text: str, uri: str) -> str:
        return redact_text(text, url_secrets(uri))

    for path in args.files:
        if not os.path.isfile(path):
            raise UsageError(f"cannot read {path}: no such file")
    try:
        result = replay(args.files, uri, database=args.database)
    except InvalidURI as exc:
        raise UsageError(f"invalid --mongo-uri {shown}: {scrub(str(exc), uri)}") from None
    except ValueError as exc:  # a line that is not a spill record
        raise UsageError(str(exc)) from None
    except (ConnectionFailure, ConfigurationError) as exc:
        reason = scrub(str(exc), uri) or type(exc).__name__
        print(f"error: cannot reach MongoDB at {shown}: {reason}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except PyMongoError as exc:
        what = mongo_auth_refusal(exc) or "MongoDB"
        print(f"error: {what} at {shown}: {scrub(str(exc), uri)}", file=sys.stderr)
        return EXIT_PARTIAL
    refused = result.dead + result.spilled
    if ctx.as_json:
        _emit_json(
            {
                "documents": result.documents,
                "upserted": result.upserted,
                "updated": result.updated,
                "dead": result.dead,
                "rejected": result.spilled,
            }
        )
    else:
        print(
            f"replayed {result.documents} documents from {len(result.files)} file(s) into "
            f"{shown}: {result.upserted} new, {result.updated} updated, "
            f"{result.dead} dead-lettered"
        )
        if result.spilled:
            print(
                f"{result.spilled} documents could not even be dead-lettered: see "
                f"{args.files[0]}.rejected.jsonl",
                file=sys.stderr,
            )
    return EXIT_PARTIAL if refused else EXIT_OK


def cmd_notify_replay(args: argparse.Namespace, ctx: Context) -> int:
    """Send the item notifications a worker spilled at close (its broker was down)."""
    from distcrawl import notify

    broker = (
        args.broker
        or _project_settings([]).get("DISTCRAWL_CELERY_BROKER_URL")
        or os.environ.get("CELERY_BROKER_URL")
    )
    if not broker:
        raise UsageError(
            "no broker: pass --broker URL, or set DISTCRAWL_CELERY_BROKER_URL in the project's "
            "settings or CELERY_BROKER_URL"
        )
    broker = str(broker)
    shown = redact_url(broker)
    for path in args.files:
        if not os.path.isfile(path):
            raise UsageError(f"cannot read {path}: no such file")
    try:
        result = notify.replay(args.files, broker)
    except ConfigError as exc:  # Celery is not installed
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # a line that is not a notification record
        raise UsageError(str(exc)) from None
    except Exception as exc:  # kombu raises the transport's own errors
        reason = redact_text(str(exc), url_secrets(broker)) or type(exc).__name__
        print(f"error: cannot send to the Celery broker at {shown}: {reason}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if ctx.as_json:
        _emit_json({"sent": result.sent, "files": result.files})
    else:
        print(
            f"sent {result.sent} item notifications from {len(result.files)} file(s) via "
            f"{shown}; each file renamed to FILE{notify.SENT_SUFFIX}"
        )
    return EXIT_OK


# ---------------------------------------------------------------------- scrapyd


def cmd_scrapyd(args: argparse.Namespace, ctx: Context) -> int:
    """``distcrawl scrapyd ACTION``: the actions are in :mod:`distcrawl.scrapyd`."""
    from distcrawl.scrapyd import ConfigProblem

    try:
        return int(args.scrapyd_action(args, as_json=ctx.as_json))
    except ConfigProblem as exc:
        raise UsageError(str(exc)) from None


# ---------------------------------------------------------------------- parser


Handler = Callable[[argparse.Namespace, Context], int]


def _global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """``--redis-url``/``--json``, accepted before and after the subcommand.

    Subcommands use SUPPRESS so that they only set the value when it is given there.
    """
    parser.add_argument(
        "--redis-url",
        default=None if defaults else argparse.SUPPRESS,
        metavar="URL",
        # never %(default)s: $REDIS_URL may hold a password
        help="Redis to use (default: $REDIS_URL, else the REDIS_URL setting of the Scrapy "
        f"project the command runs in, else {DEFAULT_REDIS_URL})",
    )
    parser.add_argument(
        "--cluster",
        type=_cluster_option,
        default=(os.environ.get("DISTCRAWL_REDIS_CLUSTER") or "auto")
        if defaults
        else argparse.SUPPRESS,
        metavar="auto|yes|no",
        help="whether --redis-url is a node of a Redis Cluster (default: "
        "$DISTCRAWL_REDIS_CLUSTER, else auto: ask the server; acl: no)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if defaults else argparse.SUPPRESS,
        help="machine-readable JSON output",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distcrawl",
        description="Seed, inspect and clean a distcrawl frontier in Redis.",
        epilog="exit codes: 0 ok, 1 partial failure/refused/problems left, 2 usage error, "
        "3 Redis unreachable, 4 pending cap reached",
    )
    parser.add_argument("--version", action=VersionAction)
    _global_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, defaults=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(group: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = group.add_parser(
            name, parents=[common], help=help_text, description=help_text
        )
        sub.add_argument(
            "spider", type=_spider, metavar="SPIDER", help="namespace (usually the spider name)"
        )
        sub.set_defaults(handler=handler)
        return sub

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
    push.add_argument(
        "-s",
        "--set",
        action="append",
        metavar="NAME=VALUE",
        help="a project setting, as on `scrapy crawl` (e.g. DISTCRAWL_START_META_KEYS=cookiejar); "
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
    domains.add_argument("--limit", type=_non_negative_int, default=20, metavar="N")
    domains.add_argument(
        "--scan",
        type=_non_negative_int,
        default=10_000,
        metavar="N",
        help="look at N slots with queued requests and N with requests in flight (default "
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
    doctor.add_argument(
        "--batch",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="SCAN count and items per repair script (default 1000)",
    )
    doctor.add_argument(
        "--samples",
        type=_non_negative_int,
        default=5,
        metavar="N",
        help="examples shown per problem (default 5)",
    )

    reset = command(commands, "reset", cmd_reset, "delete every key of this crawl")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    dead = commands.add_parser(
        "dead", parents=[common], help="dead-letter records", description="dead-letter records"
    )
    dead_commands = dead.add_subparsers(dest="dead_command", required=True, metavar="ACTION")
    dead_list = command(dead_commands, "list", cmd_dead_list, "show records, newest first")
    dead_list.add_argument(
        "--limit",
        type=_non_negative_int,
        default=20,
        metavar="N",
        help="at most N records, 0 for all",
    )
    command(dead_commands, "count", cmd_dead_count, "print the number of records")
    purge = command(dead_commands, "purge", cmd_dead_purge, "delete every record")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    redrive = command(
        dead_commands,
        "redrive",
        cmd_dead_redrive,
        "put matching records back to work (requests into the queue with a fresh attempt "
        "count, bad start_urls entries back into start_urls)",
    )
    redrive.add_argument("--error", metavar="TEXT", help="only records whose reason contains TEXT")
    redrive.add_argument("--domain", metavar="HOST", help="only URLs on HOST or its subdomains")
    redrive.add_argument(
        "--source",
        # every source a dead letter is written with (grep source= and lua/lib.lua)
        choices=(
            "retry",
            "callback",
            "download",
            "enqueue",
            "start_urls",
            "queue",
            "commit",
            "doctor",
        ),
        help="only records of this source",
    )
    redrive.add_argument(
        "--serializer",
        choices=("msgpack", "json"),
        default="msgpack",
        help="DISTCRAWL_SERIALIZER of the workers (default msgpack)",
    )
    acl_help = (
        "print ACL SETUSER commands of two least-privilege Redis users: a producer that can "
        "only add start URLs (and read what push and status need), a worker with exactly the "
        "commands distcrawl sends, on this crawl's keys"
    )
    acl = command(commands, "acl", cmd_acl, acl_help)
    acl.add_argument(
        "--namespace", type=_spider, metavar="NS", help="DISTCRAWL_NAMESPACE, if not SPIDER"
    )
    acl.add_argument("--producer-user", metavar="NAME", help="default: <namespace>-producer")
    acl.add_argument("--worker-user", metavar="NAME", help="default: <namespace>-worker")
    for role in ("producer", "worker"):
        acl.add_argument(
            f"--{role}-password-env",
            metavar="VAR",
            help=f"the {role} password is in this environment variable: printed as its "
            "SHA-256 (#<hex>), never in clear; default: a >placeholder to replace",
        )
    acl.add_argument(
        "--format",
        choices=("commands", "aclfile"),
        default="commands",
        help="ACL SETUSER commands (for redis-cli) or lines of an ACL file (aclfile)",
    )
    mongo = commands.add_parser(
        "mongo", parents=[common], help="items stored in MongoDB", description="MongoDB items"
    )
    mongo_commands = mongo.add_subparsers(dest="mongo_command", required=True, metavar="ACTION")
    replay_help = (
        "write spill files (items a worker could not store in MongoDB at close) into MongoDB; "
        "documents are upserted by _id, so replaying twice changes nothing"
    )
    replay = mongo_commands.add_parser(
        "replay", parents=[common], help=replay_help, description=replay_help
    )
    replay.add_argument("files", nargs="+", metavar="FILE", help="spill file (.jsonl)")
    replay.add_argument(
        "--mongo-uri",
        default=os.environ.get("MONGO_URI"),
        metavar="URI",
        # never %(default)s: $MONGO_URI may hold a password
        help="MongoDB to write to (default: $MONGO_URI)",
    )
    replay.add_argument(
        "--database", metavar="NAME", help="write here instead of the database in each record"
    )
    replay.set_defaults(handler=cmd_mongo_replay)
    notify = commands.add_parser(
        "notify",
        parents=[common],
        help="item notifications to Celery",
        description="item notifications (DISTCRAWL_CELERY_ITEM_TASK)",
    )
    notify_commands = notify.add_subparsers(dest="notify_command", required=True, metavar="ACTION")
    notify_help = (
        "send the item notifications that workers spilled at close (their broker was down), "
        "then rename each file to FILE.sent so that they are not sent twice"
    )
    notify_replay = notify_commands.add_parser(
        "replay", parents=[common], help=notify_help, description=notify_help
    )
    notify_replay.add_argument(
        "files", nargs="+", metavar="FILE", help="notification spill file (*-notify-*.jsonl)"
    )
    notify_replay.add_argument(
        "--broker",
        metavar="URL",
        # never %(default)s: the broker's URL may hold a password
        help="Celery's broker (default: DISTCRAWL_CELERY_BROKER_URL of the project's settings, "
        "else $CELERY_BROKER_URL)",
    )
    notify_replay.set_defaults(handler=cmd_notify_replay)
    from distcrawl import importer, migrate, scrapyd

    scrapyd.add_parser(commands, common, cmd_scrapyd)
    importer.add_parser(commands, common)
    migrate.add_parser(commands, common)
    return parser


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return EXIT_OK
    return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help and usage errors: return the code, do not exit
        return _exit_code(exc)
    ctx = Context(args.redis_url or default_redis_url(), args.json, args.cluster)
    handler: Handler = args.handler
    try:
        return handler(args, ctx)
    except UsageError as exc:
        print(f"distcrawl: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except redis.RedisError as exc:
        reason = ctx.scrub(str(exc)) or type(exc).__name__
        refusal = auth_refusal(exc)
        if refusal is not None:  # a ConnectionError to redis-py, but no network problem
            print(f"error: {refusal} at {ctx.shown_url}: {reason}", file=sys.stderr)
            return EXIT_PARTIAL
        if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
            print(f"error: cannot reach Redis at {ctx.shown_url}: {reason}", file=sys.stderr)
            return EXIT_UNREACHABLE
        print(f"error: Redis at {ctx.shown_url}: {reason}", file=sys.stderr)
        return EXIT_PARTIAL
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
