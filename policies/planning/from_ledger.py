"""A recovery plan from what the store holds: the ledger, its rollbacks, the checkpoints inside
epochs and what the store can still read.

:func:`compute_plan` is the one way a plan is made from a store: the ``falkirk`` command and the
Falkirk view (through :mod:`falkirk.plugins.recovery`, which adds what Airflow reports), and a
job that has to stop and names the smallest plan that fixes it, with its size.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from falkirk.policies.partitions import processor_id
from falkirk.policies.planning.chains import TaskGraph
from falkirk.policies.planning.recovery import LostScratch, LostWorker, Failure, PlanError, RecoveryPlan, plan_recovery
from falkirk.policies.planning.recovery_log import RecoveryLog
from falkirk.policies.regimes import Regime, Tier
from falkirk.policies.store import StoreConfig, StoreError
from falkirk.policies.store.control import PairLayouts
from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot, entries_of
from falkirk.policies.store.readability import StoreReadability, under
from falkirk.policies.store.steps import StepLog

# How far past the ledger's newest epoch --last-epoch may name DAG runs (runs that committed nothing).
MAX_EPOCHS_AHEAD = 1000


def compute_plan(
    dag_id: str,
    store: StoreConfig,
    failures: Sequence[Failure],
    regimes: Mapping[str, Regime],
    *,
    last_epoch: int | None = None,
    record: bool = True,
    snapshot: LedgerSnapshot | None = None,
) -> RecoveryPlan:
    """The plan for ``failures`` from the ledger, given the regimes of the DAG's tasks (which
    adds the tasks that have no ledger row yet); records it in the recovery log if ``record``.
    ``snapshot`` is the DAG's ledger as the caller already read it (read here if not given)."""
    ledger = Ledger(store)
    if snapshot is None:
        snapshot = LedgerSnapshot(ledger, dag_id)  # one read of the DAG's rows and one of its rollbacks
    version = snapshot.dag_version
    entries, rolled_back = entries_of(snapshot.rows, snapshot.gone)
    # Replicas of process pairs taken over by their twins are out of the dataflow until a
    # catch-up brings them back: their missing epochs are not failures (falkirk.policies.pairs).
    taken_over = taken_over_replicas(store, dag_id)
    if taken_over:
        entries = without_processors(entries, taken_over)
        rolled_back = [e for e in rolled_back if e.processor not in taken_over]
        regimes = {p: r for p, r in regimes.items() if p not in taken_over}
    if not entries:
        raise PlanError(f"--dag: the ledger at {ledger.uri} has no rows for DAG {dag_id!r}; "
                        f"has it run with Falkirk's operator?")
    newest = max(e.epoch for e in [*entries, *rolled_back])
    if last_epoch is not None and (isinstance(last_epoch, bool) or not isinstance(last_epoch, int)
                                   or not 1 <= last_epoch <= newest + MAX_EPOCHS_AHEAD):
        raise PlanError(f"--last-epoch {last_epoch!r:.40}: give the latest epoch with a DAG run, from 1 to "
                        f"{newest + MAX_EPOCHS_AHEAD} (the ledger's newest epoch is {newest})")
    checked: list[Failure] = []
    for f in failures:
        if isinstance(f, LostScratch):
            try:
                f = LostScratch(store.scratch_location(f.location))
            except StoreError as exc:
                raise PlanError(f"--lost-scratch {exc}") from None
            _check_holds_something(f.location, dag_id, [*entries, *rolled_back])
        elif isinstance(f, LostWorker):
            _check_worker_holds_something(f.worker, dag_id, [*entries, *rolled_back])
        checked.append(f)
    failures = checked
    graph = TaskGraph.from_ledger(entries)
    if regimes:
        graph = TaskGraph(tuple(sorted(set(graph.tasks) | set(regimes))), graph.edges)
    last = last_epoch if last_epoch is not None else max(e.epoch for e in [*entries, *rolled_back])
    # Checkpoints inside epochs, of the incarnation each epoch's next run commits under (an
    # older incarnation's were computed before a recovery rolled the epoch back).
    gone = snapshot.gone
    next_incarnation: dict[tuple[str, int, int], int] = {}
    for _, t, m, e, inc in gone:
        next_incarnation[t, m, e] = max(next_incarnation.get((t, m, e), 0), inc + 1)
    steps = [c for c in StepLog(store).of_dag(dag_id)
             if c.incarnation == next_incarnation.get((c.task_id, c.map_index, c.epoch), 0)]
    result = plan_recovery(dag_id, graph, entries, failures, last, StoreReadability(store, [*entries, *rolled_back]),
                           regimes=regimes, ledger_version=version, steps=steps)
    if record:
        RecoveryLog(store).record(result)
    return result


def taken_over_replicas(store: StoreConfig, dag_id: str) -> set[str]:
    """The processors (``task[i]``) of process-pair replicas their twins took over
    (:meth:`falkirk.policies.pairs.Layout.taken_over`): out of the dataflow until a catch-up
    brings them back, so neither a plan nor a collection counts them."""
    layout = PairLayouts(store).load(dag_id)
    return set(layout.taken_over()) if layout is not None else set()


def without_processors(entries: Sequence[LedgerEntry], processors: set[str]) -> list[LedgerEntry]:
    """``entries`` without the rows of ``processors`` and without their readers' reads of them.

    A taken-over replica's readers read it before the take-over, from durable outputs no plan
    rolls back while it is out: its rows and those reads leave the graph together.

    >>> from falkirk.policies.store.ledger import InputRef
    >>> rows = [LedgerEntry("d", "g1", 1, "process_pairs", "epoch-1", 1, map_index=1),
    ...         LedgerEntry("d", "g2", 1, "process_pairs", "epoch-1", 1, map_index=0,
    ...                     inputs=(InputRef("g1", "output", 1, map_index=0), InputRef("g1", "output", 1, map_index=1)))]
    >>> [(e.processor, [i.map_index for i in e.inputs]) for e in without_processors(rows, {"g1[1]"})]
    [('g2[0]', [0])]
    """
    kept = []
    for entry in entries:
        if entry.processor in processors:
            continue
        inputs = tuple(i for i in entry.inputs if processor_id(i.task_id, i.map_index) not in processors)
        kept.append(entry if len(inputs) == len(entry.inputs) else dataclasses.replace(entry, inputs=inputs))
    return kept


def _check_holds_something(location: str, dag_id: str, entries: Sequence[LedgerEntry]) -> None:
    """Refuse a lost scratch location under which the ledger records nothing of ``dag_id``:
    losing it changes nothing, so it is most likely a wrong path."""
    kept = [uri for e in entries for uri in (e.state_uri, *(o.uri for o in e.outputs)) if uri]
    if any(under(uri, [location]) for uri in kept):
        return
    scratch = [e.state_uri for e in entries if e.state_tier == Tier.SCRATCH.value and e.state_uri]
    scratch += [o.uri for e in entries for o in e.outputs if o.tier == Tier.SCRATCH.value]
    task_dirs = sorted({uri.rsplit("/", 1)[0] for uri in scratch})  # <scratch>/<dag>/<task>
    raise PlanError(f"--lost-scratch {location}: the ledger records nothing of DAG {dag_id!r} kept there, so losing "
                    f"it changes nothing; name a directory that held its scratch data: "
                    f"{', '.join(task_dirs) if task_dirs else 'it has none'}")


def _check_worker_holds_something(worker: str, dag_id: str, entries: Sequence[LedgerEntry]) -> None:
    """Refuse a lost worker that kept nothing of ``dag_id`` in scratch: most likely a wrong name."""
    if any(e.worker == worker and e.scratch_uris() for e in entries):
        return
    holders = sorted({e.worker for e in entries if e.worker and e.scratch_uris()})
    raise PlanError(f"--lost-worker {worker!r:.80}: the ledger records no scratch table of DAG {dag_id!r} on that "
                    f"worker, so losing it changes nothing; workers holding its scratch data: "
                    f"{', '.join(holders) if holders else 'none'}")


__all__ = ["MAX_EPOCHS_AHEAD", "compute_plan"]
