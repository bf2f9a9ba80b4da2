"""A recovery plan from what the store holds: the ledger, its rollbacks, the checkpoints inside
epochs and what the store can still read.

:func:`compute_plan` is the one way a plan is made from a store: the ``falkirk`` command and the
Falkirk view (through :mod:`falkirk.plugins.recovery`, which adds what Airflow reports), and a
job that has to stop and names the smallest plan that fixes it, with its size.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence

from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.chains import TaskGraph
from falkirk.policies.planning.recovery import (
    BadEpoch,
    FailedTask,
    Failure,
    LostScratch,
    LostWorker,
    PlanError,
    RecoveryPlan,
    plan_recovery,
)
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
    regimes: Mapping[ProcessorId, Regime],
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
    entries = [*entries, *being_rewritten(store, dag_id, entries, rolled_back)]
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
    next_incarnation: dict[tuple[ProcessorId, int], int] = {}
    for c in gone:
        next_incarnation[c.processor, c.epoch] = max(next_incarnation.get((c.processor, c.epoch), 0), c.incarnation + 1)
    steps = [c for c in StepLog(store).of_dag(dag_id)
             if c.incarnation == next_incarnation.get((c.processor, c.epoch), 0)]
    result = plan_recovery(dag_id, graph, entries, failures, last, StoreReadability(store, [*entries, *rolled_back]),
                           regimes=regimes, ledger_version=version, steps=steps)
    if record:
        RecoveryLog(store).record(result)
    return result


def being_rewritten(store: StoreConfig, dag_id: str, current: Sequence[LedgerEntry],
                    rolled_back: Sequence[LedgerEntry]) -> list[LedgerEntry]:
    """Rolled-back rows of stateless tasks that are still checkpoints: epochs a running recovery
    keeps (within its frontier) and re-runs only to write their lost output again.

    Such a re-run needs a new incarnation, so the replay rolls the row back; but the epoch is
    not undone, and what was computed from it (a stateful reader's checkpoint that consumed it)
    stands. Until the re-run commits, the epoch has no current row: a plan made meanwhile that
    took it for undone would roll back every reader of it too, below checkpoints the first plan
    kept (and a source may have forgotten input only those checkpoints' re-runs would need).

    An epoch counts as being rewritten when the last recovery that started and re-runs it kept
    it: the epoch is within that plan's frontier and none of its failures names it.
    """
    have = {(e.processor, e.epoch) for e in current}
    latest: dict[tuple[ProcessorId, int], LedgerEntry] = {}
    for e in rolled_back:
        if (e.processor, e.epoch) not in have and not Regime.parse(e.regime).keeps_state:
            if e.incarnation >= getattr(latest.get((e.processor, e.epoch)), "incarnation", -1):
                latest[e.processor, e.epoch] = e
    if not latest:
        return []
    events = RecoveryLog(store).events(dag_id)
    plans = {r["plan_id"]: RecoveryPlan.from_json(json.loads(r["detail"])) for r in events if r["event"] == "planned"}
    started = [plans[r["plan_id"]] for r in events if r["event"] in ("started", "resumed") and r["plan_id"] in plans]
    kept = []
    for (processor, epoch), row in sorted(latest.items()):
        last = next((p for p in reversed(started) if (processor, epoch) in p.rerun_set()), None)
        if last is not None and _keeps(last, processor, epoch):
            kept.append(row)
    return kept


def _keeps(plan: RecoveryPlan, processor: str, epoch: int) -> bool:
    """Whether ``plan`` keeps ``processor``'s ``epoch``: within its frontier, and named by none of its failures."""
    part = next((t for t in plan.tasks if t.task_id == processor), None)
    named = any(isinstance(f, (FailedTask, BadEpoch)) and f.epoch == epoch
                and f.task_id in (processor, ProcessorId.parse(processor).task) for f in plan.failures)
    return part is not None and epoch <= part.kept_through and not named


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
    >>> rows = [LedgerEntry(dag_id="d", task_id="g1", epoch=1, regime="process_pairs", run_id="epoch-1", try_number=1, map_index=1),
    ...         LedgerEntry(dag_id="d", task_id="g2", epoch=1, regime="process_pairs", run_id="epoch-1", try_number=1, map_index=0,
    ...                     inputs=(InputRef(task_id="g1", output="output", through=1, map_index=0), InputRef(task_id="g1", output="output", through=1, map_index=1)))]
    >>> [(e.processor, [i.map_index for i in e.inputs]) for e in without_processors(rows, {"g1[1]"})]
    [('g2[0]', [0])]
    """
    kept = []
    for entry in entries:
        if entry.processor in processors:
            continue
        inputs = tuple(i for i in entry.inputs if ProcessorId(task=i.task_id, map_index=i.map_index) not in processors)
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
