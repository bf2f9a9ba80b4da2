"""Garbage collection below the low-watermarks (Falkirk Wheel §4.2-4.3): what no recovery can ever need.

The low-watermark W(t) of a task is the last epoch of the frontier the solver picks when
nothing offers ⊤ and only the durable tier counts (a scratch copy can vanish at any
moment): whatever fails, ``t`` never rolls back before it. So:

* ``t``'s checkpoints at epochs below W(t) are never restored: their state partitions
  (in every tier) are deleted and their ledger rows are marked collected. The checkpoint
  at W(t) itself is kept;
* an output epoch ``e`` of ``t`` is needed only by consumers that re-run an epoch reading
  it. Consumer ``c`` re-runs only epochs after W(c), and its epoch W(c) + 1 reads back
  ``reads_back`` epochs (a window), so ``e`` is deleted once it lies before
  W(c) + 1 - reads_back for **every** consumer. An output that no task of the DAG reads, that
  its task declares a product (the operator's ``products=``), or that another DAG has read
  through an Asset (a recovery there reads it again), is never collected;
* a reader under sender-side logs (:class:`~falkirk.policies.regimes.SenderLog`) keeps no
  checkpoint: it rebuilds its state at W(c) by replaying the input epochs it had not released
  by then, so those are kept too (the producer's log is pruned up to the release);
* a source task may acknowledge its external input through W(source);
* a channel a task streamed an epoch through to a reader running beside it (the ledger row's
  ``channels``: scratch tables on the worker that ran it) is read by no recovery, so the epoch
  is deleted from it once every reader has committed that epoch, on whichever worker's disk it
  was left.

:func:`plan_collection` is the policy (pure: it reads nothing); :func:`collect` is the
mechanism: it marks the ledger first, then deletes each table's partitions in one Delta
commit and vacuums the files no version references any more. Both are idempotent: a
second run finds nothing left to reclaim.

>>> from falkirk.policies.planning.chains import DataEdge, TaskGraph
>>> from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef
>>> def row(task, e, regime, state=None, inputs=()):
...     return LedgerEntry(dag_id="d", task_id=task, epoch=e, regime=regime, run_id=f"epoch-{e}", try_number=1, state_uri=state, notified_through=e,
...                        outputs=(OutputRef("output", f"/durable/{task}", "durable", e, 1),),
...                        inputs=tuple(InputRef(task_id=t, output="output", through=e) for t in inputs))
>>> rows = [row("src", e, "batch(log_outputs=true)") for e in range(1, 8)]
>>> rows += [row("agg", e, "lazy_checkpoint(every=3)", "/durable/agg/state" if e % 3 == 0 else "/scratch/agg/state",
...              ["src"]) for e in range(1, 8)]
>>> graph = TaskGraph(("src", "agg"), (DataEdge("src", "output", "agg"),))
>>> durable = lambda uri, key: uri.startswith("/durable")
>>> live = lambda uri: {e: 100 for e in range(1, 8) if "durable/agg" not in uri or e % 3 == 0}
>>> p = plan_collection("d", rows, graph, durable, live)
>>> p.watermarks, p.marks
({'src': 7, 'agg': 6}, {'src': 6, 'agg': 5})
>>> [(r.task_id, r.what, r.uri, r.epochs) for r in p.tables]  # doctest: +NORMALIZE_WHITESPACE
[('src', 'output', '/durable/src', (1, 2, 3, 4, 5, 6)),
 ('agg', 'state', '/durable/agg/state', (3,)),
 ('agg', 'state', '/scratch/agg/state', (1, 2, 3, 4, 5))]
>>> [(p.task_id, p.output, p.why) for p in p.products]
[('agg', 'output', 'read by no task of the DAG')]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from deltalake.exceptions import CommitFailedError

from falkirk.policies.epochs import epoch_ranges
from falkirk.policies.faults import broken
from falkirk.policies.ids import ProcessorId
from falkirk.policies.partitions import processors
from falkirk.policies.planning.chains import DataEdge, TaskGraph, chains_from_ledger, current_rows, reads_back
from falkirk.policies.planning.from_ledger import taken_over_replicas, without_processors
from falkirk.policies.planning.monitor import low_watermarks
from falkirk.policies.planning.recovery_log import RecoveryLog
from falkirk.policies.regimes import Regime, SenderLog, Tier
from falkirk.policies.rollback.times import EPOCH
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.control import Collections
from falkirk.policies.store.ledger import Ledger, LedgerEntry, is_external
from falkirk.policies.store.readability import Readable, StoreReadability, durable_only

LivePartitions = Callable[[str], Mapping[int, int]]
"""The epochs a table at a URI holds now, each with its size in bytes (empty: no table)."""


@dataclass(frozen=True)
class Reclaim:
    """Epoch partitions of one table that no recovery can need any more."""

    task_id: str
    what: str  # "state", or the output's name
    uri: str
    epochs: tuple[int, ...]
    bytes: int
    tier: str = "durable"  # where an output table is: a durable one is a log, a scratch one is not
    channel: bool = False  # a table the task streamed its epochs through to a concurrent reader

    @property
    def kind(self) -> str:
        """What the table is to recovery: a checkpoint (state), a log (a durable output),
        scratch output (kept only until the next durable checkpoint downstream), or a channel
        (read by no recovery).

        >>> Reclaim("t", "output", "/s/t", (1,), 9, tier="scratch").kind
        'scratch output'
        >>> Reclaim("draw", "edge", "/s/w/d/draw/edge", (1,), 9, tier="scratch", channel=True).kind
        'channel'
        """
        if self.channel:
            return "channel"
        if self.what == "state":
            return "checkpoint"
        return "log" if self.tier == "durable" else "scratch output"


@dataclass(frozen=True)
class Product:
    """An output table garbage collection keeps whole, and why."""

    task_id: str
    output: str
    uri: str
    why: str  # "declared a product" (the operator's products=) or "read by no task of the DAG"


@dataclass(frozen=True)
class CollectionPlan:
    """What the low-watermarks of one DAG let it forget."""

    dag_id: str
    watermarks: Mapping[str, int]  # per task: the epoch it never rolls back before (0: none yet)
    marks: Mapping[str, int]  # per task: ledger rows at epochs <= this become collected (new marks only)
    tables: tuple[Reclaim, ...]
    acknowledged: Mapping[str, int] = field(default_factory=dict)  # per source: input done through this epoch
    products: tuple[Product, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.tables)

    @property
    def empty(self) -> bool:
        return not self.marks and not self.tables

    def describe(self) -> str:
        """The plan for people: per task its watermark, then every table and how much it frees."""
        lines = [f"garbage collection of {self.dag_id}: "
                 + (f"{sum(len(r.epochs) for r in self.tables)} epoch partitions in {len(self.tables)} tables, "
                    f"{_size(self.bytes)}" if self.tables else "no table partitions to reclaim")]
        for task, w in self.watermarks.items():
            mark = f"; ledger rows through epoch {self.marks[task]} marked collected" if task in self.marks else ""
            # The source's input before this is never read again; whether the source is told
            # depends on an acknowledgement hook (collect's `acknowledge`), so nothing more is claimed.
            ack = f"; its input through epoch {self.acknowledged[task]} is no longer needed" \
                if self.acknowledged.get(task, 0) > 0 else ""
            lines.append(f"  {task}: low-watermark epoch {w}{mark}{ack}")
        for r in self.tables:
            lines.append(f"  {r.task_id} {r.what} ({r.kind}): epochs {epoch_ranges(r.epochs)} of {r.uri} ({_size(r.bytes)})")
        for p in self.products:
            lines.append(f"  {p.task_id} {p.output} (product, kept whole: {p.why}): {p.uri}")
        return "\n".join(lines)


def watermarks(entries: Iterable[LedgerEntry], graph: TaskGraph, readable: Readable) -> dict[str, int]:
    """Per task, the last epoch of its low-watermark (0: it may still roll back to nothing).

    ``readable`` should count only durable copies (:func:`falkirk.policies.store.readability.durable_only`).
    """
    chains = chains_from_ledger(list(entries), graph, readable)
    solved = low_watermarks(graph.solver_graph(), chains)
    return {t: max(EPOCH.last_through(solved.bound(t)), 0) for t in graph.tasks}


def with_partitions_yet_to_commit(graph: TaskGraph, entries: Iterable[LedgerEntry],
                                  leave_out: Iterable[str] = ()) -> TaskGraph:
    """``graph`` (the one the ledger shows) and every partition of a partitioned task that has
    no row yet, reading every partition of each producer task its task's other partitions read.

    A partition that has not committed yet (queued, or failed on its first epoch) will read
    its inputs' epochs like the others; a graph without it would let a collection delete
    them. Its rows would tell which producer partitions it reads; until it has some, it counts
    as reading them all. The count comes from the task's latest row (``partitions``, and
    ``replicas`` for process pairs); ``leave_out`` names processors never to add (replicas
    their twins took over).

    >>> from falkirk.policies.store.ledger import InputRef
    >>> rows = [LedgerEntry(dag_id="d", task_id="sessions", epoch=1, regime="batch", run_id="epoch-1", try_number=1, map_index=i, partitions=2) for i in (0, 1)]
    >>> rows += [LedgerEntry(dag_id="d", task_id="stats", epoch=1, regime="batch", run_id="epoch-1", try_number=1, map_index=1, partitions=2,
    ...                      inputs=(InputRef(task_id="sessions", output="output", through=1, map_index=1),))]
    >>> graph = with_partitions_yet_to_commit(TaskGraph.from_ledger(rows), rows)
    >>> graph.tasks
    ('sessions[0]', 'sessions[1]', 'stats[1]', 'stats[0]')
    >>> [e.id for e in graph.edges if e.dst == "stats[0]"]
    ['sessions[0].output->stats[0]', 'sessions[1].output->stats[0]']
    """
    latest: dict[str, LedgerEntry] = {}
    committed: set[str] = set()
    for e in entries:
        committed.add(e.processor)
        if e.partitions is not None and (e.task_id not in latest or e.epoch >= latest[e.task_id].epoch):
            latest[e.task_id] = e
    tasks, edges, skip = list(graph.tasks), list(graph.edges), set(leave_out)
    for task, row in latest.items():
        read = {(ProcessorId.parse(e.src).task, e.output) for e in graph.edges if ProcessorId.parse(e.dst).task == task}
        for processor in processors(task, row.partitions, row.replicas or 1):
            if processor in committed or processor in skip:
                continue
            if processor not in tasks:  # a reader's row may name it already, as a producer it read
                tasks.append(processor)
            edges += [DataEdge(src, output, processor) for src in graph.tasks for t, output in sorted(read)
                      if ProcessorId.parse(src).task == t]
    return TaskGraph(tuple(tasks), tuple(dict.fromkeys(edges)))


def plan_collection(dag_id: str, entries: Iterable[LedgerEntry], graph: TaskGraph, readable: Readable,
                    live: LivePartitions, collected: Mapping[str, int] | None = None,
                    state_tables: Callable[[str], Iterable[str]] | None = None,
                    asset_readers: Mapping[tuple[str, str], Sequence[str]] | None = None,
                    live_channel: LivePartitions | None = None) -> CollectionPlan:
    """The collection the low-watermarks allow (see the module docstring); reads nothing itself.

    ``asset_readers``: (task, output) -> the other DAGs that read it through an Asset
    (:meth:`~falkirk.policies.store.ledger.Ledger.asset_readers`).

    ``state_tables`` names every state table of a stateful task (both tiers): a ledger row
    names only the last tier its state went to, and a task checkpointed durably every epoch
    would otherwise never have its scratch copies collected.

    ``live_channel``: the epochs a channel holds (default ``live``); a channel is not partitioned.
    """
    rows = list(entries)
    low = watermarks(rows, graph, readable)
    by_task = current_rows(rows)
    done = dict(collected or {})
    marks = {t: w - 1 for t, w in low.items() if w - 1 > done.get(t, 0)}
    back = reads_back(rows)  # how far back each consumer reads each of its inputs
    tables: list[Reclaim] = []
    products: list[Product] = []
    for task in graph.tasks:
        task_rows = by_task.get(task, [])
        state_uris = {r.state_uri for r in task_rows if r.state_uri}
        if state_uris and state_tables is not None:
            state_uris |= set(state_tables(task))
        for uri in sorted(state_uris):
            tables += _reclaim(task, "state", uri, live, before=low[task])
        outputs = sorted({(o.name, o.uri) for r in task_rows for o in r.outputs if not is_external(o.uri)})
        tiers = {(o.name, o.uri): o.tier for r in task_rows for o in r.outputs}
        declared = {o.name for r in task_rows for o in r.outputs if o.product}
        for name, uri in outputs:
            readers = [e.dst for e in graph.edges if e.src == task and e.output == name]
            elsewhere = (asset_readers or {}).get((task, name))
            if name in declared or not readers or elsewhere:  # the pipeline's product: never collected
                products.append(Product(task, name, uri, "declared a product" if name in declared
                                        else f"read through an Asset by {', '.join(elsewhere)}" if elsewhere
                                        else "read by no task of the DAG"))
                continue
            need = min(_first_needed(task, name, c, low[c], back, by_task) for c in readers)
            tables += _reclaim(task, name, uri, live, before=need, tier=tiers[name, uri])
        tables += _reclaim_channels(task, rows, graph, by_task, live_channel or live)
    sources = [t for t in graph.tasks if not any(e.dst == t for e in graph.edges)]
    return CollectionPlan(dag_id, low, marks, tuple(tables), {t: low[t] for t in sources}, tuple(products))


def _first_needed(task: ProcessorId, output: str, reader: ProcessorId, low: int,
                  back: Mapping[tuple[ProcessorId, str, ProcessorId], int],
                  by_task: Mapping[ProcessorId, list[LedgerEntry]]) -> int:
    """The first epoch of ``task``'s ``output`` that ``reader`` may still read: its epochs after
    its low-watermark ``low`` re-read a window back; under sender-side logs, rebuilding its state
    at ``low`` replays every epoch the reader had not released by then."""
    first = low + 1 - back.get((task, output, reader), 0)
    rows = by_task.get(reader)
    regime = Regime.parse(rows[-1].regime) if rows else None
    if isinstance(regime, SenderLog) and regime.keeps_state and low > 0:
        first = min(first, regime.released(low).get(task, low) + 1)
    return first


def _reclaim_channels(task: str, rows: Sequence[LedgerEntry], graph: TaskGraph,
                      by_task: Mapping[ProcessorId, list[LedgerEntry]], live: LivePartitions) -> list[Reclaim]:
    """The epochs of ``task``'s channels (on every worker a row of it names) that each of its
    readers has committed: a reader's re-run reads the task's logged output, never the channel."""
    readers = {e.dst for e in graph.edges if e.src == task}
    if not readers:
        return []
    delivered = set.intersection(*({r.epoch for r in by_task.get(c, [])} for c in readers))
    found = []
    for uri in sorted({u for r in rows if r.task_id == task for u in r.channels}):
        held = live(uri)
        epochs = tuple(sorted(e for e in held if e in delivered))
        if epochs:
            found.append(Reclaim(task, uri.rstrip("/").rsplit("/", 1)[-1], uri, epochs, sum(held[e] for e in epochs),
                                 "scratch", channel=True))
    return found


def _reclaim(task: str, what: str, uri: str, live: LivePartitions, before: int,
             tier: str = "durable") -> list[Reclaim]:
    held = live(uri)
    epochs = tuple(sorted(e for e in held if e < before))
    return [Reclaim(task, what, uri, epochs, sum(held[e] for e in epochs), tier)] if epochs else []


@dataclass(frozen=True)
class CollectionReport:
    """What :func:`collect` did (or, in a dry run, would do)."""

    plan: CollectionPlan
    dry_run: bool
    files_removed: int = 0


MAX_RETAIN_HOURS = 87_600


def collect(store: StoreConfig, dag_id: str, graph: TaskGraph | None = None, *, dry_run: bool = False,
            retain_hours: int = 1, progress: Callable[[str], None] = lambda _: None,
            acknowledge: Mapping[str, Callable[[int], object]] | None = None,
            holder: str = "falkirk gc") -> CollectionReport:
    """Collect ``dag_id``'s garbage in ``store`` (nothing is changed when ``dry_run``).

    ``acknowledge`` maps a source task to what acknowledges its external input (for example
    :meth:`falkirk.spark_jobs.inbox.Inbox.acknowledge`): it is called with the last epoch inside the
    source's low-watermark, after the ledger is marked, and never in a dry run.

    ``graph`` is the DAG's; by default the one the ledger shows, with the partitions of a
    partitioned task that have not committed yet (:func:`with_partitions_yet_to_commit`). A
    task none of whose partitions has committed yet is not in it: an output only it reads is
    kept whole (read by no task), but one another task reads as well goes by that reader's
    watermark.
    ``retain_hours``: a file a Delta version stopped referencing is deleted only after
    this many hours (a whole number: Delta's vacuum takes no fractions), so a job still
    reading the table, or one that has written its files and not yet committed them, never
    loses a file under it.
    """
    if isinstance(retain_hours, bool) or not isinstance(retain_hours, int) or retain_hours < 0:
        raise ValueError(f"retain_hours={retain_hours!r}: give a whole number of hours, 0 or more")
    if retain_hours > MAX_RETAIN_HOURS:
        raise ValueError(f"retain_hours={retain_hours}: at most {MAX_RETAIN_HOURS} (ten years)")
    ledger = Ledger(store)
    if not ledger.entries(dag_id):
        raise ValueError(f"--dag: the ledger at {ledger.uri} has no rows for DAG {dag_id!r}")
    plan = _plan(store, ledger, dag_id, graph, acknowledge)
    log = RecoveryLog(store)
    if dry_run or (plan.empty and not acknowledge):
        if not dry_run:  # nothing to do, and nothing written: still refused during a recovery
            log.check_free(dag_id)
        progress(plan.describe())
        return CollectionReport(plan, dry_run)
    # A collection holds the DAG's recovery lease: a replay never finds a checkpoint it
    # restores deleted under it, and a collection never runs while a replay does. The
    # plan is made again under the lease; one made before it only said there was work.
    lease = log.begin_collection(dag_id, holder)
    try:
        plan = _plan(store, ledger, dag_id, graph, acknowledge)
        progress(plan.describe())
        # Marks first: from here on no plan counts those checkpoints, before any file goes.
        if plan.marks:
            Collections(store).mark(dag_id, dict(plan.marks))
        removed = 0
        for r in plan.tables:
            epochs = r.epochs
            if r.what == "state" and broken("gc-watermark"):  # a drill a soak must catch (policies.faults)
                epochs = (*epochs, *sorted(set(live_partitions(store, r.uri)) - set(epochs))[:1])
            try:
                removed += _delete_epochs(store, r.uri, epochs, retain_hours)
            except CommitFailedError:
                if not r.channel:
                    raise
                # The producer appended its next epoch meanwhile: those epochs go next time.
                progress(f"  {r.uri} changed while its epochs {epoch_ranges(epochs)} were deleted; the next "
                         f"collection deletes them")
                continue
            progress(f"  deleted epochs {epoch_ranges(epochs)} of {r.uri}")
        for task, ack in sorted((acknowledge or {}).items()):
            if plan.acknowledged[task] > 0:
                ack(plan.acknowledged[task])
    except BaseException as exc:
        log.end(lease, "failed", f"{type(exc).__name__}: {exc}"[:2000])
        raise
    log.end(lease, "finished", f"{len(plan.tables)} tables, {plan.bytes} bytes")
    return CollectionReport(plan, dry_run, removed)


def _plan(store: StoreConfig, ledger: Ledger, dag_id: str, graph: TaskGraph | None,
          acknowledge: Mapping[str, Callable[[int], object]] | None,
          live: LivePartitions | None = None) -> CollectionPlan:
    """The collection the ledger allows now; ``live``: the epochs each table holds (default:
    read from the table)."""
    rows = ledger.entries(dag_id)
    # A replica of a process pair its twin took over holds nothing back: its twin's consumers and
    # its standby (once registered, at the twin's version) pin what the dataflow still needs.
    taken_over = taken_over_replicas(store, dag_id)
    if taken_over:
        rows = without_processors(rows, taken_over)
        if graph is not None:
            graph = TaskGraph(tuple(t for t in graph.tasks if t not in taken_over),
                              tuple(e for e in graph.edges if taken_over.isdisjoint((e.src, e.dst))))
    graph = graph or with_partitions_yet_to_commit(TaskGraph.from_ledger(rows), rows, taken_over)
    readable = durable_only(StoreReadability(store, rows), store.scratch_uri)
    plan = plan_collection(dag_id, rows, graph, readable, live or (lambda uri: live_partitions(store, uri)),
                           Collections(store).through(dag_id),
                           lambda task: [store.table_uri(tier, dag_id, *_task_and_table(task, "state")) for tier in Tier],
                           ledger.asset_readers(dag_id), live or (lambda uri: live_partitions(store, uri, by_rows=True)))
    for r in plan.tables:  # whatever a ledger row says, only the task's own tables are touched
        if not store.is_table_of(r.uri, dag_id, *_task_and_table(r.task_id, r.what)):
            own = {store.table_uri(tier, dag_id, *_task_and_table(r.task_id, r.what)) for tier in Tier}
            raise ValueError(f"ledger of {dag_id}: task {r.task_id!r} names its {r.what} table {r.uri!r}, which is "
                             f"not where the store keeps it ({' or '.join(sorted(own))}, or a worker's scratch); "
                             f"refusing to delete anything. Repair the ledger row or collect nothing for this DAG")
    unknown = sorted(set(acknowledge or {}) - set(plan.acknowledged))
    if unknown:
        raise ValueError(f"acknowledge: {unknown} are not source tasks of {dag_id}; "
                         f"its sources are {sorted(plan.acknowledged)}")
    return plan


def _task_and_table(processor: str, table: str) -> tuple[str, str, int]:
    """``table_uri``'s task, table and map index for a processor (a task, or one partition ``task[i]``)."""
    p = ProcessorId.parse(processor)
    return p.task, table, p.map_index


def live_partitions(store: StoreConfig, uri: str, by_rows: bool = False) -> dict[int, int]:
    """The epochs the Delta table at ``uri`` holds now, with their sizes in bytes; ``by_rows``
    also for a table not partitioned by epoch (a channel), from its ``epoch`` column."""
    from falkirk.policies.store.commits import open_table

    table = open_table(uri, store.options_for(uri))
    if table is None:
        return {}
    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    sizes: dict[int, int] = {}
    if by_rows and "partition.epoch" not in actions:  # files hold rows of several epochs: sized by row count
        from falkirk.policies.store.commits import scan

        counts: dict[int, int] = {}
        for epoch in scan(table, columns=["epoch"]).column("epoch").to_pylist():
            counts[int(epoch)] = counts.get(int(epoch), 0) + 1
        total = sum(int(size) for size in actions.get("size_bytes", []))
        return {e: total * n // max(sum(counts.values()), 1) for e, n in counts.items()}
    for epoch, size in zip(actions.get("partition.epoch", []), actions.get("size_bytes", [])):
        sizes[int(epoch)] = sizes.get(int(epoch), 0) + int(size)
    return sizes


def _delete_epochs(store: StoreConfig, uri: str, epochs: tuple[int, ...], retain_hours: int) -> int:
    from falkirk.policies.store.commits import collection_properties, open_table

    table = open_table(uri, store.options_for(uri))
    if table is None:
        return 0
    table.delete(f"epoch IN ({', '.join(str(int(e)) for e in epochs)})", commit_properties=collection_properties(epochs))
    removed = len(table.vacuum(retention_hours=retain_hours, enforce_retention_duration=False, dry_run=False))
    if "://" not in uri:  # a local table keeps its emptied partition directories; object stores have none
        import os

        for e in epochs:
            try:
                os.rmdir(f"{uri}/epoch={int(e)}")
            except OSError:  # not empty yet (files within the retention), or already gone
                pass
    return removed


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            break
        size /= 1024
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
