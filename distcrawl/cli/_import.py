"""``distcrawl import scrapy-redis SPIDER``: its arguments, and the command that runs an
:class:`~distcrawl.admin.importer.Importer` and prints its report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from typing import Any

from distcrawl._commandline import (
    EXIT_OK,
    EXIT_PARTIAL,
    _emit_json,
    command_group,
    env_option,
    subcommand,
)
from distcrawl.admin import importer
from distcrawl.admin.importer import Importer, ImportRefused, Source
from distcrawl.cli._common import UsageError, _project_settings, settings_option
from distcrawl.config._convert import ConfigError
from distcrawl.model.redact import redact_text, url_secrets
from distcrawl.producer import Producer, ProducerError


def _mongo_urls(uri: str, collection: str, url_field: str) -> Callable[[], Iterator[str]]:
    """The URLs of the documents of ``[DATABASE.]COLLECTION`` (the URI's database if none is
    named): where a scrapy-redis project stored its items in MongoDB."""

    def read() -> Iterator[str]:
        import pymongo

        database, _, name = collection.rpartition(".")
        client: pymongo.MongoClient[Any] = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000)
        try:
            db = client[database] if database else client.get_default_database()
            projection = {url_field: 1, "_id": 0}
            for doc in db[name].find({}, projection, batch_size=importer.PAGE):
                url = doc.get(url_field)
                if isinstance(url, str):
                    yield url
        finally:
            client.close()

    return read


def cmd_import_scrapy_redis(args: argparse.Namespace, ctx: Any) -> int:
    """Exit 0 when every request was imported (or seen), 1 when some were dead-lettered or
    left over the pending cap, or the import was refused (nothing written)."""
    from pymongo.errors import PyMongoError

    settings = _project_settings(args.set or [])
    given = {
        "SCHEDULER_QUEUE_KEY": args.queue_key,
        "SCHEDULER_DUPEFILTER_KEY": args.dupefilter_key,
        "SCHEDULER_SERIALIZER": args.serializer,
        "REDIS_ITEMS_KEY": args.items_key,
    }
    for name, value in given.items():
        if value:
            settings.set(name, value, priority="cmdline")
    mongo = None
    if args.mongo_collection:
        if not args.mongo_uri:
            raise UsageError("--mongo-collection needs --mongo-uri URI (or $MONGO_URI)")
        mongo = _mongo_urls(args.mongo_uri, args.mongo_collection, args.url_field)
    try:
        producer = Producer(lambda: ctx.client, args.spider, settings, namespace=args.namespace)
    except (ConfigError, ProducerError, ValueError) as exc:  # ValueError: a bad --namespace
        raise UsageError(str(exc)) from None
    try:
        importer = Importer(
            producer,
            Source.from_settings(settings, args.spider),
            trust_pickle=args.trust_pickle,
            move=args.move,
            dry_run=args.dry_run,
            rebuild_seen=args.rebuild_seen or mongo is not None,
            url_field=args.url_field,
            mongo=mongo,
        )
        report = importer.run()
    except ProducerError as exc:  # the spider is not in SPIDER_MODULES, layouts disagree
        raise UsageError(str(exc)) from None
    except ImportRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_PARTIAL
    except PyMongoError as exc:
        secrets = url_secrets(args.mongo_uri or "")
        print(f"error: MongoDB: {redact_text(str(exc), secrets)}", file=sys.stderr)
        return EXIT_PARTIAL
    if ctx.as_json:
        _emit_json(report.as_dict())
    else:
        print(report.text())
    return EXIT_PARTIAL if report.not_imported and not args.dry_run else EXIT_OK


#: the import's on/off options, and what each turns on
_FLAGS = (
    (
        "--trust-pickle",
        "decode a pickled queue (scrapy-redis' default): unpickling runs code, so only "
        "if nothing but your own crawlers could write to this Redis",
    ),
    (
        "--move",
        "rename the queue to <ns>:import:queue first (needed when its name is one of "
        "distcrawl's keys, as <spider>:requests is), delete it and the dupefilter when done",
    ),
    ("--dry-run", "print counts, write nothing"),
    (
        "--rebuild-seen",
        "also mark the pages scrapy-redis stored (the items key, --mongo-collection) as "
        "seen in distcrawl's seen-set (its own fingerprints are kept as the legacy seen-set)",
    ),
)


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """``distcrawl import scrapy-redis SPIDER``, registered by the cli package."""
    sources = command_group(
        commands,
        common,
        "import",
        "carry another crawler's frontier over",
        "Carry another crawler's frontier over.",
        dest="import_source",
        metavar="SOURCE",
    )
    text = (
        "import a scrapy-redis crawl: its queued requests into distcrawl's queue, its "
        "seen-set (converted, or kept as a legacy seen-set); run it again to resume"
    )
    sub = subcommand(sources, "scrapy-redis", text, [common])
    sub.add_argument(
        "spider",
        metavar="SPIDER",
        help="the spider: %%(spider)s of the scrapy-redis keys, and the project's spider "
        "(SPIDER_MODULES) whose callbacks the requests name",
    )
    sub.add_argument("--namespace", metavar="NS", help="DISTCRAWL_NAMESPACE, if not SPIDER")
    settings_option(sub, "a project setting, as on `scrapy crawl`; repeatable")
    for option, setting in (
        ("--queue-key", "SCHEDULER_QUEUE_KEY"),
        ("--dupefilter-key", "SCHEDULER_DUPEFILTER_KEY"),
        ("--serializer", "SCHEDULER_SERIALIZER"),
        ("--items-key", "REDIS_ITEMS_KEY"),
    ):
        sub.add_argument(option, metavar="VALUE", help=f"default: the project's {setting}")
    for flag, flag_help in _FLAGS:
        sub.add_argument(flag, action="store_true", help=flag_help)
    sub.add_argument(
        "--url-field", default="url", metavar="NAME", help="the items' URL field (default url)"
    )
    env_option(sub, "--mongo-uri", "MONGO_URI", metavar="URI", help="MongoDB of --mongo-collection")
    sub.add_argument(
        "--mongo-collection",
        metavar="[DB.]NAME",
        help="also mark the URLs of this collection's documents seen (implies --rebuild-seen)",
    )
    sub.set_defaults(handler=cmd_import_scrapy_redis)
