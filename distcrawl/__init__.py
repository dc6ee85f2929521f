"""distcrawl: a shared, crash-safe Redis frontier that turns Scrapy into a distributed crawler."""

from distcrawl.addon import Addon

__all__ = ["Addon", "__version__"]
__version__ = "0.1.0"
