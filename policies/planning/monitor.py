"""The monitor: low-watermarks and what they let the system forget (Falkirk Wheel §4.2-4.3).

The low-watermark of p is the frontier the solver chooses when **no** processor offers ⊤:
p will never roll back further, whatever fails. When it rises to f:

* p may drop Ξ(p, f′) and S(p, f′) for every checkpoint f′ ⊊ f (f itself is kept);
* each sender on an input edge d of p may trim from L(d, ·) the messages at times in f;
* an input processor acknowledges the external inputs it ingested at times in f.

In the example, i discards what it sends (D̄ = f), so it waits for o to acknowledge.
:class:`Monitor` keeps the chains and updates the watermarks incrementally as
checkpoints are reported.

>>> from falkirk.policies.rollback.times import EPOCH
>>> from falkirk.policies.rollback.graph import Edge, Graph, Processor
>>> from falkirk.policies.rollback.metadata import Chain, Checkpoint
>>> g = Graph([Processor("i", EPOCH), Processor("o", EPOCH)], [Edge("e", "i", "o")])
>>> m = Monitor(g, {"i": Chain(EPOCH, [Checkpoint(0, N=0, D={"e": 0}), Checkpoint(2, N=0, D={"e": 2})]),
...                 "o": Chain(EPOCH, [Checkpoint(0, M={"e": 0}, N=0)])}, notifications=False)
>>> m.watermarks()
{'i': 0, 'o': 0}
>>> m.report("o", Checkpoint(2, M={"e": 2}, N=0))   # o acknowledged epochs < 2: both rise
{'i': 2, 'o': 2}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.chains import TaskGraph, chains_from_ledger, reads_back
from falkirk.policies.rollback.graph import Graph
from falkirk.policies.rollback.metadata import Chain, Checkpoint
from falkirk.policies.rollback.solver import Solution, Solver
from falkirk.policies.rollback.times import EPOCH, Bound
from falkirk.policies.store.ledger import LedgerEntry
from falkirk.policies.store.readability import Readable


def low_watermarks(graph: Graph, chains: Mapping[str, Chain], notifications: bool = True) -> Solution:
    """The greatest consistent frontiers with no ⊤ anywhere (persisted checkpoints only).

    >>> from falkirk.policies.rollback.times import EPOCH, INF
    >>> from falkirk.policies.rollback.graph import Graph, Processor
    >>> g = Graph([Processor("p", EPOCH)], [])
    >>> low_watermarks(g, {"p": Chain(EPOCH, [Checkpoint(0, N=0), Checkpoint(3, N=3), Checkpoint(INF, N=5)])}).bound("p")
    3
    """
    return Solver(graph, {p: c.without_top() for p, c in chains.items()}, notifications).solve()


@dataclass(frozen=True)
class Garbage:
    """What a set of low-watermarks makes collectable."""

    drop_checkpoints: Mapping[str, list[int]]  # per processor, indexes into F*(p) below the watermark
    trim_logs: Mapping[str, Bound]  # per edge: its log may drop messages at times (receiver's domain) in this frontier
    acknowledge: Mapping[str, Bound]  # per input processor (no input edges): inputs at these times are done


def garbage(graph: Graph, solution: Solution) -> Garbage:
    """The checkpoints, log entries and inputs that the low-watermarks in ``solution`` release.

    >>> from falkirk.policies.rollback.times import EPOCH
    >>> from falkirk.policies.rollback.graph import Edge, Graph, Processor
    >>> g = Graph([Processor("i", EPOCH), Processor("o", EPOCH)], [Edge("e", "i", "o")])
    >>> chains = {"i": Chain(EPOCH, [Checkpoint(0, N=0, D={"e": 0}), Checkpoint(2, N=0, D={"e": 0})]),
    ...           "o": Chain(EPOCH, [Checkpoint(0, M={"e": 0}, N=0), Checkpoint(1, M={"e": 1}, N=0)])}
    >>> gc = garbage(g, low_watermarks(g, chains, notifications=False))
    >>> gc.drop_checkpoints, gc.trim_logs, gc.acknowledge
    ({'i': [0], 'o': [0]}, {'e': 1}, {'i': 2})
    """
    drop = {pid: list(range(solution.index[pid])) for pid in graph.ids()}
    trim = {e.id: solution.bound(e.dst) for e in graph.edges}
    ack = {pid: solution.bound(pid) for pid in graph.ids() if not graph.in_edges(pid)}
    return Garbage(drop, trim, ack)


class Monitor:
    """Low-watermarks kept up to date as processors report persisted checkpoints."""

    def __init__(self, graph: Graph, chains: Mapping[str, Chain], notifications: bool = True) -> None:
        self.graph = graph
        self.solver = Solver(graph, {p: c.without_top() for p, c in chains.items()}, notifications)
        self.solution = self.solver.solve()

    def watermarks(self) -> dict[str, Bound]:
        return {pid: self.solution.bound(pid) for pid in self.graph.ids()}

    def report(self, pid: str, checkpoint: Checkpoint) -> dict[str, Bound]:
        """Record Ξ(pid, f) once storage has acknowledged it; returns the new low-watermarks."""
        self.solution = self.solver.add_checkpoint(pid, checkpoint)
        return self.watermarks()

    def garbage(self) -> Garbage:
        return garbage(self.graph, self.solution)


def acknowledged_inputs(entries: Iterable[LedgerEntry], readable: Readable,
                        graph: TaskGraph | None = None) -> dict[ProcessorId, int]:
    """Per source task of a DAG (one with no inputs), the last epoch of external input it may
    acknowledge: every epoch at or below it is inside the source's low-watermark, so no
    recovery can ever ask for it again. ``0`` acknowledges nothing.

    ``readable`` should count only durable copies (see :func:`falkirk.policies.store.readability.durable_only`). ``graph`` is
    the DAG's: pass it, since the ledger knows only the tasks that have committed, and a
    consumer that has not committed yet must hold its source back (the default, the graph
    the ledger shows, is only right once every task has run).

    >>> from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef
    >>> def row(task, epoch, regime, inputs=(), state=None):
    ...     return LedgerEntry(dag_id="d", task_id=task, epoch=epoch, regime=regime, run_id=f"epoch-{epoch}", try_number=1, state_uri=state,
    ...                        outputs=(OutputRef("output", f"/scratch/{task}", "scratch", epoch, 1),),
    ...                        inputs=tuple(InputRef(task_id=t, output="output", through=epoch) for t in inputs))
    >>> rows = [row("src", e, "ephemeral") for e in (1, 2, 3)]
    >>> rows += [row("agg", e, "lazy_checkpoint(every=2)", ["src"], "/durable/agg" if e == 2 else "/scratch/agg")
    ...          for e in (1, 2, 3)]
    >>> durable = lambda uri, key: not uri.startswith("/scratch")
    >>> acknowledged_inputs(rows, durable)  # agg may roll back to 2
    {'src': 2}
    >>> from falkirk.policies.planning.chains import DataEdge, TaskGraph
    >>> dag = TaskGraph(("src", "agg"), (DataEdge("src", "output", "agg"),))
    >>> acknowledged_inputs([r for r in rows if r.task_id == "src"], durable, dag)  # agg has not run yet
    {'src': 0}
    """
    rows = list(entries)
    if graph is None:
        if not rows:
            return {}
        graph = TaskGraph.from_ledger(rows)
    chains = chains_from_ledger(rows, graph, readable)
    solved = low_watermarks(graph.solver_graph(), chains)
    sources = [t for t in graph.tasks if not any(e.dst == t for e in graph.edges)]
    acks = {t: max(EPOCH.last_through(solved.bound(t)), 0) for t in sources}
    # A consumer reading a window of ``b`` earlier epochs may roll back to its watermark and
    # then read ``b`` epochs below it again: the source keeps those too.
    back = reads_back(rows)
    for (src, _, dst), b in back.items():
        if src in acks and b:
            acks[src] = max(min(acks[src], EPOCH.last_through(solved.bound(dst)) - b), 0)
    return acks


def inputs_to_reopen(entries: Iterable[LedgerEntry], readable: Readable, bad_epoch: int,
                     graph: TaskGraph | None = None) -> dict[ProcessorId, int]:
    """Per source task, the first epoch of external input its source must hold again while a
    recovery of ``bad_epoch`` (an input found wrong, ``falkirk plan --bad-epoch``) runs.

    Acknowledgements assume the inputs were right. A bad epoch's recovery rolls the tasks back
    to before it, below the watermarks the source was acknowledged by, and a fault during that
    recovery (a lost worker) can take every scratch copy with it: the recovery may then read
    again anything the checkpoints older than ``bad_epoch`` alone could not acknowledge. Same
    arguments as :func:`acknowledged_inputs`.

    >>> from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef
    >>> def row(task, epoch, regime, inputs=(), state=None):
    ...     return LedgerEntry(dag_id="d", task_id=task, epoch=epoch, regime=regime, run_id=f"epoch-{epoch}", try_number=1, state_uri=state,
    ...                        outputs=(OutputRef("output", f"/scratch/{task}", "scratch", epoch, 1),),
    ...                        inputs=tuple(InputRef(task_id=t, output="output", through=epoch) for t in inputs))
    >>> rows = [row("src", e, "ephemeral") for e in range(1, 8)]
    >>> rows += [row("agg", e, "lazy_checkpoint(every=3)", ["src"], "/durable/agg" if e % 3 == 0 else "/scratch/agg")
    ...          for e in range(1, 8)]
    >>> durable = lambda uri, key: not uri.startswith("/scratch")
    >>> acknowledged_inputs(rows, durable)  # agg may roll back to 6
    {'src': 6}
    >>> inputs_to_reopen(rows, durable, bad_epoch=6)  # to 3, reading src from 4 again
    {'src': 4}
    """
    before = [e for e in entries if e.epoch < bad_epoch]
    return {task: acked + 1 for task, acked in acknowledged_inputs(before, readable, graph).items()}
