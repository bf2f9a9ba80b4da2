"""Recovery through Airflow: plan from the ledger and Airflow's failed task instances.

:func:`plan` gathers the facts (the ledger's rows, what the store can still read, the failed
task instances Airflow reports, the regimes of the DAG's tasks) and asks
:func:`falkirk.policies.planning.from_ledger.compute_plan` for a
:class:`~falkirk.policies.planning.recovery.RecoveryPlan`, which it records in the recovery log
so that ``falkirk replay PLAN_ID`` can find it; :func:`falkirk.plugins.replay.replay` carries a
recorded plan out.

Example::

    client = AirflowClient("http://127.0.0.1:8080", "admin", "admin")
    p = plan("falkirk_clicks", store, client, failed_tasks=["clean"])
    print(p.table())
    replay(p.plan_id, store, client, holder="admin")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from falkirk.plugins.airflow_rest import AirflowClient, partition_date_of
from falkirk.plugins.dag_facts import latest_run_epoch, regimes_and_clock
from falkirk.plugins.dags_test import is_test_instance
from falkirk.plugins.replay import ReplayReport, RunningReplay, replay, start_replay
from falkirk.plugins.replay.checks import check_may_clear, run_ids
from falkirk.policies.epochs import EpochClock, EpochError
from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.from_ledger import MAX_EPOCHS_AHEAD, compute_plan  # noqa: F401
from falkirk.policies.planning.recovery import (
    BadEpoch,
    FailedTask,
    Failure,
    LostScratch,
    LostWorker,
    PlanError,
    RecoveryPlan,
)
from falkirk.policies.planning.recovery_log import AlreadyReplayed, LeaseHeld, RecoveryLog, live_lease
from falkirk.policies.regimes import Regime
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.control import Collections
from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot, entries_of

Progress = Callable[[str], None]

def plan(
    dag_id: str,
    store: StoreConfig,
    client: AirflowClient | None = None,
    *,
    failed_tasks: Sequence[str] = (),
    failed_instances: Sequence[tuple[str, int]] = (),
    lost_scratch: Sequence[str] = (),
    lost_workers: Sequence[str] = (),
    bad_epochs: Sequence[tuple[str, int]] = (),
    stale_inputs: bool = False,
    last_epoch: int | None = None,
    record: bool = True,
) -> RecoveryPlan:
    """The recovery plan for the failures named (see the module docstring).

    ``stale_inputs`` adds, as bad epochs, the checkpoints that read an epoch of another DAG's
    task (through an Asset) in an incarnation that DAG's ledger no longer names: what a
    recovery there left stale here.

    ``failed_tasks`` names tasks whose failed instances are read from Airflow (every
    failed instance of the DAG when it holds ``"*"``), and with them the instances Airflow
    reports successful although the ledger has no row for them (a lost ledger commit, or a
    "mark success" by hand); ``failed_instances`` names (task, epoch) pairs directly.
    """
    if client is not None and not client.dag_exists(dag_id):
        raise PlanError(f"--dag: Airflow has no DAG {dag_id!r}")
    failures: list[Failure] = [FailedTask(t, e) for t, e in failed_instances]
    if failed_tasks and client is None:
        raise PlanError("--failed-task without an epoch reads failed task instances from Airflow: "
                        "give --airflow-url and credentials, or write TASK:EPOCH")
    regimes, clock = regimes_and_clock(dag_id, client) if client is not None else ({}, None)
    if failed_tasks and client is not None:
        snapshot = LedgerSnapshot(Ledger(store), dag_id)
        every = entries_of(snapshot.rows, set())[0]  # rolled-back rows too
        lost = [] if live_lease(RecoveryLog(store).events(dag_id), dag_id) else _unrecorded_from_airflow(
            dag_id, client, snapshot.entries(), every, regimes, Collections(store).through(dag_id))
        found = _failed_from_airflow(dag_id, client, failed_tasks, every, lost, clock, snapshot.entries())
        newest = max((e.epoch for e in every), default=0)
        if last_epoch is None and any(f.epoch > newest for f in found):  # a run that committed nothing
            last_epoch = max(f.epoch for f in found)
        failures += found
    if last_epoch is None and client is not None and clock is not None:
        # Runs created after the failure (queued behind it, or on a lost worker's queue) are re-run too.
        last_epoch = latest_run_epoch(dag_id, client, clock)
    failures += [LostScratch(loc) for loc in lost_scratch]
    failures += [LostWorker(name) for name in lost_workers]
    failures += [BadEpoch(t, e) for t, e in bad_epochs]
    if stale_inputs:
        # Nothing stale is an error only when nothing else was named to plan from.
        failures += _stale_inputs(dag_id, store, required=not failures)
    return compute_plan(dag_id, store, failures, regimes, last_epoch=last_epoch, record=record)


def _stale_inputs(dag_id: str, store: StoreConfig, required: bool = True) -> list[BadEpoch]:
    """The DAG's checkpoints whose asset inputs their producers' ledgers no longer name, as bad
    epochs; ``required``: none is an error (the plan has nothing else to start from)."""
    from falkirk.policies.planning.assets import stale_reads

    ledger = Ledger(store)
    rows = LedgerSnapshot(ledger, dag_id).entries()
    producers = sorted({read.dag_id for row in rows for read in row.asset_inputs})
    stale = stale_reads(rows, [e for dag in producers for e in LedgerSnapshot(ledger, dag).entries()])
    if not stale and required:
        raise PlanError(f"--stale-inputs: no checkpoint of {dag_id} read an epoch of another DAG that a recovery "
                        f"there has redone or rolled back since" + ("" if producers else
                                                                     " (it reads no other DAG through an Asset)"))
    return list(dict.fromkeys(BadEpoch(row.processor, row.epoch) for row, _ in stale))


def _unrecorded_from_airflow(dag_id: str, client: AirflowClient, current: Sequence[LedgerEntry],
                             every: Sequence[LedgerEntry], regimes: Mapping[ProcessorId, Regime],
                             collected: Mapping[str, int], newest_runs: int = 100) -> list[FailedTask]:
    """Instances of Falkirk tasks that Airflow reports successful although the ledger has no
    current row for them (see :func:`falkirk.plugins.grid_status.unrecorded`), among the newest
    runs; ``current`` are the ledger's current rows, ``every`` includes the rolled-back ones."""
    present = {(e.processor, e.epoch) for e in current}
    runs = {e.epoch: e.run_id for e in every}
    missing = {(t, e) for t in regimes for e in runs if (t, e) not in present and e > collected.get(t, 0)}
    with_rows = {e.epoch for e in current}
    found = []
    for epoch in sorted({e for _, e in missing}, reverse=True)[:newest_runs]:
        if epoch not in with_rows and not client.run_exists(dag_id, runs[epoch]):
            continue  # only rolled-back rows, of a run deleted since (a discard)
        states = client.task_instances(dag_id, runs[epoch])
        found += [FailedTask(t, epoch) for t, e in sorted(missing) if e == epoch
                  and states.get(t, {}).get("state") == "success"]
    return found


def _failed_from_airflow(dag_id: str, client: AirflowClient, tasks: Sequence[str],
                         entries: Sequence[LedgerEntry], unrecorded: Sequence[FailedTask] = (),
                         clock: EpochClock | None = None, current: Sequence[LedgerEntry] = ()) -> list[FailedTask]:
    """The failed instances of ``tasks`` (every task for ``"*"``), and those of ``unrecorded``:
    successful in Airflow without a ledger row, which must run again as well. A run with no
    ledger row at all gets its epoch from its logical date and the DAG's epoch clock.
    ``current``: the ledger's current rows, by which a failed instance of a successful run is
    told apart (see below)."""
    epoch_of = {e.run_id: e.epoch for e in entries}
    committed = {(e.processor, e.epoch) for e in current}
    found = [f for f in unrecorded if "*" in tasks or f.task_id in tasks or ProcessorId.parse(f.task_id).task in tasks]
    failed = [ti for ti in client.failed_task_instances(dag_id) if not is_test_instance(ti)]
    # A failed instance in a successful run is settled when its epoch is committed: a second run
    # of a redone epoch, refused, then set to success naming the plan that redid it. One without
    # a row is a failure: a replica of a process pair whose twin's readers went on, so Airflow
    # set the run to success, while its next epoch waits on it (depends_on_past).
    succeeded = {run for run in {ti["dag_run_id"] for ti in failed}
                 if client.dag_run(dag_id, run).get("state") == "success"}
    for ti in failed:
        name = ProcessorId(task=ti["task_id"], map_index=ti.get("map_index", -1))
        if not ("*" in tasks or ti["task_id"] in tasks or name in tasks):
            continue
        run = ti["dag_run_id"]
        if run not in epoch_of and clock is not None and (date := _run_date(dag_id, client, ti)):
            try:
                epoch_of[run] = clock.epoch_of(date)
            except EpochError as exc:
                if run in succeeded:
                    continue
                raise PlanError(f"failed task instance {ti['task_id']} of run {run}: {exc}") from None
        if run in succeeded and (run not in epoch_of or (name, epoch_of[run]) in committed):
            continue
        if run not in epoch_of:
            raise PlanError(f"failed task instance {ti['task_id']} of run {run}: no task of that "
                            f"run is in the ledger, so its epoch is unknown; use --failed-task TASK:EPOCH")
        if FailedTask(name, epoch_of[run]) not in found:
            found.append(FailedTask(name, epoch_of[run]))
    named = {f.task_id for f in found} | {ProcessorId.parse(f.task_id).task for f in found}
    for task in tasks:
        if task != "*" and task not in named:
            raise PlanError(f"--failed-task {task}: Airflow reports no failed instance of {task!r} in {dag_id!r}; "
                            f"name an epoch (--failed-task {task}:EPOCH) or use --bad-epoch")
    if not found:
        raise PlanError(f"--failed-task: Airflow reports no failed task instance in {dag_id!r}")
    return sorted(found, key=lambda f: (f.epoch, f.task_id))


def _run_date(dag_id: str, client: AirflowClient, ti: Mapping[str, Any]) -> datetime | None:
    """The date of the epoch a task instance's run ran: its logical date, or for a run Airflow
    started on asset events (which has none) the date of the partition it ran (the producer
    epoch's key, see :func:`falkirk.policies.asset_events.run_date`)."""
    if ti.get("logical_date"):
        return datetime.fromisoformat(ti["logical_date"])
    return partition_date_of(client.dag_run(dag_id, ti["dag_run_id"]))


__all__ = ["AlreadyReplayed", "LeaseHeld", "ReplayReport", "RunningReplay", "check_may_clear", "compute_plan",
           "latest_run_epoch", "plan", "replay", "run_ids", "start_replay"]
