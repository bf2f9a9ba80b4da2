"""What a replay checks before it writes anything: that the store can still carry the plan out,
that every epoch it re-runs has a DAG run, and that Airflow lets the caller clear them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from falkirk.plugins.airflow_rest import AirflowClient
from falkirk.plugins.dag_facts import latest_run_epoch, regimes_and_clock, runs_at_dates
from falkirk.plugins.discard import beyond_note, rows_beyond
from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.chains import current_rows, state_available
from falkirk.policies.planning.from_ledger import compute_plan
from falkirk.policies.planning.recovery import PlanError, RecoveryPlan
from falkirk.policies.regimes import Regime
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import LedgerEntry, LedgerSnapshot, entries_of
from falkirk.policies.store.readability import StoreReadability


def check_still_current(recovery: RecoveryPlan, store: StoreConfig, snapshot: LedgerSnapshot, resuming: bool,
                        replan: bool = True) -> None:
    """Refuse a plan the store can no longer execute: the ledger changed since it was computed
    (unless the replay resumes: its own invalidations changed it), a checkpoint it restores or an
    output it re-reads is gone, or (``replan``) it would now be another plan. ``snapshot``: the
    DAG's ledger as the replay read it; the plan is computed again from it, not from another read."""
    if not resuming and snapshot.dag_version != recovery.ledger_version:
        raise PlanError(f"plan {recovery.plan_id}: the ledger changed since the plan was computed (DAG "
                        f"{recovery.dag_id}'s ledger version {recovery.ledger_version} then, {snapshot.dag_version} "
                        f"now); compute a new plan with `falkirk plan`")
    current, rolled = entries_of(snapshot.rows, snapshot.gone)
    problems = _unreadable(recovery, StoreReadability(store, [*current, *rolled]), current)
    if problems:
        raise PlanError(f"plan {recovery.plan_id} can no longer run: it restores or re-reads "
                        f"{'; '.join(problems)}, which the store no longer holds (garbage-collected or lost "
                        f"since the plan was computed); compute a new plan with `falkirk plan`")
    if replan and not resuming:
        regimes = {t.task_id: Regime.parse(t.regime) for t in recovery.tasks}
        again = compute_plan(recovery.dag_id, store, recovery.failures, regimes, last_epoch=recovery.last_epoch,
                             record=False, snapshot=snapshot)
        if again.plan_id != recovery.plan_id:
            raise PlanError(f"plan {recovery.plan_id}: the store changed since the plan was computed (it would "
                            f"now be plan {again.plan_id}: a checkpoint was collected or lost); compute a new "
                            f"plan with `falkirk plan`")


def _unreadable(recovery: RecoveryPlan, readable: StoreReadability, current: list[LedgerEntry]) -> list[str]:
    by_key = {(e.processor, e.epoch): e for e in current}
    by_epoch = {p: {r.epoch: r for r in rows} for p, rows in current_rows(current).items()}
    problems = []
    for t in recovery.tasks:
        if t.restore_from is not None:
            row = by_key.get((t.task_id, t.restore_from.epoch))
            # counted as the planner counts it: a sender-log state may be rebuilt instead of read
            if row is None or not (readable(t.restore_from.uri, row.key) or state_available(row, readable, by_epoch)):
                problems.append(f"{t.task_id}'s state of epoch {t.restore_from.epoch} at {t.restore_from.uri}")
        for src, output, epochs in t.rereads:
            for epoch in epochs:
                row = by_key.get((ProcessorId.parse(src), epoch))
                ref = next((o for o in row.outputs if o.name == output), None) if row else None
                if ref is None or row is None or not readable(ref.uri, row.key):
                    where = f" at {ref.uri}" if ref else ""
                    problems.append(f"{src}'s output {output!r} of epoch {epoch}{where}")
    return problems


def check_may_clear(recovery: RecoveryPlan, runs: Mapping[int, str], client: AirflowClient) -> None:
    """Ask Airflow to clear the plan's re-run set as a dry run, one call per DAG run (``runs``:
    epoch -> run id): it raises :class:`AirflowError` if the caller may not, and changes nothing."""
    rerun = recovery.rerun_set()
    for epoch in sorted({e for _, e in rerun} & set(runs)):
        client.clear(recovery.dag_id, runs[epoch], sorted(t for t, e in rerun if e == epoch), dry_run=True)


def check_no_rows_without_runs(recovery: RecoveryPlan, current: list[LedgerEntry], client: AirflowClient) -> None:
    """Refuse a replay while the ledger has rows past the plan's last epoch whose DAG runs are
    gone (a run made by mistake, then deleted): the replay would have to clear them in runs that
    do not exist. ``falkirk discard`` withdraws them."""
    beyond = rows_beyond(current, recovery.last_epoch)
    if beyond is None:
        return
    _, clock = regimes_and_clock(recovery.dag_id, client)
    latest_epoch = latest_run_epoch(recovery.dag_id, client, clock) if clock is not None else None
    if latest_epoch is not None and latest_epoch < beyond[1]:
        gone = (max(beyond[0], latest_epoch + 1), beyond[1])
        raise PlanError(f"plan {recovery.plan_id}: {beyond_note(recovery.dag_id, latest_epoch, gone)}; the replay "
                        f"cannot clear task instances of runs that do not exist, so discard them first, then plan "
                        f"again")


def run_ids(recovery: RecoveryPlan, entries: Iterable[LedgerEntry], client: AirflowClient) -> dict[int, str]:
    """The DAG run of each epoch the plan re-runs that has one: from the ledger, or, for a run
    that committed nothing, from Airflow by its date on the DAG's epoch clock (the logical date,
    or for a run started on asset events the partition's). See :func:`check_missing_runs` for
    the epochs without."""
    runs = {e.epoch: e.run_id for e in entries}
    missing = sorted({e for _, e in recovery.rerun_set()} - set(runs))
    clock = regimes_and_clock(recovery.dag_id, client)[1] if missing else None
    if clock is not None:
        runs.update(runs_at_dates(recovery.dag_id, client, clock, missing))
    return runs


def check_missing_runs(recovery: RecoveryPlan, runs: Mapping[int, str], client: AirflowClient) -> None:
    """Refuse a plan with epochs that have no DAG run, changing nothing, unless the replay can get
    them one: a DAG scheduled on Assets whose run of an epoch Airflow never started (it was
    paused when the event arrived) gets it from the event emitted again
    (:func:`falkirk.plugins.replay.executor.start_missing_runs`)."""
    missing = sorted({e for _, e in recovery.rerun_set()} - set(runs))
    if not missing:
        return
    dag_id = recovery.dag_id
    if not client.scheduling_assets(dag_id):
        raise PlanError(f"epochs {missing} have no ledger row from any task and no DAG run in Airflow, so the "
                        f"replay has nothing to run them in: trigger them (falkirk trigger --dag {dag_id}), or plan "
                        f"with --last-epoch {min(missing) - 1}")
    if client.is_paused(dag_id):
        raise PlanError(f"epochs {missing} of {dag_id} have no DAG run: {dag_id} is paused, and Airflow starts no "
                        f"run of a paused DAG on an asset event; unpause it (airflow dags unpause {dag_id}), then "
                        f"replay again: falkirk replay {recovery.plan_id}")
