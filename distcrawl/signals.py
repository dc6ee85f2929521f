"""distcrawl's own signals, sent through ``crawler.signals`` as Scrapy's are.

A component that keeps something of the crawl in the worker's memory (a cache of what the
frontier holds) connects to them, so that the scheduler need not know every such component.
"""

from __future__ import annotations

#: the frontier this worker joined was reset (``distcrawl reset``, ``FLUSHDB``) and it joined
#: the crawl there now: forget what was remembered of the old one. Sent on the reactor with
#: no argument.
frontier_reset = object()
