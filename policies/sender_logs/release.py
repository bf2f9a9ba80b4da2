"""Release policies: when a consumer no longer needs an input block to rebuild its state.

A task under sender-side logs keeps no checkpoint of its state. Instead it declares, for each
input, how far back its state depends on that input's blocks; a block it has **released** is
one its future output no longer depends on, and once every slice sink of the edge has released
(acknowledged) it, the producer may prune it. This replaces the paper's application-level
forwarding of checkpoint markers (Smith & Watson, CS-TR-836 §IV.A-B):

* :class:`Immediate`: a stateless operator (a filter, a map, a hash join's probe side)
  releases each block as soon as it has processed it;
* :class:`AtEnd`: a full aggregation or a hash join's build side needs every block until the
  execution ends, and releases them all at once then;
* :class:`Window`: a window over the last ``k`` blocks releases a block ``k`` blocks later;
* :class:`Custom`: any other rule, as a module-level function ``(through, final) -> released``.

Blocks are numbered by ``seq`` from 1 (one block per epoch: seq = epoch); ``released`` 0 means
nothing released yet. A policy that releases too early (``Immediate`` on an aggregator) is a
contract violation the runtime cannot see: a recovery then rebuilds a state that misses the
pruned blocks (the negative control of tests/integration/test_sender_logs.py, regions_neg).

>>> [Immediate().released(7), AtEnd().released(7), AtEnd().released(10, final=True), Window(3).released(7)]
[7, 0, 10, 4]
>>> release_point({"fact": Immediate(), "dim": AtEnd()}, through=7)  # the state's oldest dependency
0
>>> parse_release("window(3)") == Window(3), parse_release("at_end").spec()
(True, 'at_end')
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol


class ReleaseError(ValueError):
    """A release policy that cannot be used; the message names the field and the fix."""


class ReleasePolicy(Protocol):
    def released(self, through: int, final: bool = False) -> int:
        """The newest seq released once blocks ``1..through`` are processed (``final``: the
        execution's last block is among them)."""

    def spec(self) -> str:
        """The text form :func:`parse_release` reads back."""


def _check_through(through: int) -> None:
    if not isinstance(through, int) or isinstance(through, bool) or through < 0:
        raise ReleaseError(f"through={through!r}: give the seq of the newest block processed (an int >= 0)")


@dataclass(frozen=True)
class Immediate:
    """Each block is released as soon as it is processed (a stateless operator)."""

    name: ClassVar[str] = "immediate"

    def released(self, through: int, final: bool = False) -> int:
        _check_through(through)
        return through

    def spec(self) -> str:
        return self.name


@dataclass(frozen=True)
class AtEnd:
    """Nothing is released until the execution's last block is processed; then everything is."""

    name: ClassVar[str] = "at_end"

    def released(self, through: int, final: bool = False) -> int:
        _check_through(through)
        return through if final else 0

    def spec(self) -> str:
        return self.name


@dataclass(frozen=True)
class Window:
    """The state depends on the last ``k`` blocks: a block is released ``k`` blocks after it.

    >>> Window(0)
    Traceback (most recent call last):
    ...
    falkirk.policies.sender_logs.release.ReleaseError: Window(k=0): k is the number of blocks the state depends on, an int >= 1; use Immediate() for a state that depends on none
    """

    k: int
    name: ClassVar[str] = "window"

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ReleaseError(f"Window(k={self.k!r}): k is the number of blocks the state depends on, an int >= 1; "
                               f"use Immediate() for a state that depends on none")

    def released(self, through: int, final: bool = False) -> int:
        _check_through(through)
        return through if final else max(through - self.k, 0)

    def spec(self) -> str:
        return f"{self.name}({self.k})"


@dataclass(frozen=True)
class Custom:
    """Any other rule: ``function(through, final) -> released``, a module-level function named by
    its import path (``"package.module:function"``) so that the ledger can record it as text."""

    path: str
    name: ClassVar[str] = "custom"

    def __post_init__(self) -> None:
        self.function()  # refuse a path that does not import, when the DAG is parsed

    def function(self) -> Callable[[int, bool], int]:
        module, _, attr = self.path.partition(":")
        if not module or not attr:
            raise ReleaseError(f"Custom({self.path!r}): name the function as 'package.module:function'")
        try:
            found = importlib.import_module(module)
            for part in attr.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError) as exc:
            raise ReleaseError(f"Custom({self.path!r}): cannot import it ({exc}); name a module-level function "
                               f"as 'package.module:function'") from exc
        if not callable(found):
            raise ReleaseError(f"Custom({self.path!r}) is not a function")
        return found

    def released(self, through: int, final: bool = False) -> int:
        _check_through(through)
        value = self.function()(through, final)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= through:
            raise ReleaseError(f"Custom({self.path!r}) returned {value!r} for through={through}: a release is a seq "
                               f"from 0 to the newest block processed")
        return value

    def spec(self) -> str:
        return f"{self.name}({self.path})"


_SPEC = re.compile(r"^(?P<name>[a-z_]+)(?:\((?P<arg>[^()]*)\))?$")


def parse_release(text: str) -> ReleasePolicy:
    """A release policy from its text form (``immediate``, ``at_end``, ``window(3)``,
    ``custom(package.module:function)``)."""
    match = _SPEC.match(text.strip()) if isinstance(text, str) else None
    name, arg = (match["name"], match["arg"]) if match else (None, None)
    if name in ("immediate", "at_end") and arg is None:
        return Immediate() if name == "immediate" else AtEnd()
    if name == "window" and arg is not None and arg.strip().isdigit():
        return Window(int(arg))
    if name == "custom" and arg:
        return Custom(arg.strip())
    raise ReleaseError(f"release policy {text!r}: give one of immediate, at_end, window(K) or "
                       f"custom(package.module:function)")


def release_point(policies: Mapping[str, ReleasePolicy], through: int, final: bool = False) -> int:
    """The newest seq released on every input: the state from there on depends only on later
    blocks, so a recovery restarts from empty state there and replays the blocks after it."""
    if not policies:
        raise ReleaseError("a task under sender-side logs reads at least one input: give a release policy per input")
    return min(p.released(through, final) for p in policies.values())


__all__ = ["AtEnd", "Custom", "Immediate", "ReleaseError", "ReleasePolicy", "Window", "parse_release",
           "release_point"]
