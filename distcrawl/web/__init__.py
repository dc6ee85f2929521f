"""``distcrawl web``: a web console for running crawls, served by one command.

An app like the command line (distcrawl/cli): it shows what ``distcrawl status``,
``domains`` and ``dead list`` show, read through the same readers (the dashboard's
``snapshot``, ``FrontierAdmin``, the producer's dead letters, the history rollups), and,
when started with ``--allow-actions``, pauses, resumes, pushes and re-drives through the
same code as those commands. It needs nothing but Redis: aiohttp serves it, jinja2 renders
its pages, and its scripts and charts are files of this package (no CDN).
"""
