"""Scrapyd's runner for the jobs of :class:`distcrawl.scrapyd.Launcher` (``python -m
distcrawl.scrapyd``): see :func:`distcrawl.scrapyd._launcher.runner_main`."""

from distcrawl.scrapyd._launcher import runner_main

if __name__ == "__main__":
    runner_main()
