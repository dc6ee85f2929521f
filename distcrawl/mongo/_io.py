"""The one thread every pymongo call of a pipeline runs on, so that no MongoDB call ever
blocks the reactor and writes keep the order they were issued in."""

from __future__ import annotations

from distcrawl.engine._serial import SerialThread


class MongoIO(SerialThread):
    """The one thread every pymongo call of a pipeline runs on, in the order issued."""

    def __init__(self) -> None:
        super().__init__("distcrawl-mongo")
