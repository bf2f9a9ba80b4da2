"""Frontiers: downward-closed sets of times, as values, and their JSON notation.

A :class:`Frontier` pairs a domain with a bound (see :mod:`falkirk.policies.rollback.times`) and supports
the set operations of the Falkirk Wheel paper (⊆ as ``<=``, ∩ as ``&``, ∪ as ``|``, membership as
``in``). The JSON notation is that of ``scenario-format.md``:

>>> f = Frontier.parse({"through": 3}, EPOCH)
>>> 2 in f, 4 in f, f <= Frontier.top(EPOCH), f.to_json()
(True, False, True, {'through': 3})
>>> lex = LexDomain(2)
>>> g = Frontier.parse({"through": [1, 3]}, lex)
>>> g.to_json(), (1, 3) in g, (1, 4) in g
({'below': [1, 4]}, True, False)
>>> (Frontier.parse({"below": [2, 0]}, lex) & g).to_json()
{'below': [1, 4]}
"""

from __future__ import annotations

from typing import Any

from falkirk.policies.rollback.times import EPOCH, INF, Bound, Domain, EpochDomain, LexDomain, SeqDomain

__all__ = ["EPOCH", "Frontier", "NotationError", "format_bound", "parse_bound"]


class NotationError(ValueError):
    """A frontier written wrongly for its domain; the message says what the domain expects."""


class Frontier:
    """An immutable frontier of one domain."""

    __slots__ = ("domain", "bound")

    def __init__(self, domain: Domain, bound: Bound) -> None:
        self.domain = domain
        self.bound = bound

    @classmethod
    def empty(cls, domain: Domain) -> Frontier:
        """∅: no time at all (the initial state)."""
        return cls(domain, domain.empty)

    @classmethod
    def top(cls, domain: Domain) -> Frontier:
        """⊤: every time, including future ones (a live processor's current state)."""
        return cls(domain, domain.top)

    @classmethod
    def down(cls, domain: Domain, times: Any) -> Frontier:
        """↓T, the smallest frontier containing ``times``."""
        return cls(domain, domain.down(times))

    @classmethod
    def parse(cls, value: Any, domain: Domain) -> Frontier:
        return cls(domain, parse_bound(value, domain))

    def to_json(self) -> Any:
        """The canonical notation: ``"empty"``, ``"top"``, ``through`` (epoch), ``below`` (lex), ``counts`` (seq)."""
        return format_bound(self.bound, self.domain)

    @property
    def is_empty(self) -> bool:
        return self.domain.is_empty(self.bound)

    @property
    def is_top(self) -> bool:
        return self.domain.is_top(self.bound)

    def __contains__(self, time: Any) -> bool:
        return self.domain.contains(self.bound, time)

    def __le__(self, other: Frontier) -> bool:
        return self.domain.subset(self.bound, other.bound)

    def __lt__(self, other: Frontier) -> bool:
        return self <= other and self != other

    def __and__(self, other: Frontier) -> Frontier:
        return Frontier(self.domain, self.domain.meet(self.bound, other.bound))

    def __or__(self, other: Frontier) -> Frontier:
        return Frontier(self.domain, self.domain.join(self.bound, other.bound))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Frontier) and self.domain == other.domain and self.bound == other.bound

    def __hash__(self) -> int:
        return hash((self.domain, self.bound))

    def __repr__(self) -> str:
        return f"Frontier({self.to_json()!r}, {self.domain!r})"


def parse_bound(value: Any, domain: Domain) -> Bound:
    """The bound of a frontier written in scenario notation, for ``domain``."""
    if value == "empty":
        return domain.empty
    if value == "top":
        return domain.top
    if not isinstance(value, dict) or len(value) != 1:
        raise NotationError(f"{value!r} is not a frontier: use \"empty\", \"top\" or {_forms(domain)}")
    (form, arg), = value.items()
    if isinstance(domain, EpochDomain) and form in ("through", "below"):
        if not _is_int(arg) or arg < (-1 if form == "through" else 0):
            raise NotationError(f"{form} takes a whole number of epochs >= {0 if form == 'below' else -1}, not {arg!r}")
        return domain.through_bound(arg) if form == "through" else arg
    if isinstance(domain, LexDomain) and form in ("through", "below"):
        if not isinstance(arg, list) or not all(_is_int(x) and x >= 0 for x in arg):
            raise NotationError(f"{form} takes a list of whole numbers >= 0 for a lex domain, not {arg!r}")
        if len(arg) != domain.length:
            raise NotationError(f"{form} {arg!r} has {len(arg)} coordinates; this processor's lex tuples have {domain.length}")
        return LexDomain.successor(arg) if form == "through" else tuple(arg)
    if isinstance(domain, SeqDomain) and form == "counts":
        if not isinstance(arg, dict):
            raise NotationError(f"counts takes an object {{input_edge: count}}, not {arg!r}")
        for edge, count in arg.items():
            if edge not in domain.index:
                raise NotationError(f"counts name edge {edge!r}, which is not an input edge of this processor "
                                    f"(its input edges: {list(domain.edges)})")
            if not _is_int(count) or count < 0:
                raise NotationError(f"counts.{edge} must be a whole number >= 0, not {count!r}")
        return domain.bound(arg)
    raise NotationError(f"{form!r} is not a frontier of a {domain.describe()} domain: use {_forms(domain)}")


def format_bound(bound: Bound, domain: Domain) -> Any:
    """The canonical notation of a bound (see :meth:`Frontier.to_json`)."""
    if bound == domain.empty:
        return "empty"
    if bound == domain.top:
        return "top"
    if isinstance(domain, EpochDomain):
        return {"through": domain.last_through(bound)}
    if isinstance(domain, LexDomain):
        return {"below": list(bound)}
    if not isinstance(domain, SeqDomain):
        raise NotationError(f"bound {bound!r} of a {domain.describe()} domain has no notation")
    counts = {e: c for e, c in domain.counts(bound).items() if c}
    if any(c == INF for c in counts.values()):
        raise NotationError(f"bound {bound!r} is infinite on some edges but not ⊤; it has no notation")
    return {"counts": counts}


def _forms(domain: Domain) -> str:
    if isinstance(domain, EpochDomain):
        return '{"through": t} or {"below": t}'
    if isinstance(domain, LexDomain):
        return '{"through": [..]} or {"below": [..]}' + f" with {domain.length} coordinates"
    return '{"counts": {input_edge: n}}'


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
