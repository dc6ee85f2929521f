"""``Op``: one frontier step as Redis sees it (a script call or a command) and how its reply
is read, so that a step is built once and sent either alone or in a batch's pipeline."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True)
class Op(Generic[T]):
    """One frontier step as Redis sees it, and how its reply is read.

    ``script`` names a script of ``Scripts`` (sent as EVALSHA with ``keys`` and ``args``);
    empty, ``args`` is a plain command. The Frontier's methods build an Op and send it
    alone (``Frontier.run``); the batch runner sends the Ops of a whole batch in one
    pipeline (batch.py), and both read the replies with the same ``parse``.
    """

    script: str
    keys: Sequence[Any]
    args: Sequence[Any]
    parse: Callable[[Any], T]


class Runner(Protocol):
    """What sends an Op on its own (``Frontier.run``)."""

    def run(self, op: Op[T]) -> T: ...


R = TypeVar("R", bound=Runner)


def sent_alone(
    make: Callable[Concatenate[R, P], Op[T]],
) -> Callable[Concatenate[R, P], T]:
    """A method that builds an Op and runs it at once: one signature (``make``'s) for the
    batched and the direct call. ``make`` is looked up on the instance when called, so that
    a subclass's or a test's replacement serves both calls too."""
    name = make.__name__

    def method(self: R, /, *args: P.args, **kwargs: P.kwargs) -> T:
        built: Op[T] = getattr(self, name)(*args, **kwargs)
        return self.run(built)

    method.__doc__ = make.__doc__
    return method
