"""``distcrawl web``: serve the web console (distcrawl/web) for one or more crawls.

Optional: it needs the ``web`` extra (``pip install 'distcrawl[web]'``: aiohttp and
jinja2), imported only when the command runs, so that every other command works without.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from distcrawl._commandline import EXIT_OK, EXIT_USAGE, subcommand
from distcrawl.cli._common import Context, UsageError, _project_settings, _spider

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8030


def cmd_web(args: argparse.Namespace, ctx: Context) -> int:
    try:
        from aiohttp import web

        from distcrawl.web.app import Console, make_app
        from distcrawl.web.security import TOKEN_ENV, Guard
    except ImportError as exc:
        print(
            f"distcrawl web needs the web extra (pip install 'distcrawl[web]'): {exc}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    token = args.token or os.environ.get(TOKEN_ENV) or None
    try:
        guard = Guard(args.host, token)
    except ValueError as exc:
        print(f"distcrawl web: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = _project_settings([])
    except UsageError as exc:  # pushes and re-drives then use Scrapy's defaults
        print(f"warning: {exc}: actions use Scrapy's default settings", file=sys.stderr)
        from scrapy.settings import Settings

        settings = Settings()
    crawls = [keys.namespace for keys in args.spiders]
    for keys in args.spiders:
        ctx.warn_if_unknown(keys)  # connects: an unreachable Redis fails here, not per page
    console = Console(ctx, crawls, guard, allow_actions=args.allow_actions, settings=settings)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logger.info(
        "distcrawl web on http://%s:%d/ for %s, Redis %s, %s",
        args.host,
        args.port,
        ", ".join(crawls),
        ctx.shown_url,
        "actions allowed" if args.allow_actions else "read-only",
    )
    web.run_app(make_app(console), host=args.host, port=args.port, print=None, handle_signals=True)
    return EXIT_OK


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = subcommand(
        commands,
        "web",
        "serve the web console: status, workers, domains, dead letters, history charts",
        [common],
    )
    sub.add_argument(
        "spiders",
        type=_spider,
        nargs="+",
        metavar="SPIDER",
        help="the crawls (namespaces) the console shows",
    )
    sub.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sub.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})"
    )
    sub.add_argument(
        "--token",
        default=None,
        help="the token every request must carry (basic auth password or Bearer); needed "
        "on any address but loopback (default: $DISTCRAWL_WEB_TOKEN)",
    )
    sub.add_argument(
        "--allow-actions",
        action="store_true",
        help="allow pause, resume, push and re-drive from the console (default: read-only)",
    )
    sub.set_defaults(handler=cmd_web)
