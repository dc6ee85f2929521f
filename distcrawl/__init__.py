"""distcrawl: a shared, crash-safe Redis frontier that turns Scrapy into a distributed crawler."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distcrawl.addon import Addon

if TYPE_CHECKING:
    from distcrawl.producer import AsyncProducer, Outcome, Producer, ProducerError, PushResult

__all__ = [
    "Addon",
    "AsyncProducer",
    "Outcome",
    "Producer",
    "ProducerError",
    "PushResult",
    "__version__",
]
__version__ = "0.1.0"

#: imported on first use: a worker (which imports distcrawl for the add-on) never needs them
_PRODUCER_NAMES = ("AsyncProducer", "Outcome", "Producer", "ProducerError", "PushResult")


def __getattr__(name: str) -> Any:
    if name in _PRODUCER_NAMES:
        from distcrawl import producer

        return getattr(producer, name)
    raise AttributeError(f"module 'distcrawl' has no attribute {name!r}")
