"""Acknowledgements and retention: which blocks a producer's edge still has to keep.

A producer ``u`` retains every block it sent on an edge ``u -> c`` until each slice sink of
the edge (:func:`~falkirk.policies.sender_logs.graph.slice_sinks`) has acknowledged it. A sink
acknowledges ``u``'s block ``s`` once ``c`` has released it (its release policy: the block no
longer matters to ``c``'s state) **and** the sink has committed its own output of the ``c``
epoch that carried that release; never before its commit, or a failure between the two would
lose the block (Smith & Watson, CS-TR-836 §IV.A). Acknowledgements are cumulative: the newest
seq acknowledged covers every older one, and an older acknowledgement changes nothing.

Acknowledgements go straight to a control table, one row per (edge, sink, seq), rather than
relayed back along the marker's path: the graph is static, so the producer knows its sinks
(Smith & Watson, CS-TR-836 §IV.A, its first option).

>>> acks = Acknowledgements.none().record(("ingest", "clean"), "enrich", 4)
>>> acks.prune_point(("ingest", "clean"), sinks=("enrich",))
4
>>> retained([3, 4, 5, 6], acks.prune_point(("ingest", "clean"), sinks=("enrich",)))
[5, 6]
>>> acks.record(("ingest", "clean"), "enrich", 2) == acks  # cumulative: an older one changes nothing
True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from falkirk.policies.sender_logs.graph import Edge


@dataclass(frozen=True)
class Acknowledgements:
    """Per (edge, slice sink), the newest seq of the edge's producer the sink has acknowledged."""

    newest: tuple[tuple[Edge, str, int], ...] = ()

    @classmethod
    def none(cls) -> Acknowledgements:
        return cls()

    def of(self, edge: Edge, sink: str) -> int:
        """The newest seq of ``edge`` acknowledged by ``sink`` (0: none)."""
        return next((s for e, k, s in self.newest if e == edge and k == sink), 0)

    def record(self, edge: Edge, sink: str, seq: int) -> Acknowledgements:
        """These acknowledgements with ``sink``'s of ``edge`` through ``seq`` (a new value; the
        same one when ``seq`` is not newer)."""
        if seq <= self.of(edge, sink):
            return self
        kept = tuple(row for row in self.newest if not (row[0] == edge and row[1] == sink))
        return Acknowledgements(tuple(sorted((*kept, (edge, sink, seq)))))

    def prune_point(self, edge: Edge, sinks: Iterable[str]) -> int:
        """The newest seq every one of ``sinks`` has acknowledged: ``edge``'s blocks up to it may go."""
        return min((self.of(edge, s) for s in sinks), default=0)


def acknowledged(released_at: Mapping[int, int], committed_through: int) -> int:
    """The seq of a producer ``u`` a slice sink acknowledges, from what the central task ``c``
    released: ``released_at[e]`` is the newest ``u`` seq ``c``'s epoch ``e`` released, and the
    sink has committed its output of ``c``'s epochs through ``committed_through``.

    >>> acknowledged({1: 0, 2: 0, 3: 3}, committed_through=2), acknowledged({1: 0, 2: 0, 3: 3}, 3)
    (0, 3)
    """
    return max((r for e, r in released_at.items() if e <= committed_through), default=0)


def retained(seqs: Iterable[int], prune_point: int) -> list[int]:
    """The blocks an edge keeps: those after its prune point, in seq order."""
    return sorted(s for s in seqs if s > prune_point)


__all__ = ["Acknowledgements", "acknowledged", "retained"]
