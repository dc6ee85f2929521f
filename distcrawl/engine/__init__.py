"""The worker's engine: the parts of the distributed scheduler (``distcrawl.scheduler`` is
the Scrapy component), the batch runner that sends their Redis work on the crawler's Redis
thread, liveness beats, the replicas a commit waits for, and the pieces of Scrapy's engine
distcrawl relies on.

Private: ``distcrawl.scheduler`` is the component, and these names may change with it. The
import rule: docs/development.md.
"""
