"""Edge projections φ(e): frontiers of the sender's domain to frontiers of the receiver's (Falkirk Wheel §3.2).

φ(e)(f) is the set of the receiver's times that are safe to keep if the sender rolls
back to f. Every projection maps ∅ to ∅ and ⊤ to ⊤, and is monotone.

>>> from falkirk.policies.rollback.times import EPOCH, LexDomain
>>> lex = LexDomain(2)
>>> Ingress(EPOCH, lex).apply(2)          # epochs < 2  ->  every (t, c) with t < 2
(2, 0)
>>> Egress(lex, EPOCH).apply((1, 4))      # tuples < (1, 4)  ->  the epochs wholly inside: < 1
1
>>> Feedback(lex, lex).apply((1, 4))      # the receiver's counter is the sender's plus one
(1, 5)

New kinds plug in with :func:`register_projection`; a kind that depends on history
(like ``recorded``) gets the sender's checkpoint bounds and the values recorded there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from falkirk.policies.rollback.times import Bound, Domain, EpochDomain, LexDomain, SeqDomain

if TYPE_CHECKING:
    from falkirk.policies.rollback.metadata import Chain


class ProjectionError(ValueError):
    """A projection that does not fit its edge's domains; the message says which kinds do."""


class Projection(ABC):
    """φ(e) for one edge, from ``src`` domain bounds to ``dst`` domain bounds."""

    kind: str = ""
    depends_on_history = False

    def __init__(self, src: Domain, dst: Domain) -> None:
        self.src = src
        self.dst = dst
        self.check_domains()

    def check_domains(self) -> None:
        """Raise :class:`ProjectionError` if this kind cannot join these domains."""

    def apply(self, bound: Bound) -> Bound:
        """φ(e)(f) for the frontier with ``bound``; ∅ ↦ ∅ and ⊤ ↦ ⊤."""
        if bound == self.src.top:
            return self.dst.top
        if bound == self.src.empty:
            return self.dst.empty
        return self.project(bound)

    @abstractmethod
    def project(self, bound: Bound) -> Bound:
        """φ on frontiers other than ∅ and ⊤."""


class Identity(Projection):
    """The same times on both ends (no messages sent backwards in time)."""

    kind = "identity"

    def check_domains(self) -> None:
        if self.src != self.dst or isinstance(self.src, SeqDomain):
            raise ProjectionError(
                f"identity joins equal domains other than seq; here {self.src.describe()} -> {self.dst.describe()} "
                "(use recorded between sequence-number processors)")

    def project(self, bound: Bound) -> Bound:
        return bound


class Ingress(Projection):
    """Epoch t enters a loop as (t, 0, …): bound b ↦ (b, 0, …)."""

    kind = "ingress"

    def check_domains(self) -> None:
        if not (isinstance(self.src, EpochDomain) and isinstance(self.dst, LexDomain)):
            raise ProjectionError(f"ingress goes from epoch to lex, not {self.src.describe()} -> {self.dst.describe()}")

    def project(self, bound: Bound) -> Bound:
        assert isinstance(self.dst, LexDomain)  # check_domains ran when the edge was made
        return (bound,) + (0,) * (self.dst.length - 1)


class Egress(Projection):
    """A loop's (t, c, …) leaves as epoch t; a frontier keeps the epochs wholly inside it."""

    kind = "egress"

    def check_domains(self) -> None:
        if not (isinstance(self.src, LexDomain) and isinstance(self.dst, EpochDomain)):
            raise ProjectionError(f"egress goes from lex to epoch, not {self.src.describe()} -> {self.dst.describe()}")

    def project(self, bound: Bound) -> Bound:
        return bound[0]


class Feedback(Projection):
    """Around a loop the receiver's last coordinate is the sender's plus one."""

    kind = "feedback"

    def check_domains(self) -> None:
        if not (isinstance(self.src, LexDomain) and self.src == self.dst):
            raise ProjectionError(
                f"feedback joins lex domains of equal length, not {self.src.describe()} -> {self.dst.describe()}")

    def project(self, bound: Bound) -> Bound:
        return LexDomain.successor(bound)


class EmptyProjection(Projection):
    """Always ∅: safe for any edge, preserves nothing."""

    kind = "empty"

    def apply(self, bound: Bound) -> Bound:
        return self.dst.top if bound == self.src.top else self.dst.empty

    def project(self, bound: Bound) -> Bound:
        return self.dst.empty


class Recorded(Projection):
    """A history-dependent φ (send counts, epoch↔sequence translators), recorded per checkpoint.

    ``at`` lists the sender's checkpoint bounds in ascending order and ``values`` the φ
    recorded at each. For any other frontier g it uses the value at the largest
    checkpoint ⊆ g, which is safe and monotone (Falkirk Wheel §3.2).
    """

    kind = "recorded"
    depends_on_history = True

    def __init__(self, src: Domain, dst: Domain, at: Sequence[Bound] = (), values: Sequence[Bound] = ()) -> None:
        super().__init__(src, dst)
        if len(at) != len(values):
            raise ProjectionError("recorded: one value per checkpoint")
        self.at = list(at)
        self.values = list(values)
        # Chains of epoch and lex bounds are sorted: look them up by bisection.
        self._sortable = not isinstance(src, SeqDomain)

    def record(self, at: Bound, value: Bound) -> None:
        """Add the value recorded at a new (largest) checkpoint of the sender."""
        self.at.append(at)
        self.values.append(value)

    def project(self, bound: Bound) -> Bound:
        if self._sortable:
            i = bisect_right(self.at, bound) - 1
        else:  # a chain under ⊆: the checkpoints ⊆ bound are a prefix of it
            i = -1
            for j, c in enumerate(self.at):
                if not self.src.subset(c, bound):
                    break
                i = j
        return self.values[i] if i >= 0 else self.dst.empty


class Consumed(Projection):
    """An asset edge between two DAGs: the consumer's run k consumed the producer's epochs S(k),
    as Airflow records the asset events each run of a DAG scheduled on an Asset consumed.

    If the producer keeps its epochs below f, the consumer keeps its runs before the first run
    that consumed an epoch at or above f: φ(f) = min{k : max S(k) ≥ f}, ⊤ when no run did (runs
    not made yet will read the redone epochs). Monotone, since a larger f makes fewer runs stale.

    >>> from falkirk.policies.rollback.times import EPOCH
    >>> consumed = Consumed(EPOCH, EPOCH, {1: {1, 2}, 2: {3}, 3: {4, 5}})
    >>> consumed.apply(3), consumed.apply(4), consumed.apply(6), consumed.apply(0)
    (2, 3, inf, 0)

    It is not a kind a scenario names: it needs the consumption records, and the solver reads
    a history-dependent φ off the sender's chain. :meth:`record_into` writes this φ at each of
    the producer's checkpoints, for an edge of kind ``recorded``.
    """

    kind = "consumed"
    depends_on_history = True

    def __init__(self, src: Domain, dst: Domain, consumed: Mapping[int, Iterable[int]] | None = None) -> None:
        super().__init__(src, dst)
        self.consumed = {int(k): frozenset(int(e) for e in v) for k, v in (consumed or {}).items()}
        # Runs by the latest epoch each consumed, with the first run among those at or after each
        # position: a bound's first stale run is one bisection, not a scan per call.
        latest = sorted((max(v), k) for k, v in self.consumed.items() if v)
        self._latest = [m for m, _ in latest]
        self._first_from: list[int] = []
        for _, run in reversed(latest):
            self._first_from.append(min(run, self._first_from[-1]) if self._first_from else run)
        self._first_from.reverse()

    def check_domains(self) -> None:
        if not (isinstance(self.src, EpochDomain) and isinstance(self.dst, EpochDomain)):
            raise ProjectionError(
                f"consumed joins two epoch domains (a producer DAG's epochs to a consumer DAG's runs); "
                f"here {self.src.describe()} -> {self.dst.describe()}")

    def project(self, bound: Bound) -> Bound:
        i = bisect_left(self._latest, bound)
        return self._first_from[i] if i < len(self._first_from) else self.dst.top

    def record_into(self, chain: Chain, edge_id: str) -> Chain:
        """A copy of the producer's ``chain`` with this φ recorded at each checkpoint under
        ``edge_id``, for an edge of kind ``recorded``.

        >>> from falkirk.policies.rollback.metadata import Chain, Checkpoint
        >>> from falkirk.policies.rollback.times import EPOCH, INF
        >>> producer = Chain(EPOCH, [Checkpoint(0), Checkpoint(3), Checkpoint(INF)])
        >>> [c.phi["asset"] for c in Consumed(EPOCH, EPOCH, {1: {1, 2}, 2: {3}}).record_into(producer, "asset")]
        [0, 2, inf]
        """
        from dataclasses import replace

        recorded = chain.copy()
        recorded.checkpoints = [replace(c, phi={**c.phi, edge_id: self.apply(c.f)}) for c in chain]
        return recorded


ProjectionFactory = Callable[[Domain, Domain], Projection]
_KINDS: dict[str, ProjectionFactory] = {}


def register_projection(kind: str, factory: ProjectionFactory) -> None:
    """Make a new φ kind available to scenarios and the solver by name."""
    _KINDS[kind] = factory


def projection_kinds() -> list[str]:
    return sorted(_KINDS)


def make_projection(kind: str, src: Domain, dst: Domain) -> Projection:
    """The projection of ``kind`` between two domains (raises :class:`ProjectionError`)."""
    factory = _KINDS.get(kind)
    if factory is None:
        raise ProjectionError(f"unknown phi {kind!r}; use one of {', '.join(projection_kinds())}")
    return factory(src, dst)


for _cls in (Identity, Ingress, Egress, Feedback, EmptyProjection, Recorded):
    register_projection(_cls.kind, _cls)
