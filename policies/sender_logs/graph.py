"""The data graph's conditions for sender-side logs (Smith & Watson, CS-TR-836 §IV.A-C).

The protocol is defined for **uniform** graphs: between two tasks every walk has the same
length, their distance. Such a graph is covered by overlapping slices of thickness 2: each task
``c`` with inputs and outputs is the **central** task of a segment whose sources are the tasks
it reads and whose sinks are the tasks that read it. A producer ``u`` retains the blocks it
sent on an edge ``u -> c`` until every **slice sink** of that edge (the tasks two hops from
``u`` through ``c``; ``c`` itself when nothing reads it) has acknowledged them.

:func:`check_uniform` refuses a graph the protocol cannot run on, naming the pair of tasks and
the lengths of their walks (or the cycle), and returns the segments otherwise.

>>> segments = check_uniform([("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")])  # a diamond
>>> [(s.central, s.sources, s.sinks) for s in segments]
[('B', ('A',), ('D',)), ('C', ('A',), ('D',))]
>>> slice_sinks([("A", "B"), ("B", "C")], ("A", "B")), slice_sinks([("A", "B"), ("B", "C")], ("B", "C"))
(('C',), ('C',))
>>> check_uniform([("A", "B"), ("B", "D"), ("A", "D")])
Traceback (most recent call last):
...
falkirk.policies.sender_logs.graph.GraphError: data edges from A to D: walks of lengths [1, 2] (A -> D; A -> B -> D). Sender-side logs need every walk between two tasks to have the same length (a uniform graph): drop the edge A >> D, or route it through a task so that both walks have the same length
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Edge = tuple[str, str]


class GraphError(ValueError):
    """The data graph breaks a condition of the protocol; the message names the tasks and the fix."""


@dataclass(frozen=True)
class Segment:
    """A slice of thickness 2 around one central task: what it reads from and what reads it."""

    central: str
    sources: tuple[str, ...]
    sinks: tuple[str, ...]


def _adjacency(edges: Sequence[Edge]) -> tuple[list[str], dict[str, list[str]]]:
    tasks: list[str] = []
    down: dict[str, list[str]] = {}
    for u, v in edges:
        for t in (u, v):
            if t not in down:
                tasks.append(t)
                down[t] = []
        if v not in down[u]:
            down[u].append(v)
    return tasks, down


def _cycle(tasks: list[str], down: dict[str, list[str]]) -> list[str] | None:
    """One cycle of the graph (its tasks, the first repeated at the end), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(t: str) -> list[str] | None:
        state[t] = 1
        path.append(t)
        for v in down[t]:
            if state.get(v) == 1:
                return path[path.index(v):] + [v]
            if v not in state and (found := visit(v)) is not None:
                return found
        path.pop()
        state[t] = 2
        return None

    for t in tasks:
        if t not in state and (found := visit(t)) is not None:
            return found
    return None


def walk_lengths(edges: Iterable[Edge]) -> dict[Edge, dict[int, tuple[str, ...]]]:
    """Per pair of tasks joined by a walk, each length of walk between them with one walk of
    that length (an acyclic graph: a cyclic one has walks of every length).

    >>> walk_lengths([("A", "B"), ("B", "C")])[("A", "C")]
    {2: ('A', 'B', 'C')}
    """
    tasks, down = _adjacency(list(edges))
    if (cycle := _cycle(tasks, down)) is not None:
        raise GraphError(f"data edges form a cycle {' >> '.join(cycle)}: sender-side logs need an acyclic graph "
                         f"(a walk round a cycle has every length); remove one of its edges")
    found: dict[str, dict[str, dict[int, tuple[str, ...]]]] = {}

    def from_task(u: str) -> dict[str, dict[int, tuple[str, ...]]]:
        if u not in found:
            walks: dict[str, dict[int, tuple[str, ...]]] = {}
            for v in down[u]:
                walks.setdefault(v, {}).setdefault(1, (u, v))
                for w, by_length in from_task(v).items():
                    for n, walk in by_length.items():
                        walks.setdefault(w, {}).setdefault(n + 1, (u, *walk))
            found[u] = walks
        return found[u]

    return {(u, v): dict(sorted(by_length.items())) for u in tasks for v, by_length in from_task(u).items()}


def check_uniform(edges: Iterable[Edge]) -> tuple[Segment, ...]:
    """The segments of a uniform data graph (one per task with inputs and outputs, in the order
    tasks first appear in ``edges``); raises :class:`GraphError` naming the first pair of tasks
    whose walks differ in length, or a cycle."""
    edges = list(edges)
    for (u, v), by_length in walk_lengths(edges).items():
        if len(by_length) > 1:
            walks = "; ".join(" -> ".join(w) for w in by_length.values())
            direct = (u, v) in edges
            fix = (f"drop the edge {u} >> {v}, or route it through a task" if direct
                   else "route the shorter walk through more tasks, or read the data from one walk only")
            raise GraphError(f"data edges from {u} to {v}: walks of lengths {sorted(by_length)} ({walks}). Sender-side "
                             f"logs need every walk between two tasks to have the same length (a uniform graph): "
                             f"{fix} so that both walks have the same length")
    tasks, down = _adjacency(edges)
    up = {t: [u for u in tasks if t in down[u]] for t in tasks}
    return tuple(Segment(t, tuple(up[t]), tuple(down[t])) for t in tasks if up[t] and down[t])


def slice_sinks(edges: Iterable[Edge], edge: Edge) -> tuple[str, ...]:
    """The tasks whose acknowledgements let ``edge``'s producer prune a block: those two hops
    away through the edge's consumer, or the consumer itself when nothing reads it (a graph sink)."""
    tasks, down = _adjacency(list(edges))
    u, c = edge
    if u not in down or c not in down[u]:
        raise GraphError(f"{u} >> {c} is not a data edge of the graph; its edges are "
                         f"{[(a, b) for a in tasks for b in down[a]]}")
    return tuple(down[c]) or (c,)


__all__ = ["Edge", "GraphError", "Segment", "check_uniform", "slice_sinks", "walk_lengths"]
