"""Ξ(p, f) and F*(p) computed from the ledger and what the store can still read.

The solver (:mod:`falkirk.policies.rollback.solver`) needs, for every task, the chain of checkpoints it
could restore to and each checkpoint's metadata. A pipeline's ledger records every
(task, epoch) commit; this module turns those rows into exactly that, in the epoch
domain (a checkpoint after epoch t is the frontier ↓{t}, bound ``t + 1``):

* **F*(p)**: ∅, then every committed epoch whose checkpoint can still be restored. A
  stateless task (Ephemeral, Batch) restores to any completed epoch: it has no state to
  load. A stateful task restores to an epoch only while the state table its ledger row
  points at still holds that epoch (a scratch copy may be gone with its worker). The
  frontier after epoch t holds every epoch up to t, so the chain stops at the first
  epoch without a row (a failed task instance): later rows are not frontiers.
* **M̄(d, f)**: the last epoch of input d the task consumed, as the runtime recorded it.
  A task that sends records to an external system (an output with tier ``external``) keeps
  no state, but its epoch counts as a checkpoint only once that system has accepted the
  epoch's records (Falkirk Wheel §4.3, outputs): F*(o) = ∅ plus the delivered epochs. The
  ``Readable`` answers for the external destination from the ledger's deliveries.
* **N̄(p, f)**: the last epoch whose completion the task acted on (Airflow starts a task's
  epoch only once its upstream epochs are complete).
* **D̄(e, f)**: computed here, not taken from the commit: the last epoch ≤ f whose rows on
  e can no longer be read. An output that went to scratch but is still readable counts
  as logged; one whose scratch copy is gone, or that was never written, counts as
  discarded. This is exact (Falkirk Wheel §3.4), where the coarse D̄ := f would force upstream
  tasks to roll back needlessly (with D̄ approximated by the frontier, Falkirk Wheel §3.4).

The graph comes from the pipeline's declared data edges (:class:`TaskGraph`), or from
the ledger itself (:meth:`TaskGraph.from_ledger`: every input a task ever read).

>>> from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef
>>> rows = [LedgerEntry(dag_id="d", task_id="a", epoch=t, regime="ephemeral", run_id=f"r{t}", try_number=1, notified_through=t,
...                     outputs=(OutputRef("output", "/s/a", "scratch", t, 1, t),)) for t in (1, 2)]
>>> rows += [LedgerEntry(dag_id="d", task_id="b", epoch=t, regime="batch(log_outputs=true)", run_id=f"r{t}", try_number=1, notified_through=t,
...                      inputs=(InputRef(task_id="a", output="output", through=t),)) for t in (1, 2)]
>>> graph = TaskGraph.from_ledger(rows)
>>> lost_scratch = lambda uri, key: not uri.startswith("/s/")
>>> chains = chains_from_ledger(rows, graph, readable=lost_scratch)
>>> [(c.f, dict(c.D)) for c in chains["a"]]    # a's scratch is gone: every epoch is discarded
[(0, {}), (2, {'a.output->b': 2}), (3, {'a.output->b': 3})]
>>> [(c.f, dict(c.M), c.N) for c in chains["b"]]
[(0, {}, 0), (2, {'a.output->b': 2}, 2), (3, {'a.output->b': 3}, 3)]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from falkirk.policies.ids import ProcessorId, ReplicaId
from falkirk.policies.regimes import Regime, SenderLog
from falkirk.policies.rollback.graph import Edge, Graph, Processor
from falkirk.policies.rollback.metadata import Chain, Checkpoint
from falkirk.policies.rollback.times import EPOCH
from falkirk.policies.store.commits import CommitKey
from falkirk.policies.store.ledger import LedgerEntry, is_external
from falkirk.policies.store.readability import Readable


class ChainError(ValueError):
    """Ledger rows that do not describe the graph given; the message names the task or edge."""


def _as_processor(value: str) -> ProcessorId:
    """``value`` as a processor id: the wire form ``task`` or ``task[i]`` is parsed."""
    return value if isinstance(value, ProcessorId) else ProcessorId.parse(value)


@dataclass(frozen=True)
class DataEdge:
    """Processor ``dst`` reads the output table ``output`` of processor ``src`` (tasks, or
    partitions ``task[i]``; given as text, each end is parsed)."""

    src: ProcessorId
    output: str
    dst: ProcessorId

    def __post_init__(self) -> None:
        for end in ("src", "dst"):
            object.__setattr__(self, end, _as_processor(getattr(self, end)))

    @property
    def id(self) -> str:
        return f"{self.src}.{self.output}->{self.dst}"


@dataclass(frozen=True)
class TaskGraph:
    """A pipeline's processors and the data edges between them.

    A processor is a task, or one partition ``task[i]`` of a partitioned task
    (:mod:`falkirk.policies.partitions`): each has its own rows, state and frontier.
    """

    tasks: tuple[ProcessorId, ...]
    edges: tuple[DataEdge, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(_as_processor(t) for t in self.tasks))
        known = set(self.tasks)
        for e in self.edges:
            for end in (e.src, e.dst):
                if end not in known:
                    raise ChainError(f"edge {e.id}: task {end!r} is not in the graph's tasks {sorted(known)}")

    @classmethod
    def from_ledger(cls, entries: Iterable[LedgerEntry]) -> TaskGraph:
        """Every task (every partition of a partitioned one) with a ledger row, and an edge for
        every input (producer partition) any of them read."""
        tasks: dict[ProcessorId, None] = {}
        edges: dict[DataEdge, None] = {}
        for e in entries:
            tasks.setdefault(e.processor)
            for i in e.inputs:
                tasks.setdefault(i.processor)
                edges.setdefault(DataEdge(i.processor, i.output, e.processor))
        return cls(tuple(tasks), tuple(edges))

    @classmethod
    def of(cls, tasks: Iterable[str], edges: Iterable[tuple[str, str]], output: str = "output") -> TaskGraph:
        """The graph of ``tasks`` (processor ids in their wire form) where each ``(up, down)``
        edge reads ``up``'s table ``output``.

        >>> TaskGraph.of(["a", "b[0]"], [("a", "b[0]")]).edges[0].id
        'a.output->b[0]'
        """
        return cls(tuple(ProcessorId.parse(t) for t in tasks),
                   tuple(DataEdge(ProcessorId.parse(up), output, ProcessorId.parse(down)) for up, down in edges))

    def downstream(self, task: ProcessorId) -> list[ProcessorId]:
        """``task`` and every task that reads its outputs, directly or through others.

        >>> TaskGraph(("a", "b", "c"), (DataEdge("a", "output", "b"), DataEdge("b", "output", "c"))).downstream("b")
        ['b', 'c']
        """
        seen, todo = [task], [task]
        while todo:
            t = todo.pop()
            for e in self.edges:
                if e.src == t and e.dst not in seen:
                    seen.append(e.dst)
                    todo.append(e.dst)
        return seen

    def tasks_downstream(self, task: str) -> list[ProcessorId]:
        """The processors of every task downstream of ``task`` (not ``task``'s own), as Airflow
        sees tasks: a partition of a task reaches every partition of the tasks after it.

        >>> g = TaskGraph(("a[0]", "a[1]", "b[0]", "b[1]", "c"), (DataEdge("a[0]", "output", "b[0]"),
        ...     DataEdge("a[1]", "output", "b[1]"), DataEdge("b[0]", "output", "c"), DataEdge("b[1]", "output", "c")))
        >>> g.tasks_downstream("a")
        ['b[0]', 'b[1]', 'c']
        """
        task_edges = {(e.src.task, e.dst.task) for e in self.edges}
        seen, todo = {task}, [task]
        while todo:
            t = todo.pop()
            for src, dst in task_edges:
                if src == t and dst not in seen:
                    seen.add(dst)
                    todo.append(dst)
        return [p for p in self.tasks if ProcessorId.parse(p).task in seen - {task}]

    def solver_graph(self, failed: Iterable[str] = ()) -> Graph:
        """The same graph as the solver sees it: processors in the epoch domain, identity φ."""
        down = set(failed)
        unknown = down - set(self.tasks)
        if unknown:
            raise ChainError(f"failed task(s) {sorted(unknown)} are not in the graph's tasks {list(self.tasks)}")
        return Graph([Processor(t, EPOCH, failed=t in down) for t in self.tasks],
                     [Edge(e.id, e.src, e.dst, "identity") for e in self.edges])


def reads_back(entries: Iterable[LedgerEntry]) -> dict[tuple[ProcessorId, str, ProcessorId], int]:
    """Per (upstream task, output, reader): how many epochs before its own a reader's epoch reads.

    0 when each epoch reads only the same epoch; 2 for a window of three epochs.
    """
    back: dict[tuple[ProcessorId, str, ProcessorId], int] = {}
    for r in entries:
        for i in r.inputs:
            k = (i.processor, i.output, r.processor)
            back[k] = max(back.get(k, 0), i.reads_back)
    return back


def current_rows(entries: Iterable[LedgerEntry]) -> dict[ProcessorId, list[LedgerEntry]]:
    """Per processor (task or partition), its rows in epoch order, keeping the latest incarnation
    of each epoch."""
    latest: dict[tuple[ProcessorId, int], LedgerEntry] = {}
    for e in entries:
        k = (e.processor, e.epoch)
        if k not in latest or e.incarnation > latest[k].incarnation:
            latest[k] = e
    out: dict[ProcessorId, list[LedgerEntry]] = {}
    for (task, _), e in sorted(latest.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        out.setdefault(task, []).append(e)
    return out


def chains_from_ledger(
    entries: Iterable[LedgerEntry],
    graph: TaskGraph,
    readable: Readable,
    failed: Iterable[str] = (),
    first_epoch: int = 1,
) -> dict[str, Chain]:
    """F*(p) with exact Ξ for every task of ``graph`` (see the module docstring).

    ``failed`` names the tasks that failed: the solver gives them no ⊤. (No task has a ⊤
    here anyway: each epoch of a task ends with its commit, so a task's latest ledger row
    is all it holds.)
    """
    rows = current_rows(entries)
    by_epoch = {task: {r.epoch: r for r in task_rows} for task, task_rows in rows.items()}
    paired = {ProcessorId.parse(p).task for p, task_rows in rows.items() if Regime.parse(task_rows[0].regime).replicas > 1}
    down = set(failed)
    chains: dict[str, Chain] = {}
    for task in graph.tasks:
        in_edges = [e for e in graph.edges if e.dst == task]
        out_edges = [e for e in graph.edges if e.src == task]
        checkpoints = [Checkpoint(EPOCH.empty, {}, EPOCH.empty, {})]
        discarded: dict[str, int] = {}  # output name -> bound of D̄ so far
        expected = first_epoch
        for row in rows.get(task, []):
            if row.epoch != expected:
                break  # a gap: no frontier from here on contains only completed epochs
            expected += 1
            for ref in row.outputs:
                if not readable(ref.uri, _key(row)):
                    discarded[ref.name] = EPOCH.through_bound(row.epoch)
            if not _restorable(row, readable, by_epoch):
                continue
            consumed = {(i.processor, i.output): EPOCH.through_bound(i.through) for i in row.inputs}
            for e in out_edges:
                if not any(ref.name == e.output for ref in row.outputs):
                    raise ChainError(f"task {task!r} epoch {row.epoch}: edge {e.id} reads output {e.output!r}, "
                                     f"which the task did not write; it wrote {[o.name for o in row.outputs]}")
            checkpoints.append(Checkpoint(
                f=EPOCH.through_bound(row.epoch),
                M={e.id: _consumed(consumed, e, paired) for e in in_edges},
                N=EPOCH.through_bound(row.notified_through),
                D={e.id: discarded.get(e.output, EPOCH.empty) for e in out_edges},
            ))
        chains[task] = Chain(EPOCH, checkpoints, in_domains={e.id: EPOCH for e in in_edges},
                             out_domains={e.id: EPOCH for e in out_edges}, failed=task in down)
    return chains


def _consumed(consumed: Mapping[tuple[ProcessorId, str], int], edge: DataEdge, paired: set[str]) -> int:
    """M̄ of ``edge`` at a checkpoint that read ``consumed`` (producer processor, output -> bound).

    A replica of a process pair reads a producer partition from its own replica id while that
    one is active, else from its twin, whose rows are the same: an epoch read from the twin
    counts as read on the edge from the other replica too. Otherwise a reader's chain would
    shrink on that edge across a take-over (and again once the replica is caught up).

    >>> from falkirk.policies.planning.chains import DataEdge
    >>> edge = DataEdge("sessions[0]", "output", "stats[2]")
    >>> _consumed({("sessions[1]", "output"): 4}, edge, {"sessions"}), _consumed({}, edge, {"sessions"})
    (4, 0)
    >>> _consumed({("tally[1]", "output"): 4}, DataEdge("tally[0]", "output", "report"), set())  # partitions, not replicas
    0
    """
    got = consumed.get((edge.src, edge.output))
    src = ProcessorId.parse(edge.src)
    if got is None and src.task in paired:
        got = consumed.get((ReplicaId.of(task=src.task, map_index=src.map_index).twin.processor, edge.output))
    return EPOCH.empty if got is None else got


def sent_undelivered(row: LedgerEntry, readable: Readable) -> bool:
    """Whether ``row`` sent records to an external system that has not accepted them yet."""
    return any(is_external(o.uri) and not readable(o.uri, _key(row)) for o in row.outputs)


def _restorable(row: LedgerEntry, readable: Readable, rows: Mapping[ProcessorId, Mapping[int, LedgerEntry]]) -> bool:
    """Stateless tasks restore anywhere; stateful ones while their state is readable; a task
    that sends to an external system, once the system has accepted the epoch's records. A task
    under sender-side logs also restores while the blocks it has not released are readable: its
    next epoch rebuilds the state from them (:func:`rebuildable`)."""
    if sent_undelivered(row, readable):
        return False
    return not Regime.parse(row.regime).keeps_state or state_available(row, readable, rows)


def state_available(row: LedgerEntry, readable: Readable,
                    rows: Mapping[ProcessorId, Mapping[int, LedgerEntry]]) -> bool:
    """Whether the state ``row`` checkpointed can be restored: its table is readable or, under
    sender-side logs, every block it is rebuilt from is (:func:`rebuildable`).

    >>> row = LedgerEntry(dag_id="d", task_id="total", epoch=1, regime="sender_log(release=ingest:at_end)", run_id="r1", try_number=1, state_uri="/scratch/total")
    >>> state_available(row, lambda uri, key: False, {"ingest": {}})  # no state, and ingest's block 1 is gone
    False
    """
    if row.state_uri is not None and readable(row.state_uri, _key(row)):
        return True
    regime = Regime.parse(row.regime)
    return isinstance(regime, SenderLog) and rebuildable(row, regime, readable, rows)


def rebuildable(row: LedgerEntry, regime: SenderLog, readable: Readable,
                rows: Mapping[ProcessorId, Mapping[int, LedgerEntry]]) -> bool:
    """Whether every block ``row``'s state depends on is still readable: per input, each epoch
    after the input's release point through ``row.epoch``, from the producer's current row
    (``rows``: per task, its current row of each epoch).

    >>> from falkirk.policies.store.ledger import OutputRef
    >>> def out(task, e):
    ...     return LedgerEntry(dag_id="d", task_id=task, epoch=e, regime="batch(log_outputs=true)", run_id=f"r{e}", try_number=1,
    ...                        outputs=(OutputRef("output", f"/durable/{task}", "durable", e, 1),))
    >>> rows = {"ingest": {e: out("ingest", e) for e in (1, 2, 3)}}
    >>> total = LedgerEntry(dag_id="d", task_id="total", epoch=3, regime="sender_log(release=ingest:at_end)", run_id="r3", try_number=1)
    >>> regime = Regime.parse(total.regime)
    >>> rebuildable(total, regime, lambda uri, key: True, rows)
    True
    >>> rebuildable(total, regime, lambda uri, key: key.epoch != 1, rows)  # ingest's epoch 1 was pruned
    False
    """
    for task, released in regime.released(row.epoch).items():
        held = rows.get(ProcessorId.parse(task), {})
        for epoch in range(released + 1, row.epoch + 1):
            block = held.get(epoch)
            if block is None or not all(readable(o.uri, _key(block)) for o in block.outputs):
                return False
    return True


def _key(row: LedgerEntry) -> CommitKey:
    return CommitKey(dag_id=row.dag_id, task_id=row.task_id, epoch=row.epoch, map_index=row.map_index, incarnation=row.incarnation)
