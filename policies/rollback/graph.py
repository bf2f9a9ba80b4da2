"""The dataflow graph: processors with time domains, edges with projections.

>>> from falkirk.policies.rollback.times import EPOCH
>>> g = Graph([Processor("u", EPOCH), Processor("v", EPOCH)], [Edge("e", "u", "v", "identity")])
>>> [e.id for e in g.out_edges("u")], [e.id for e in g.in_edges("v")], g.neighbours("v")
(['e'], ['e'], ('u',))
"""

from __future__ import annotations

from dataclasses import dataclass, field

from falkirk.policies.rollback.times import Domain


class GraphError(ValueError):
    """A graph that does not hold together; the message names the processor or edge."""


@dataclass(frozen=True)
class Processor:
    """A processor p: in Airflow terms a task (or one mapped instance of it)."""

    id: str
    domain: Domain
    failed: bool = False


@dataclass(frozen=True)
class Edge:
    """A channel from ``src`` to ``dst`` whose φ is of kind ``phi`` (see :mod:`falkirk.policies.rollback.projections`)."""

    id: str
    src: str
    dst: str
    phi: str = "identity"


@dataclass
class Graph:
    """Processors and edges, with each processor's input and output edges indexed."""

    processors: list[Processor]
    edges: list[Edge]
    _by_id: dict[str, Processor] = field(init=False, repr=False)
    _in: dict[str, list[Edge]] = field(init=False, repr=False)
    _out: dict[str, list[Edge]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_id = {}
        for p in self.processors:
            if p.id in self._by_id:
                raise GraphError(f"processor id {p.id!r} is used twice")
            self._by_id[p.id] = p
        self._in = {p.id: [] for p in self.processors}
        self._out = {p.id: [] for p in self.processors}
        seen: set[str] = set()
        for e in self.edges:
            if e.id in seen:
                raise GraphError(f"edge id {e.id!r} is used twice")
            seen.add(e.id)
            for end in (e.src, e.dst):
                if end not in self._by_id:
                    raise GraphError(f"edge {e.id!r} names unknown processor {end!r}")
            self._out[e.src].append(e)
            self._in[e.dst].append(e)

    def processor(self, pid: str) -> Processor:
        return self._by_id[pid]

    def ids(self) -> list[str]:
        return [p.id for p in self.processors]

    def in_edges(self, pid: str) -> list[Edge]:
        return self._in[pid]

    def out_edges(self, pid: str) -> list[Edge]:
        return self._out[pid]

    def neighbours(self, pid: str) -> tuple[str, ...]:
        """Processors joined to ``pid`` by an edge either way (the only ones its constraints mention)."""
        seen = dict.fromkeys([e.src for e in self._in[pid]] + [e.dst for e in self._out[pid]])
        return tuple(seen)
