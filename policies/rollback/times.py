"""Logical time domains and their frontiers' exact representations (Falkirk Wheel §2.1-2.3, §3.1).

A *frontier* is a downward-closed set of times. Each domain represents its frontiers by
an exclusive **bound** that is exact for that domain and makes ⊆, ∩ and ∪ cheap:

========  ====================================  ===================  =====================
domain    times                                 bound of a frontier  ∅ / ⊤
========  ====================================  ===================  =====================
epoch     integers t >= 0, totally ordered      b: {t : t < b}       0 / inf
lex       k-tuples of integers, lexicographic   b: {x : x <_lex b}   (0,…,0) / (inf,)
seq       (input edge, sequence number s >= 1)  per-edge counts      all 0 / all inf
========  ====================================  ===================  =====================

Bounds are plain Python values (ints, tuples) so the solver compares them without
allocating: for ``epoch`` and ``lex`` ⊆ is ``<=`` and ∩ is ``min``; for ``seq`` they are
component-wise. A seq bound carries one extra trailing coordinate that is 1 only for ⊤,
so ⊤ stays distinct from every finite frontier even for a processor without inputs.

>>> EPOCH.down([1, 3]), EPOCH.contains(4, 3), EPOCH.contains(4, 4)
(4, True, False)
>>> lex = LexDomain(2)
>>> lex.down([(1, 3)]), lex.subset((1, 4), (2, 0)), lex.subset(lex.top, (9, 9))
((1, 4), True, False)
>>> seq = SeqDomain(("e1", "e4"))
>>> seq.meet(seq.bound({"e1": 3}), seq.bound({"e1": 1, "e4": 2}))
(1, 0, 0)
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

INF = math.inf
Bound = Any  # int | float (epoch), tuple (lex, seq): see the module docstring


class Domain(ABC):
    """The times of one processor, and the algebra of frontier bounds over them."""

    kind: str = ""
    empty: Bound
    top: Bound

    @abstractmethod
    def subset(self, a: Bound, b: Bound) -> bool:
        """Whether the frontier with bound ``a`` is contained in the one with bound ``b``."""

    @abstractmethod
    def meet(self, a: Bound, b: Bound) -> Bound:
        """The bound of the intersection of two frontiers."""

    @abstractmethod
    def join(self, a: Bound, b: Bound) -> Bound:
        """The bound of the union of two frontiers."""

    @abstractmethod
    def contains(self, bound: Bound, time: Any) -> bool:
        """Whether ``time`` lies in the frontier with ``bound``."""

    @abstractmethod
    def down(self, times: Iterable[Any]) -> Bound:
        """↓T: the smallest frontier containing every time in ``times``."""

    def is_empty(self, bound: Bound) -> bool:
        return bound == self.empty

    def is_top(self, bound: Bound) -> bool:
        return bound == self.top

    def describe(self) -> str:
        return self.kind

    def _key(self) -> tuple:
        """What makes two domains the same (their kind and parameters)."""
        return (self.kind,)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Domain) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())


class TotallyOrdered(Domain):
    """A domain whose bounds compare with ``<=`` (epochs, lexicographic tuples)."""

    def subset(self, a: Bound, b: Bound) -> bool:
        return a <= b

    def meet(self, a: Bound, b: Bound) -> Bound:
        return a if a <= b else b

    def join(self, a: Bound, b: Bound) -> Bound:
        return a if a >= b else b


class EpochDomain(TotallyOrdered):
    """Integer epochs ``t >= 0`` in their natural order; a frontier is ``{t : t < bound}``."""

    kind = "epoch"
    empty = 0
    top = INF

    def contains(self, bound: Bound, time: Any) -> bool:
        return time < bound

    def down(self, times: Iterable[Any]) -> Bound:
        return max((t + 1 for t in times), default=self.empty)

    # The ledger, plans and the view speak of the *last epoch* a frontier holds ("through");
    # the solver, of its exclusive bound. These two are the only conversions between them.

    def through_bound(self, through: int | None) -> Bound:
        """The bound of the frontier holding every epoch up to and including ``through``
        (``None``: ∅).

        >>> EPOCH.through_bound(3), EPOCH.through_bound(None)
        (4, 0)
        """
        return self.empty if through is None else through + 1

    def last_through(self, bound: Bound) -> int:
        """The last epoch the frontier with this bound holds (``-1`` for ∅); ⊤ has none.

        >>> EPOCH.last_through(4), EPOCH.last_through(EPOCH.empty)
        (3, -1)
        """
        if self.is_top(bound):
            raise ValueError("⊤ holds every epoch, including future ones: it has no last epoch")
        return int(bound) - 1

    def __repr__(self) -> str:
        return "EPOCH"


class LexDomain(TotallyOrdered):
    """Tuples of ``length`` integers (e.g. ``(epoch, iteration)``) in lexicographic order."""

    kind = "lex"

    def __init__(self, length: int) -> None:
        if length < 1:
            raise ValueError("a lex domain needs tuples of length >= 1")
        self.length = length
        self.empty = (0,) * length
        self.top = (INF,)

    def contains(self, bound: Bound, time: Any) -> bool:
        return tuple(time) < bound

    def down(self, times: Iterable[Any]) -> Bound:
        latest = max((tuple(t) for t in times), default=None)
        return self.empty if latest is None else self.successor(latest)

    @staticmethod
    def successor(time: Sequence[int]) -> tuple:
        """The next tuple in lexicographic order: the last coordinate plus one."""
        return (*time[:-1], time[-1] + 1)

    def describe(self) -> str:
        return f"lex (tuples of length {self.length})"

    def _key(self) -> tuple:
        return (self.kind, self.length)

    def __repr__(self) -> str:
        return f"LexDomain({self.length})"


class SeqDomain(Domain):
    """Per-input-edge sequence numbers: a frontier counts the messages taken from each edge."""

    kind = "seq"

    def __init__(self, edges: Sequence[str]) -> None:
        self.edges = tuple(edges)
        self.index = {e: i for i, e in enumerate(self.edges)}
        self.empty = (0,) * (len(self.edges) + 1)
        self.top = (INF,) * len(self.edges) + (1,)

    def bound(self, counts: Mapping[str, int]) -> Bound:
        """The bound of the frontier with these counts (edges not named count 0)."""
        out = [0] * (len(self.edges) + 1)
        for edge, count in counts.items():
            out[self.index[edge]] = count
        return tuple(out)

    def counts(self, bound: Bound) -> dict[str, float]:
        return {e: bound[i] for i, e in enumerate(self.edges)}

    def subset(self, a: Bound, b: Bound) -> bool:
        return all(x <= y for x, y in zip(a, b))

    def meet(self, a: Bound, b: Bound) -> Bound:
        return tuple(x if x <= y else y for x, y in zip(a, b))

    def join(self, a: Bound, b: Bound) -> Bound:
        return tuple(x if x >= y else y for x, y in zip(a, b))

    def contains(self, bound: Bound, time: Any) -> bool:
        if bound[-1]:  # ⊤ holds every time, even of a processor with no input edges
            return True
        edge, number = time
        return 1 <= number <= bound[self.index[edge]]

    def down(self, times: Iterable[Any]) -> Bound:
        counts: dict[str, int] = {}
        for edge, number in times:
            counts[edge] = max(counts.get(edge, 0), number)
        return self.bound(counts)

    def describe(self) -> str:
        return f"seq (input edges {list(self.edges)})"

    def _key(self) -> tuple:
        return (self.kind, self.edges)

    def __repr__(self) -> str:
        return f"SeqDomain({self.edges!r})"


EPOCH = EpochDomain()
