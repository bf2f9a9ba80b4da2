"""The consistent-rollback solver: the Figure 6 fixed point of the Falkirk Wheel (§3.5).

Given every processor's F*(p) (a :class:`~falkirk.policies.rollback.metadata.Chain`), choose f(p) ∈ F*(p)
and a notification frontier f_n(p) so that

* C2: D̄(e, f(p)) ⊆ f(dst e) for every output edge e of p;
* C3: M̄(d, f(p)) ⊆ φ(d)(f(src d)) for every input edge d;
* C4 (when notifications are on): f_n(p) ⊆ f(p), N̄(p, f(p)) ⊆ f_n(p) and
  f_n(p) ⊆ φ(d)(f_n(src d)) for every input edge d.

The answer is the **greatest** such choice. It exists and is unique because every
constraint has the form monotone(x) ⊆ monotone(y) over chains, and descending from the
top reaches it in any visiting order. This module iterates with a worklist: a processor
is revisited only when a neighbour's f or f_n changed, so the work follows the damage.

Incremental updates reuse the previous answer:

* :meth:`Solver.fail` (a processor loses ⊤): the new answer lies below the old one, so
  descending from the old answer is exact;
* :meth:`Solver.add_checkpoint`: the new answer lies above the old one, and only
  processors linked to the new checkpoint's processor through processors that can rise
  may change; those restart from the top of their chains and the rest keep their values.

>>> from falkirk.policies.rollback.graph import Edge, Graph, Processor
>>> from falkirk.policies.rollback.metadata import Chain, Checkpoint
>>> from falkirk.policies.rollback.times import EPOCH, INF
>>> g = Graph([Processor("u", EPOCH), Processor("v", EPOCH, failed=True)], [Edge("e", "u", "v")])
>>> chains = {
...     "u": Chain(EPOCH, [Checkpoint(0, N=0, D={"e": 0}), Checkpoint(2, N=0, D={"e": 1}),
...                        Checkpoint(INF, N=0, D={"e": 3})]),
...     "v": Chain(EPOCH, [Checkpoint(0, M={"e": 0}, N=0), Checkpoint(2, M={"e": 2}, N=0)], failed=True),
... }
>>> answer = Solver(g, chains, notifications=False).solve()
>>> answer.index, answer.bound("u"), answer.bound("v")
({'u': 1, 'v': 1}, 2, 2)
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from falkirk.policies.rollback.graph import Edge, Graph
from falkirk.policies.rollback.metadata import Chain, Checkpoint
from falkirk.policies.rollback.projections import Projection, Recorded, make_projection
from falkirk.policies.rollback.times import Bound


class SolverError(ValueError):
    """A problem the solver cannot take as given; the message names the processor or edge."""


@dataclass(frozen=True)
class Solution:
    """The greatest consistent frontiers: an index into each F*(p), and f_n(p)."""

    index: Mapping[str, int]
    notification: Mapping[str, Bound]
    chains: Mapping[str, Chain]
    visits: int = 0

    def bound(self, pid: str) -> Bound:
        """The bound of f(pid)."""
        return self.chains[pid][self.index[pid]].f

    def checkpoint(self, pid: str) -> Checkpoint:
        return self.chains[pid][self.index[pid]]


class Solver:
    """Holds one rollback problem and its current answer; see the module docstring."""

    def __init__(self, graph: Graph, chains: Mapping[str, Chain], notifications: bool = True) -> None:
        self.graph = graph
        self.notifications = notifications
        self.chains: dict[str, Chain] = {}
        for p in graph.processors:
            if p.id not in chains:
                raise SolverError(f"processor {p.id!r} has no checkpoint chain")
            self.chains[p.id] = chains[p.id].copy()  # the caller's chains stay as they are
        self.phi: dict[str, Projection] = {}
        for e in graph.edges:
            src, dst = graph.processor(e.src).domain, graph.processor(e.dst).domain
            phi = make_projection(e.phi, src, dst)
            if isinstance(phi, Recorded):
                self._record(phi, e)
            self.phi[e.id] = phi
        self._in = {pid: graph.in_edges(pid) for pid in graph.ids()}
        self._out = {pid: graph.out_edges(pid) for pid in graph.ids()}
        self._domain = {p.id: p.domain for p in graph.processors}
        # Hot-loop views: per processor, (edge, receiver, receiver's ⊆) for C2 and
        # (edge, sender, φ or None for identity) for C3/C4.
        self._c2 = {pid: [(e.id, e.dst, self._domain[e.dst].subset) for e in self._out[pid]] for pid in graph.ids()}
        self._c34 = {pid: [(e.id, e.src, None if e.phi == "identity" else self.phi[e.id].apply)
                           for e in self._in[pid]] for pid in graph.ids()}
        self.index: dict[str, int] = {}
        self.f: dict[str, Bound] = {}  # the bound of the chosen checkpoint, kept with index
        self.fn: dict[str, Bound] = {}
        self.visits = 0

    def _record(self, phi: Recorded, edge: Edge) -> None:
        phi.at, phi.values = [], []
        for i, c in enumerate(self.chains[edge.src]):
            if c.f == phi.src.top:
                continue  # φ(⊤) = ⊤ whatever was stored
            if edge.id not in c.phi:
                raise SolverError(f"processor {edge.src!r} checkpoint {i}: edge {edge.id!r} is recorded "
                                  f"but its φ value is missing")
            phi.record(c.f, c.phi[edge.id])

    # -- the fixed point --------------------------------------------------------------

    def solve(self, order: Iterable[str] | None = None) -> Solution:
        """Solve from the top of every chain, visiting processors first in ``order``."""
        for pid, chain in self.chains.items():
            self._choose(pid, len(chain) - 1)
            self.fn[pid] = chain[-1].f if self.notifications else self._domain[pid].empty
        return self._run(list(order) if order is not None else self.graph.ids())

    def fail(self, pid: str) -> Solution:
        """``pid`` has failed: it keeps only its persisted checkpoints. Updates the answer incrementally."""
        self._require_solved()
        # A new chain object: a Solution handed out earlier keeps the chain it was solved on.
        chain = self.chains[pid].without_top() if self.chains[pid].has_top else self.chains[pid].copy()
        chain.failed = True
        self.chains[pid] = chain
        top = len(chain) - 1
        if self.index[pid] > top:
            self._choose(pid, top)
            if self.notifications:
                dom = self._domain[pid]
                self.fn[pid] = dom.meet(self.fn[pid], chain[top].f)
        return self._run([pid, *self.graph.neighbours(pid)])

    def add_checkpoint(self, pid: str, checkpoint: Checkpoint) -> Solution:
        """``pid`` persisted a new (largest) checkpoint. Updates the answer incrementally."""
        self._require_solved()
        chain = self.chains[pid].copy()  # copy on write: an earlier Solution keeps its chain
        at_top = chain.has_top and self.index[pid] == len(chain) - 1
        chain.append(checkpoint)
        self.chains[pid] = chain
        if at_top:
            self._choose(pid, self.index[pid] + 1)  # the new checkpoint went in below ⊤
        for e in self._out[pid]:
            phi = self.phi[e.id]
            if isinstance(phi, Recorded):
                self._record(phi, e)
        if self.index[pid] == len(chain) - 1 and not self._can_rise(pid):
            return self._solution()  # pid keeps ⊤: nothing can change
        # Only processors that rise can change, and they are linked to pid through others
        # that rise. Grow the region from pid, leaving out every processor proven unable
        # to rise (see _stuck); then raise the region to its tops and descend again while
        # the rest keep their values.
        proofs: dict[str, bool] = {}
        region, todo = {pid}, [pid]
        while todo:
            for q in self.graph.neighbours(todo.pop()):
                if q not in region and not self._stuck(q, pid, proofs, set()):
                    region.add(q)
                    todo.append(q)
        for q in region:
            top = self.chains[q]
            self._choose(q, len(top) - 1)
            if self.notifications:
                self.fn[q] = top[-1].f
        frontier = set(region)
        for q in region:
            frontier.update(self.graph.neighbours(q))
        return self._run(sorted(frontier))  # sorted: a deterministic order, without a scan of the graph

    def _stuck(self, q: str, source: str, proofs: dict[str, bool], path: set[str]) -> bool:
        """Whether q provably keeps its f and f_n after ``source`` gains a checkpoint.

        q's f cannot rise if its next candidate fails a constraint against a neighbour that
        is itself stuck (that neighbour keeps its value, so the constraint keeps failing, and
        consistency only gets harder up the chain). q's f_n cannot rise if it equals f, or
        if a sender that binds it (φ(f_n(src)) = f_n(q), in a totally ordered domain) is stuck.
        Proofs are memoised; a processor on the current proof path counts as not stuck.
        """
        if q in proofs:
            return proofs[q]
        if q == source or q in path or len(path) > 200:  # a proof cut short is just "not proven"
            return False
        path.add(q)
        chain = self.chains[q]
        i = self.index[q]
        f_stuck = i == len(chain) - 1 or any(
            self._stuck(r, source, proofs, path) for r in self._blockers(q, chain[i + 1]))
        fn_stuck = True
        if f_stuck and self.notifications and self.fn[q] != self.f[q]:
            fn_stuck = False
            if self._domain[q].kind != "seq":
                for _, src, phi in self._c34[q]:
                    bound = self.fn[src] if phi is None else phi(self.fn[src])
                    if bound == self.fn[q] and self._stuck(src, source, proofs, path):
                        fn_stuck = True
                        break
        path.discard(q)
        proofs[q] = f_stuck and fn_stuck
        return proofs[q]

    def _blockers(self, pid: str, g: Checkpoint) -> Iterator[str]:
        """The neighbours against which candidate ``g`` of ``pid`` fails a constraint (lazily):
        the one place the constraints are written."""
        f, fn = self.f, self.fn
        for eid, dst, subset in self._c2[pid]:  # C2: D̄(e, g) ⊆ f(dst e)
            bar = g.D.get(eid)
            if bar is not None and not subset(bar, f[dst]):
                yield dst
        subset = self._domain[pid].subset
        n_bar = g.N if self.notifications else None
        for eid, src, phi in self._c34[pid]:
            bar = g.M.get(eid)
            if bar is not None and not subset(bar, f[src] if phi is None else phi(f[src])):  # C3
                yield src
            elif n_bar is not None and not subset(n_bar, fn[src] if phi is None else phi(fn[src])):  # C4
                yield src

    def _can_rise(self, pid: str) -> bool:
        chain = self.chains[pid]
        i = self.index[pid]
        return i < len(chain) - 1 or (self.notifications and self.fn[pid] != chain[i].f)

    def _require_solved(self) -> None:
        if not self.index:
            raise SolverError("call solve() before an incremental update")

    def _run(self, start: list[str]) -> Solution:
        # Any visiting order reaches the same answer; visiting the processors that sit
        # lowest first lets the tightest constraints spread once instead of in many
        # small steps (a heap keyed by the epoch part of the current frontier).
        self.visits = 0  # per operation: a full solve or one incremental update
        heap = [(self._rank(pid), n, pid) for n, pid in enumerate(start)]
        heapq.heapify(heap)
        queued = set(start)
        tick = len(heap)
        while heap:
            _, _, pid = heapq.heappop(heap)
            queued.discard(pid)
            self.visits += 1
            f_changed, fn_changed = self._visit(pid)
            if f_changed:
                # C2 of upstream processors reads f(pid); C3 of downstream ones reads φ(f(pid)).
                wake = [e.src for e in self._in[pid]] + [e.dst for e in self._out[pid]]
            elif fn_changed:
                wake = [e.dst for e in self._out[pid]]  # C4 downstream reads φ(f_n(pid))
            else:
                continue
            for q in wake:
                if q not in queued:
                    queued.add(q)
                    tick += 1
                    heapq.heappush(heap, (self._rank(q), tick, q))
        return self._solution()

    def _solution(self) -> Solution:
        return Solution(dict(self.index), dict(self.fn), dict(self.chains), self.visits)

    def _rank(self, pid: str) -> float:
        """A visiting priority: the epoch part of f(pid) (a heuristic; never affects the answer)."""
        b = self.f[pid]
        if isinstance(b, tuple):
            return b[0] if self._domain[pid].kind == "lex" else min(b)
        return b

    def _choose(self, pid: str, i: int) -> None:
        self.index[pid] = i
        self.f[pid] = self.chains[pid][i].f

    def _visit(self, pid: str) -> tuple[bool, bool]:
        chain = self.chains[pid].checkpoints
        dom = self._domain[pid]
        i = self.index[pid]
        if i > 0 and not self._consistent(pid, chain[i]):
            # Metadata never shrinks along a chain, so the consistent candidates below the
            # current one form a prefix (∅ always passes): bisect for its last element.
            lo, hi = 0, i - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._consistent(pid, chain[mid]):
                    lo = mid
                else:
                    hi = mid - 1
            i = lo
        gn = dom.empty
        if self.notifications:
            fn = self.fn
            gn = dom.meet(chain[i].f, fn[pid])
            for _, src, phi in self._c34[pid]:
                gn = dom.meet(gn, fn[src] if phi is None else phi(fn[src]))
        f_changed = i != self.index[pid]
        fn_changed = gn != self.fn[pid]
        if f_changed:
            self._choose(pid, i)
        self.fn[pid] = gn
        return f_changed, fn_changed

    def _consistent(self, pid: str, g: Checkpoint) -> bool:
        """C2, C3 and the necessary part of C4 for candidate ``g`` of ``pid``: no neighbour blocks it."""
        for _ in self._blockers(pid, g):
            return False
        return True


def solve(graph: Graph, chains: Mapping[str, Chain], notifications: bool = True,
          order: Iterable[str] | None = None) -> Solution:
    """The greatest consistent frontiers of a rollback problem (a one-shot :class:`Solver`)."""
    return Solver(graph, chains, notifications).solve(order)
