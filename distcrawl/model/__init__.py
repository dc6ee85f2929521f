"""The frontier as Redis holds it: key names, the Lua scripts and their loader, the queue
entry's layout and lease tokens, what the scripts are given and what they return, one step
as Redis sees it (``Op``), shards, the layout record, the Bloom filter's sizing, the
dead-letter record, the Redis client, and the reads of a crawl's sizes and status.

Apart, and importing neither Scrapy nor Twisted, so that what reads or repairs a crawl
(``distcrawl status``, ``doctor``, a producer) needs no crawler, and so that a change to the
data layout is made here and only here. Which package may import which: the import rule of
docs/development.md, enforced by tests/test_import_rule.py.
"""
