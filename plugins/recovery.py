"""Recovery through Airflow: plan from the ledger and Airflow's failed task instances, then replay.

:func:`plan` gathers the facts (the ledger's rows, what the store can still read, the
failed task instances Airflow reports, the regimes of the DAG's tasks) and asks
:func:`falkirk.policies.planning.recovery.plan_recovery` for a :class:`~falkirk.policies.planning.recovery.RecoveryPlan`,
which it records in the recovery log so that ``falkirk replay PLAN_ID`` can find it.

:func:`replay` executes a recorded plan, in this order:

1. refuse if the plan was already executed (nothing to do), if the ledger changed since
   the plan was computed, or if another recovery of the DAG holds the lease;
2. take the lease (``started`` in the recovery log);
3. invalidate the ledger rows of every task instance to re-run (append-only): the
   runtime then restores each rolled-back task from the checkpoint at its frontier and
   redoes each epoch as the next incarnation;
4. clear exactly the re-run set through the REST API, one call per DAG run, without
   upstream or downstream expansion, with the caller's own token; Airflow runs each
   stateful task's epochs in order (``depends_on_past``);
5. wait for every cleared instance to succeed, reporting progress, and give the lease
   back (``finished``, or ``failed`` with the reason).

Example::

    client = AirflowClient("http://127.0.0.1:8080", "admin", "admin")
    p = plan("falkirk_clicks", store, client, failed_tasks=["clean"])
    print(p.table())
    replay(p.plan_id, store, client, holder="admin")
"""

from __future__ import annotations

import getpass
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from falkirk.plugins.airflow_rest import (
    FALKIRK_API,
    AirflowClient,
    AirflowError,
    api_path,
    failed_runs,
    partition_date_of,
)
from falkirk.plugins.dags_test import is_test_instance
from falkirk.plugins.discard import beyond_note, rows_beyond
from falkirk.plugins.outlet_events import emit_missing_events
from falkirk.policies.epochs import EpochClock, EpochError
from falkirk.policies.faults import crash_point
from falkirk.policies.ids import ProcessorId, ReplicaId
from falkirk.policies.partitions import processors
from falkirk.policies.planning.chains import TaskGraph, current_rows, state_available
from falkirk.policies.planning.from_ledger import MAX_EPOCHS_AHEAD, compute_plan, taken_over_replicas  # noqa: F401
from falkirk.policies.planning.recovery import (
    BadEpoch,
    DiscardedEpochs,
    FailedTask,
    Failure,
    LostScratch,
    LostWorker,
    PlanError,
    RecoveryPlan,
)
from falkirk.policies.planning.recovery_log import (
    AlreadyReplayed,
    Lease,
    LeaseHeld,
    RecoveryLog,
    check_not_finished,
    lease_seconds,
    live_lease,
)
from falkirk.policies.planning.replay_decisions import (
    AirflowRun,
    Instance,
    LaterRow,
    RolledBack,
    affected_later,
    clears_needed,
    marks_in_order,
    rows_to_sweep,
    runs_to_settle,
    slots_to_free,
    wait_verdict,
)
from falkirk.policies.regimes import Regime
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import StoreUnreachable, unanswered
from falkirk.policies.store.control import Collections, Completions
from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot, entries_of
from falkirk.policies.store.readability import StoreReadability

_log = logging.getLogger(__name__)

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
    regimes, clock = _regimes(dag_id, client) if client is not None else ({}, None)
    if failed_tasks and client is not None:
        snapshot = LedgerSnapshot(Ledger(store), dag_id)
        every = entries_of(snapshot.rows, set())[0]  # rolled-back rows too
        lost = [] if live_lease(RecoveryLog(store).events(dag_id), dag_id) else _unrecorded_from_airflow(
            dag_id, client, snapshot.entries(), every, regimes, Collections(store).through(dag_id))
        found = _failed_from_airflow(dag_id, client, failed_tasks, every, lost, clock)
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


def latest_run_epoch(dag_id: str, client: AirflowClient, clock: EpochClock) -> int | None:
    """The epoch of the DAG's latest run (``airflow dags test`` runs left out): the last epoch a
    plan covers, which may be past the ledger's newest epoch (runs that committed nothing yet)
    or before it (rows of runs deleted since: see :func:`falkirk.plugins.discard.beyond_note`);
    ``None`` when the DAG has no run on its epoch grid. A DAG scheduled on Assets has runs
    without a logical date: the date of the latest partition they run counts then."""
    latest = client.latest_logical_date(dag_id) or client.latest_partition_date(dag_id)
    if latest is None:
        return None
    try:
        return clock.epoch_of(latest)
    except EpochError:
        return None


@dataclass(frozen=True)
class ReplayReport:
    """What a replay did: the task instances it cleared, per DAG run, and how long it took."""

    plan_id: str
    cleared: dict[str, tuple[str, ...]]
    invalidated: int
    seconds: float
    already_done: bool = False
    resumed: bool = False


def replay(
    plan_id: str,
    store: StoreConfig,
    client: AirflowClient,
    holder: str | None = None,
    progress: Progress = print,
    timeout: float = 3600,
    poll: float = 2.0,
) -> ReplayReport:
    """Execute the recorded plan ``plan_id`` (see the module docstring) and wait for it.

    Running it again after an executor died half-way resumes it: what is already
    invalidated stays so, and only the task instances that did not already re-run (or are
    not already waiting to) are cleared.
    """
    try:
        running = start_replay(plan_id, store, client, holder, progress)
    except AlreadyReplayed:
        progress(f"plan {plan_id} was already executed; nothing to do")
        return ReplayReport(plan_id, {}, 0, 0.0, already_done=True)
    return running.wait(progress, timeout, poll)


@dataclass
class RunningReplay:
    """A replay whose lease is held and whose re-run set is cleared; :meth:`wait` finishes it."""

    plan: RecoveryPlan
    log: RecoveryLog
    lease: Lease
    client: AirflowClient
    runs: dict[int, str]
    cleared: dict[str, tuple[str, ...]]
    invalidated: int
    started: float
    store: StoreConfig | None = None
    marked: set[str] = field(default_factory=set)  # runs with instances the replay marked success
    queued_again: set[str] = field(default_factory=set)  # runs the replay set back to queued
    # Replicas of process pairs that their twins took over (``task[i]``): they stay skipped.
    dead_replicas: frozenset[str] = frozenset()

    def wait(self, progress: Progress = print, timeout: float = 3600, poll: float = 2.0) -> ReplayReport:
        """Wait until every re-run succeeded, renewing the lease, then clear what later DAG runs
        computed from rolled-back epochs meanwhile, and give the lease back."""
        rerun = self.plan.rerun_set()
        try:
            _wait(self, set(rerun), progress, timeout, poll)
            follow_on = _later_runs(self, progress)
            while follow_on:
                _wait(self, follow_on, progress, timeout, poll)
                follow_on = _later_runs(self, progress)
            _settle_runs(self, progress)
            _hand_back_slots(self, progress, timeout, poll)
            if self.store is not None:
                _settle_second_runs(self, progress)
        except BaseException as exc:
            self.fail(exc)
            raise
        self.log.end(self.lease, "finished", f"{len(rerun)} task instances re-ran")
        seconds = time.monotonic() - self.started
        progress(f"plan {self.plan.plan_id}: done, {len(rerun)} task instances re-ran in {seconds:.0f}s")
        return ReplayReport(self.plan.plan_id, self.cleared, self.invalidated, seconds, resumed=self.lease.resumed)

    def renew(self) -> None:
        """Renew the lease if a third of it has passed (raises ``LeaseLost`` if it was taken)."""
        now = datetime.now(UTC)
        if (now - (self.lease.last_seen or self.lease.since)).total_seconds() >= lease_seconds() / 3:
            self.lease = self.log.renew(self.lease)

    def fail(self, exc: BaseException) -> None:
        """Record the failure and give the lease back; if the store cannot take that row (it is
        what failed), the lease simply expires and the plan resumes from where it stopped."""
        try:
            self.log.end(self.lease, "failed", f"{type(exc).__name__}: {exc}"[:2000])
        except Exception as unrecorded:  # noqa: BLE001 (the original failure is what the caller sees)
            if not (unanswered(unrecorded) or isinstance(unrecorded, StoreUnreachable)):
                raise
            _log.warning("plan %s: could not record the failure (%s); the lease expires at %s", self.plan.plan_id,
                        type(unrecorded).__name__, self.lease.expires_at())


def start_replay(
    plan_id: str,
    store: StoreConfig,
    client: AirflowClient,
    holder: str | None = None,
    progress: Progress = print,
) -> RunningReplay:
    """Check, take the lease, check again, invalidate, clear (see the module docstring).

    Raises :class:`AlreadyReplayed` for a plan that finished, :class:`LeaseHeld` while
    another recovery (or a garbage collection) of the DAG runs, :class:`PlanError` when the
    ledger or the store changed since the plan was computed (a checkpoint it restores, or an
    input it re-reads, is gone), and :class:`AirflowError` when Airflow refuses to clear the
    task instances (checked with a dry run first); in each case no ledger row is invalidated
    and no task instance cleared.
    """
    started = time.monotonic()
    holder = holder or getpass.getuser()
    log, ledger = RecoveryLog(store), Ledger(store)
    recovery = log.plan(plan_id)
    if any(isinstance(f, DiscardedEpochs) for f in recovery.failures):
        raise PlanError(f"plan {plan_id} records a discard (`falkirk discard`), which re-runs nothing; there is "
                        f"nothing to replay")
    events = log.events(recovery.dag_id)
    check_not_finished(events, plan_id)
    resuming = any(r["plan_id"] == plan_id and r["event"] in ("started", "resumed") for r in events)
    _validate(recovery, store, resuming)  # refuse early, before anything is written
    entries = ledger.entries(recovery.dag_id, include_invalidated=True)
    _check_no_rows_without_runs(recovery, ledger, client)
    rerun = recovery.rerun_set()
    # Airflow checks the caller's rights (changing nothing) before the lease is taken: a caller it
    # refuses leaves no "started" record behind, which would let the next replay resume the plan
    # without checking that it is still current.
    runs = _run_ids(recovery, entries, client)
    _check_missing_runs(recovery, runs, client)
    check_may_clear(recovery, runs, client)
    lease = log.begin(recovery, holder)
    running = RunningReplay(recovery, log, lease, client, runs, {}, 0, started, store)
    try:
        if lease.resumed:
            progress(f"plan {plan_id}: resuming (the lease was {'taken over' if not resuming else 'taken again'})")
        crash_point("replay", 0, "after-lease", dag_id=recovery.dag_id)
        _validate(recovery, store, resuming)  # again under the lease: nothing can change it from here
        # One append per plan: a resumed replay whose invalidations were made adds none.
        doomed = [e for e in ledger.entries(recovery.dag_id) if (e.processor, e.epoch) in rerun]
        running.invalidated = ledger.invalidations.record(doomed, plan_id)
        progress(f"plan {plan_id}: invalidated {running.invalidated} ledger rows past the frontiers")
        crash_point("replay", 0, "after-invalidations", dag_id=recovery.dag_id)
        # Only now the epochs with no run get theirs (their runs commit as soon as they start,
        # which the checks and the invalidations above must not see).
        _start_missing_runs(recovery, running.runs, client, store, progress)
        _sweep_later_rows(running, ledger, progress)
        _settle_kept_instances(running, ledger, progress)
        _restore_lost_pairs(running, progress)
        # (after the restore: a partition that lost both replicas is active again, not taken over)
        todo = _to_clear(running, ledger, progress)
        skipped = len(rerun) - len(todo)
        if skipped:
            progress(f"plan {plan_id}: {skipped} task instances already re-ran or are waiting to; not cleared again")
        _clear(running, todo, progress)
    except BaseException as exc:
        running.fail(exc)
        raise
    return running


def check_may_clear(recovery: RecoveryPlan, runs: Mapping[int, str], client: AirflowClient) -> None:
    """Ask Airflow to clear the plan's re-run set as a dry run, one call per DAG run (``runs``:
    epoch -> run id): it raises :class:`AirflowError` if the caller may not, and changes nothing."""
    rerun = recovery.rerun_set()
    for epoch in sorted({e for _, e in rerun} & set(runs)):
        client.clear(recovery.dag_id, runs[epoch], sorted(t for t, e in rerun if e == epoch), dry_run=True)


def _check_no_rows_without_runs(recovery: RecoveryPlan, ledger: Ledger, client: AirflowClient) -> None:
    """Refuse a replay while the ledger has rows past the plan's last epoch whose DAG runs are
    gone (a run made by mistake, then deleted): the replay would have to clear them in runs that
    do not exist. ``falkirk discard`` withdraws them."""
    beyond = rows_beyond(ledger.entries(recovery.dag_id), recovery.last_epoch)
    if beyond is None:
        return
    _, clock = _regimes(recovery.dag_id, client)
    latest_epoch = latest_run_epoch(recovery.dag_id, client, clock) if clock is not None else None
    if latest_epoch is not None and latest_epoch < beyond[1]:
        gone = (max(beyond[0], latest_epoch + 1), beyond[1])
        raise PlanError(f"plan {recovery.plan_id}: {beyond_note(recovery.dag_id, latest_epoch, gone)}; the replay "
                        f"cannot clear task instances of runs that do not exist, so discard them first, then plan "
                        f"again")


def _clear(running: RunningReplay, todo: set[Instance], progress: Progress) -> None:
    recovery = running.plan
    for epoch in sorted({e for _, e in todo}):
        tasks = tuple(sorted(t for t, e in todo if e == epoch))
        running.client.clear(recovery.dag_id, running.runs[epoch], list(tasks))
        running.cleared[running.runs[epoch]] = tuple(sorted({*running.cleared.get(running.runs[epoch], ()), *tasks}))
        progress(f"plan {recovery.plan_id}: cleared epoch {epoch} ({running.runs[epoch]}): {', '.join(tasks)}")
        running.renew()
        crash_point("replay", epoch, "after-clear", dag_id=recovery.dag_id)


def _settle_kept_instances(running: RunningReplay, ledger: Ledger, progress: Progress) -> int:
    """Mark success the failed task instances of the plan's epochs that the plan keeps: their
    epoch is committed, current and completed, yet Airflow shows them failed because it re-ran
    them and the operator refused (a Clear or a backfill of a completed epoch, see
    :func:`falkirk.spark_jobs.runtime.already_committed`), failing what is
    downstream too. Left failed, the re-runs downstream of them would wait on them for ever.

    Airflow clears the failed instances downstream of one marked success; so the downstream
    ones are marked first, and what Airflow clears is only what the plan re-runs anyway."""
    recovery = running.plan
    rerun = recovery.rerun_set()
    first = min((e for _, e in rerun), default=recovery.last_epoch + 1)
    rows = [e for e in ledger.entries(recovery.dag_id) if first <= e.epoch <= recovery.last_epoch
            and (e.processor, e.epoch) not in rerun and e.epoch in running.runs]
    kept = {(e.processor, e.epoch): e for e in (Completions(running.store).completed_among(rows)
                                              if running.store is not None else [])}
    if not kept:
        return 0
    graph = TaskGraph.from_ledger(ledger.entries(recovery.dag_id, include_invalidated=True))
    states = {epoch: {t: ti.get("state") for t, ti in running.client.task_instances(
        recovery.dag_id, running.runs[epoch]).items()} for epoch in sorted({e for _, e in kept})}
    marks = marks_in_order(kept, states, reach={t: len(graph.downstream(t)) for t in graph.tasks})
    for task, epoch in marks:
        _mark_completed(running, kept[task, epoch], progress)
    marked = len(marks)
    if marked:
        progress(f"plan {recovery.plan_id}: marked {marked} refused re-runs of kept epochs success")
    return marked


def _to_clear(running: RunningReplay, ledger: Ledger, progress: Progress,
              wanted: Iterable[Instance] | None = None) -> set[Instance]:
    """Of ``wanted`` (the plan's re-run set), the task instances that still need a clear: not
    redone (no current ledger row) and settled in Airflow, or never run in a run that ended;
    and those redone but marked failed in Airflow (killed after their commit: the re-run finds
    the commit and succeeds without changing it). One redone whose job returned (its epoch
    completed) but that Airflow shows failed (its state update was lost) is marked success
    instead: a re-run of a completed epoch is refused.

    A resumed replay therefore never clears an instance the previous executor already cleared
    (it is queued, running, or has re-run and committed). Instances waiting on the queue of a
    worker the plan declares lost are cleared too, so that placement moves them.
    """
    recovery = running.plan
    wanted = set(recovery.rerun_set() if wanted is None else wanted)
    # Airflow's states first, the ledger after: a task commits before Airflow marks it success,
    # so one seen settled here has its row in the read below. (Read the other way round, an
    # instance that commits between the two reads looks settled without a row, and is cleared
    # again: its re-run is then refused as a re-run of a completed epoch.)
    runs = {}
    for epoch in sorted({e for _, e in wanted}):
        run = running.runs[epoch]
        tis = running.client.task_instances(recovery.dag_id, run)
        runs[epoch] = AirflowRun({t: ti.get("state") for t, ti in tis.items()},
                                 {t: ti.get("queue") for t, ti in tis.items()},
                                 running.client.dag_run(recovery.dag_id, run).get("state"))
    rows = {(e.processor, e.epoch): e for e in ledger.entries(recovery.dag_id)}  # current rows only
    completed = {(e.processor, e.epoch) for e in (Completions(running.store).completed_among(
        [rows[k] for k in wanted if k in rows]) if running.store is not None else [])}
    # Instances waiting on a lost worker's queue never run there: cleared, placement sends them
    # to a live worker (and a resumed replay finds them on that worker's queue).
    lost = {f.worker for f in recovery.failures if isinstance(f, LostWorker)}
    # A replica its twin took over stays skipped: run again it would only find itself dead. Read
    # each time: a worker lost while the replay runs has its replicas taken over meanwhile.
    if running.store is not None:
        running.dead_replicas = frozenset(taken_over_replicas(running.store, recovery.dag_id))
    wanted = {(t, e) for t, e in wanted if not (t in running.dead_replicas and runs[e].states.get(t) == "skipped")}
    decided = clears_needed(wanted, runs, set(rows), completed, lost)
    for task, epoch in decided.mark_success:
        _mark_completed(running, rows[task, epoch], progress)
    return set(decided.clear)


def _restore_lost_pairs(running: RunningReplay, progress: Progress) -> None:
    """Partitions of paired tasks that lost both replicas and that the plan re-executes (the
    durable path) get two new replicas, active, on live workers, before anything is cleared."""
    from falkirk.policies.pairs import restore_workers
    from falkirk.policies.store.control import PairLayouts
    from falkirk.policies.workers import pair_workers

    if running.store is None:
        return
    layouts = PairLayouts(running.store)
    before = layouts.load(running.plan.dag_id)
    if before is None:
        return
    lost = set(before.lost_partitions())
    wanted = {(p.task, ReplicaId.of(task=p.task, map_index=p.map_index).partition)
              for p in (ProcessorId.parse(name) for name, _ in running.plan.rerun_set()) if p.partitioned} & lost
    if not wanted:
        return
    live = restore_workers(before, pair_workers())
    after = before
    for task, partition in sorted(wanted):
        after = after.restore(task, partition, live)
    layouts.save(running.plan.dag_id, after, before=before)
    progress(f"plan {running.plan.plan_id}: restored {', '.join(ReplicaId.partition_name(t, p) for t, p in sorted(wanted))} on the "
             f"durable path: both replicas re-run from their durable state on {', '.join(live)}")


def _settle_runs(running: RunningReplay, progress: Progress) -> None:
    """Set to success the DAG runs the replay settled: Airflow recomputes a run's state only
    while it runs, so a failed run whose failed instances were marked success (rather than
    cleared) would stay failed in the runs list."""
    dag_id = running.plan.dag_id
    decided = runs_to_settle(failed_runs(running.client, dag_id, set(running.cleared) | running.marked))
    for run in decided.success:
        running.client.set_run_state(dag_id, run, "success",
                                     note=f"Falkirk plan {running.plan.plan_id}: every task instance of this epoch "
                                          f"is done")
    if decided.success:
        progress(f"plan {running.plan.plan_id}: set {len(decided.success)} DAG runs to success: "
                 f"{', '.join(decided.success)}")
    for run in decided.requeue:
        _queue_again(running, run, f"Falkirk plan {running.plan.plan_id}: the rest of this epoch runs (Airflow "
                                   f"cleared it when the plan marked a task success)")
    if decided.requeue:
        progress(f"plan {running.plan.plan_id}: queued {len(decided.requeue)} DAG runs again to run the task "
                 f"instances Airflow cleared: {', '.join(decided.requeue)}")
    for run, why in decided.left.items():
        progress(f"plan {running.plan.plan_id}: DAG run {run} stays failed: {why} (not a task this plan re-runs)")


def _settle_second_runs(running: RunningReplay, progress: Progress) -> None:
    """Mark success the consumer's refused second runs of the epochs the plan redid
    (:func:`falkirk.plugins.asset_recovery.settle_second_runs`)."""
    from falkirk.plugins.asset_recovery import settle_second_runs

    settle_second_runs(running.plan, running.store, running.client, progress)  # type: ignore[arg-type]


def _mark_completed(running: RunningReplay, entry: LedgerEntry, progress: Progress) -> None:
    """Mark success the task instance of ``entry``, a commit whose epoch completed, after
    emitting the asset events its failed attempt did not (:mod:`falkirk.plugins.outlet_events`):
    emitted first, so that a replay resumed after a crash between the two still emits them."""
    task, epoch = entry.processor, entry.epoch
    emitted = emit_missing_events(running.client, entry)
    if emitted:
        progress(f"plan {running.plan.plan_id}: emitted the asset events of {task} epoch {epoch} "
                 f"(incarnation {entry.incarnation}) that its failed attempt did not: {', '.join(emitted)}")
    running.marked.add(running.runs[epoch])
    running.client.set_state(running.plan.dag_id, running.runs[epoch], task, "success",
                             note=f"Falkirk plan {running.plan.plan_id}: this epoch is committed and completed; "
                                  f"re-running it (refused) would change nothing")


def _affected_later(running: RunningReplay, ledger: Ledger) -> set[ProcessorId]:
    """The tasks whose epochs after the plan's last one depend on epochs the plan redoes: the
    stateful tasks it re-runs, and every task downstream of a task it re-runs."""
    graph = TaskGraph.from_ledger(ledger.entries(running.plan.dag_id, include_invalidated=True))
    redone = {t.task_id for t in running.plan.tasks if t.rerun}
    return affected_later({t: graph.downstream(t)[1:] for t in redone}, redone,
                          keeps_state={t.task_id for t in running.plan.tasks if Regime.parse(t.regime).keeps_state})


# Rows written before jobs recorded the rollbacks they checked (``rollbacks_seen``) are judged by
# their timestamps, stamped by different processes (perhaps machines): such a row stamped up to
# this long after the plan's invalidation is still swept. One swept needlessly only runs again, once.
CLOCK_SKEW = timedelta(seconds=5)


def _sweep_later_rows(running: RunningReplay, ledger: Ledger, progress: Progress) -> int:
    """Invalidate rows of epochs after the plan's last one that may have been computed from a row
    the plan (or an earlier sweep) rolled back: DAG runs that arrived while the replay started.

    Decided by :func:`~falkirk.policies.planning.replay_decisions.rows_to_sweep` in the order of
    the store's own commits, never a clock: a job records in its row the version of the
    invalidations it checked just before appending it (``rollbacks_seen``), and a row whose check
    came after a rollback of what it reads is current: its job found the rolled-back rows gone
    (a stateful task waits for its previous epoch's redo), or, if it read them before, refused or
    withdrew its own commit (``falkirk.spark_jobs.runtime``)."""
    recovery = running.plan
    since = ledger.invalidations.recorded_at(recovery.dag_id, recovery.plan_id)
    if since is None:  # the plan rolled nothing back: nothing later was computed from it
        return 0
    rolled = [RolledBack(ProcessorId(task=t, map_index=m), e, v)
              for t, m, e, v in ledger.invalidations.rolled_back_by(recovery.dag_id, recovery.plan_id)]
    rows = {LaterRow(processor=e.processor, epoch=e.epoch, incarnation=e.incarnation, rollbacks_seen=e.rollbacks_seen, committed_at=e.committed_at): e
            for e in ledger.entries(recovery.dag_id) if e.epoch > recovery.last_epoch}
    swept = rows_to_sweep(rows, recovery.last_epoch, _affected_later(running, ledger), rolled,
                          _upstream(running, ledger), since, CLOCK_SKEW)
    later = [rows[r] for r in swept]
    if not later:
        return 0
    digest = ",".join(sorted(str(e.commit_id) for e in later))
    n = ledger.invalidations.record(later, f"{recovery.plan_id}+later:{_short_hash(digest)}")
    if n:
        progress(f"plan {recovery.plan_id}: invalidated {n} rows of later DAG runs computed from rolled-back epochs")
    return n


def _upstream(running: RunningReplay, ledger: Ledger) -> dict[str, set[str]]:
    """Each task's upstream tasks in the DAG's ledger graph, itself included."""
    graph = TaskGraph.from_ledger(ledger.entries(running.plan.dag_id, include_invalidated=True))
    return {t: {u for u in graph.tasks if t in graph.downstream(u)} | {t} for t in graph.tasks}


def _later_runs(running: RunningReplay, progress: Progress) -> set[Instance]:
    """Task instances of DAG runs after the plan's last epoch that need a re-run because of it
    (they failed waiting for a rolled-back epoch, or their rows were swept), cleared here."""
    if running.store is None:
        return set()
    ledger = Ledger(running.store)
    _sweep_later_rows(running, ledger, progress)
    recovery = running.plan
    current, rolled_back = ledger.entries_and_invalidated(recovery.dag_id)
    running.runs.update({e.epoch: e.run_id for e in [*current, *rolled_back] if e.epoch not in running.runs})
    # A later epoch with only rolled-back rows may have no run any more (a discard deleted it).
    with_rows = {e.epoch for e in current}
    later = {e for e in running.runs if e > recovery.last_epoch
             and (e in with_rows or running.client.run_exists(recovery.dag_id, running.runs[e]))}
    affected = _affected_later(running, ledger)
    wanted = {(t, e) for e in later for t in affected}
    todo = _to_clear(running, ledger, progress, wanted)
    if todo:
        progress(f"plan {recovery.plan_id}: later DAG runs arrived during the recovery; re-running "
                 + ", ".join(f"{t}@{e}" for t, e in sorted(todo, key=lambda x: (x[1], x[0]))))
        _clear(running, todo, progress)
    return todo


def _validate(recovery: RecoveryPlan, store: StoreConfig, resuming: bool) -> None:
    """Refuse a plan the store can no longer execute (see :func:`start_replay`)."""
    ledger = Ledger(store)
    if not resuming:
        now = ledger.dag_version(recovery.dag_id)
        if now != recovery.ledger_version:
            raise PlanError(f"plan {recovery.plan_id}: the ledger changed since the plan was computed (DAG "
                            f"{recovery.dag_id}'s ledger version {recovery.ledger_version} then, {now} now); compute "
                            f"a new plan with `falkirk plan`")
    entries = ledger.entries(recovery.dag_id, include_invalidated=True)
    readable = StoreReadability(store, entries)
    current = ledger.entries(recovery.dag_id)
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
    if problems:
        raise PlanError(f"plan {recovery.plan_id} can no longer run: it restores or re-reads "
                        f"{'; '.join(problems)}, which the store no longer holds (garbage-collected or lost "
                        f"since the plan was computed); compute a new plan with `falkirk plan`")
    if not resuming:
        regimes = {t.task_id: Regime.parse(t.regime) for t in recovery.tasks}
        again = compute_plan(recovery.dag_id, store, recovery.failures, regimes, last_epoch=recovery.last_epoch,
                             record=False)
        if again.plan_id != recovery.plan_id:
            raise PlanError(f"plan {recovery.plan_id}: the store changed since the plan was computed (it would "
                            f"now be plan {again.plan_id}: a checkpoint was collected or lost); compute a new "
                            f"plan with `falkirk plan`")


def _short_hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _wait(running: RunningReplay, todo: set[Instance], progress: Progress, timeout: float,
          poll: float) -> None:
    client, recovery, runs, started = running.client, running.plan, running.runs, running.started
    seen: dict[Instance, str | None] = {}
    settled: set[Instance] = set()  # refused after their redo committed: settled once each
    deadline = time.monotonic() + timeout
    changed = looked = time.monotonic()
    states: dict[Instance, str | None] = {}
    while True:
        client.on_poll()
        running.renew()
        blocked = _let_earlier_epochs_through(running, todo, progress)
        if blocked and time.monotonic() - changed > _stall_seconds():
            raise AirflowError(blocked + f"; resume with: falkirk replay {recovery.plan_id}")
        if time.monotonic() - max(changed, looked) > _QUIET_SECONDS:
            looked = time.monotonic()
            stuck = _queue_failed_runs(running, {k for k in todo if k in states and states[k] is None}, progress)
            if stuck and time.monotonic() - changed > _stall_seconds():
                raise AirflowError(stuck + f"; resume with: falkirk replay {recovery.plan_id}")
        states.clear()
        for epoch in sorted({e for _, e in todo}):
            tis = client.task_instances(recovery.dag_id, runs[epoch])
            for task in sorted(t for t, e in todo if e == epoch):
                state = states[task, epoch] = tis.get(task, {}).get("state")
                if seen.get((task, epoch), "-") != state:
                    seen[task, epoch] = state
                    changed = time.monotonic()
                    progress(f"  {time.monotonic() - started:6.1f}s  epoch {epoch}  {task:<12} {state or 'waiting'}")
        verdict = wait_verdict(todo, states)
        if verdict.failed is not None and _settle_refused_redos(
                running, {k for k, s in states.items() if s == "failed" and k not in settled}, settled, progress):
            changed = time.monotonic()
            time.sleep(poll)
            continue
        if verdict.failed is not None:
            (task, epoch), state = verdict.failed
            raise AirflowError(f"{task} of epoch {epoch} ({runs[epoch]}) ended {state}; see its log in "
                               f"Airflow, fix the cause, then resume with: falkirk replay {recovery.plan_id}")
        if verdict.finished:
            return
        if time.monotonic() > deadline:
            raise AirflowError(f"timed out after {timeout:.0f}s with {verdict.done}/{verdict.total} task instances "
                               f"done; resume with: falkirk replay {recovery.plan_id}")
        time.sleep(poll)


_QUIET_SECONDS = 10.0
"""How long a replay's task instances stay as they are before it looks at their DAG runs."""


def _queue_failed_runs(running: RunningReplay, waiting: set[Instance], progress: Progress) -> str | None:
    """Queue again the failed DAG runs that hold instances this replay waits for, not started,
    and nothing else not done (:func:`~falkirk.policies.planning.replay_decisions.runs_to_settle`).
    Airflow clears the instances downstream of one the replay marks success (a refused re-run it
    settles) but leaves their run failed if it already was, and the scheduler never starts an
    instance of a failed run. Returns a diagnosis when a failed run holds them for another
    reason (an instance of it failed that this replay does not re-run), else ``None``."""
    if not waiting:
        return None
    dag_id = running.plan.dag_id
    decided = runs_to_settle(failed_runs(running.client, dag_id, {running.runs[e] for _, e in waiting}))
    for run in decided.requeue:
        _queue_again(running, run, f"queued again by Falkirk plan {running.plan.plan_id}: the instances it "
                                   f"re-runs were cleared in a failed run")
        progress(f"plan {running.plan.plan_id}: {run} was failed with instances this plan re-runs not started; "
                 f"queued it again")
    if not decided.left:
        return None
    return "the re-runs wait in failed DAG runs: " + "; ".join(
        f"{run} ({why})" for run, why in sorted(decided.left.items())) + "; clear those instances or mark them success"


def _settle_refused_redos(running: RunningReplay, failed: set[Instance], settled: set[Instance],
                          progress: Progress) -> bool:
    """Settle the re-runs Airflow shows failed although this replay's redo of their epoch is
    committed: a task process killed after its commit (with the scheduler that ran it) is run
    again by the next scheduler, and that attempt finds the epoch committed. They are settled as
    a resumed replay settles them (:func:`_to_clear`): marked success when the epoch completed
    (the attempt was refused), else cleared once to finish as a no-op. Returns whether any was;
    a failed re-run without a commit is a real failure, left to the caller."""
    if not failed or running.store is None:
        return False
    ledger = Ledger(running.store)
    redone = {(e.processor, e.epoch) for e in ledger.entries(running.plan.dag_id)} & failed
    if not redone:
        return False
    settled |= redone
    again = _to_clear(running, ledger, progress, wanted=redone)
    if again:
        _clear(running, again, progress)
    progress(f"plan {running.plan.plan_id}: {', '.join(f'{t} of epoch {e}' for t, e in sorted(redone))} failed after "
             f"the redo had committed (an attempt killed after its commit, run again): "
             + ("cleared to finish as a no-op" if again else "marked success"))
    return True


def _let_earlier_epochs_through(running: RunningReplay, todo: set[Instance], progress: Progress) -> str | None:
    """Queue again the later runs that hold the DAG's ``max_active_runs`` slots while the epochs
    this replay waits for stay queued (:func:`~falkirk.policies.planning.replay_decisions.slots_to_free`);
    returns a diagnosis when the slots are held by runs this cannot free, else ``None``."""
    client, dag_id = running.client, running.plan.dag_id
    waiting = {running.runs[e] for _, e in todo}
    active = client.active_runs(dag_id)
    contended = any(r["state"] == "running" for r in active) and any(
        r["state"] == "queued" and r["dag_run_id"] in waiting for r in active)
    limit = client.max_active_runs(dag_id) if contended else None
    return _free_slots(running, active, waiting, limit, progress, so_that="the earlier epochs it re-runs can start",
                       held=f"held one of the DAG's max_active_runs={limit} slots while waiting (depends_on_past) "
                            f"for an earlier epoch this plan re-runs")


def _free_slots(running: RunningReplay, active: Sequence[Mapping[str, Any]], waiting: set[str], limit: int | None,
                progress: Progress, so_that: str, held: str) -> str | None:
    """Queue again the later runs holding the slots ``waiting`` needs
    (:func:`~falkirk.policies.planning.replay_decisions.slots_to_free`), each with a note ending
    ``so_that`` and a progress line ``held``; returns the diagnosis when they cannot be freed."""
    slots = slots_to_free(active, waiting, limit)
    for run_id in slots.requeue:
        _queue_again(running, run_id, f"queued again by Falkirk plan {running.plan.plan_id} so that {so_that} "
                                      f"(max_active_runs={limit})")
        progress(f"plan {running.plan.plan_id}: {run_id} {held}; queued it again")
    return slots.stuck


def _queue_again(running: RunningReplay, run_id: str, note: str) -> None:
    running.client.queue_run(running.plan.dag_id, run_id, note=note)
    running.queued_again.add(run_id)


def _hand_back_slots(running: RunningReplay, progress: Progress, timeout: float, poll: float) -> None:
    """Wait until every DAG run the replay queued again has started again.

    Airflow starts queued runs never looked at before the others, whatever their dates. A run
    the replay queued again (to free a ``max_active_runs`` slot, or to resume a failed run) has
    been looked at; an epoch triggered meanwhile has not, and takes the slot first: if its
    stateful task waits (``depends_on_past``) on the run queued again, neither ever moves. So
    until the runs queued again are running, the later runs that take their slots are queued
    again too (:func:`~falkirk.policies.planning.replay_decisions.slots_to_free`)."""
    client, dag_id = running.client, running.plan.dag_id
    deadline = time.monotonic() + timeout
    said = False
    while True:
        active = client.active_runs(dag_id)
        waiting = {str(r["dag_run_id"]) for r in active if r["state"] == "queued"} & running.queued_again
        if not waiting:
            return
        if client.is_paused(dag_id):  # nothing starts: the order is decided once it is unpaused
            progress(f"plan {running.plan.plan_id}: {dag_id} is paused; once unpaused, check that "
                     f"{', '.join(sorted(waiting))} start before later epochs")
            return
        if not said:
            progress(f"plan {running.plan.plan_id}: waiting for the runs it queued again to start: "
                     f"{', '.join(sorted(waiting))}")
            said = True
        limit = client.max_active_runs(dag_id)
        _free_slots(running, active, waiting, limit, progress, so_that="the earlier epochs it queued again start "
                    "first", held=f"took a max_active_runs={limit} slot before the earlier runs the plan queued again")
        if time.monotonic() > deadline:
            raise AirflowError(f"timed out after {timeout:.0f}s waiting for {', '.join(sorted(waiting))} (queued "
                               f"again by the replay) to start; resume with: falkirk replay {running.plan.plan_id}")
        running.renew()
        time.sleep(poll)


def _stall_seconds() -> float:
    """How long a replay waits, with no task instance changing state, on slots it cannot free."""
    return float(os.environ.get("FALKIRK_REPLAY_STALL_SECONDS", "600"))


def _run_ids(recovery: RecoveryPlan, entries: Iterable[LedgerEntry], client: AirflowClient) -> dict[int, str]:
    """The DAG run of each epoch the plan re-runs that has one: from the ledger, or, for a run
    that committed nothing, from Airflow by its date on the DAG's epoch clock (the logical date,
    or for a run started on asset events the partition's). See :func:`_check_missing_runs` for
    the epochs without."""
    runs = {e.epoch: e.run_id for e in entries}
    missing = sorted({e for _, e in recovery.rerun_set()} - set(runs))
    clock = _regimes(recovery.dag_id, client)[1] if missing else None
    if clock is not None:
        runs.update(_runs_at_dates(recovery.dag_id, client, clock, missing))
    return runs


def _check_missing_runs(recovery: RecoveryPlan, runs: Mapping[int, str], client: AirflowClient) -> None:
    """Refuse a plan with epochs that have no DAG run, changing nothing, unless the replay can get
    them one: a DAG scheduled on Assets whose run of an epoch Airflow never started (it was
    paused when the event arrived) gets it from the event emitted again (:func:`_start_missing_runs`)."""
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


def _runs_at_dates(dag_id: str, client: AirflowClient, clock: EpochClock, epochs: Sequence[int]) -> dict[int, str]:
    """The one run of each of ``epochs`` that Airflow has at its date (none where it has two)."""
    found = {epoch: client.dag_runs_at(dag_id, clock.logical_date(epoch)) for epoch in epochs}
    return {epoch: runs[0] for epoch, runs in found.items() if len(runs) == 1}


# How long a replay waits for the run Airflow starts on an event it emitted again.
REDELIVERED_RUN_SECONDS = 120.0


def _start_missing_runs(recovery: RecoveryPlan, runs: dict[int, str], client: AirflowClient, store: StoreConfig,
                        progress: Progress) -> None:
    """Start the runs of the plan's epochs of a DAG scheduled on Assets that Airflow never started,
    by emitting their partitions' events again, and add them to ``runs``; raises
    :class:`PlanError` when one does not start."""
    from falkirk.plugins.outlet_events import redeliver_events
    from falkirk.policies.asset_events import epoch_partition_key

    dag_id = recovery.dag_id
    missing = sorted({e for _, e in recovery.rerun_set()} - set(runs))
    if not missing:
        return
    clock = _regimes(dag_id, client)[1]
    ledger = Ledger(store)

    def current(record: Any) -> LedgerEntry | None:
        return ledger.find(record.dag_id, record.task_id, record.epoch, record.map_index)

    sent = set()
    for epoch in missing:
        if clock is None:
            break
        assets = redeliver_events(client, dag_id, epoch_partition_key(clock.logical_date(epoch)), current)
        if assets:
            sent.add(epoch)
            progress(f"plan {recovery.plan_id}: {dag_id} has no run of epoch {epoch} (it was paused when the event "
                     f"arrived, or the event was dropped); emitted again: {', '.join(assets)}")
    started: dict[int, str] = {}
    deadline = time.monotonic() + REDELIVERED_RUN_SECONDS
    while clock is not None and sent - set(started) and time.monotonic() < deadline:
        started.update(_runs_at_dates(dag_id, client, clock, sorted(sent - set(started))))
        if sent - set(started):
            time.sleep(1.0)
    for epoch, run in sorted(started.items()):
        progress(f"plan {recovery.plan_id}: Airflow started {run} for epoch {epoch} of {dag_id}")
    # Running before anything is cleared: a run cleared later waits behind it for a slot, so the
    # epochs run in order (a run started on asset events has no logical date for depends_on_past).
    _wait_until_started(client, dag_id, set(started.values()), deadline)
    runs.update(started)
    left = [e for e in missing if e not in started]
    if left:
        raise PlanError(f"epochs {left} of {dag_id} have no DAG run, and no event of their partitions could be "
                        f"emitted again (the producer has no current commit of them) or Airflow started none in "
                        f"{REDELIVERED_RUN_SECONDS:.0f}s; recover the producer's epochs first, or resume with: "
                        f"falkirk replay {recovery.plan_id}")


def _wait_until_started(client: AirflowClient, dag_id: str, runs: set[str], deadline: float) -> None:
    while runs and time.monotonic() < deadline:
        runs = {r for r in runs if client.dag_run(dag_id, r).get("state") == "queued"}
        if runs:
            time.sleep(1.0)


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
                         clock: EpochClock | None = None) -> list[FailedTask]:
    """The failed instances of ``tasks`` (every task for ``"*"``), and those of ``unrecorded``:
    successful in Airflow without a ledger row, which must run again as well. A run with no
    ledger row at all gets its epoch from its logical date and the DAG's epoch clock."""
    epoch_of = {e.run_id: e.epoch for e in entries}
    found = [f for f in unrecorded if "*" in tasks or f.task_id in tasks or ProcessorId.parse(f.task_id).task in tasks]
    failed = [ti for ti in client.failed_task_instances(dag_id) if not is_test_instance(ti)]
    # A run a recovery settled (a second run of a redone epoch, refused, then set to success
    # naming the plan that redid it) keeps its refused instance failed: that is no failure.
    settled = {run for run in {ti["dag_run_id"] for ti in failed}
               if client.dag_run(dag_id, run).get("state") == "success"}
    for ti in failed:
        if ti["dag_run_id"] in settled:
            continue
        name = ProcessorId(task=ti["task_id"], map_index=ti.get("map_index", -1))
        if "*" in tasks or ti["task_id"] in tasks or name in tasks:
            if ti["dag_run_id"] not in epoch_of and clock is not None and (date := _run_date(dag_id, client, ti)):
                try:
                    epoch_of[ti["dag_run_id"]] = clock.epoch_of(date)
                except EpochError as exc:
                    raise PlanError(f"failed task instance {ti['task_id']} of run {ti['dag_run_id']}: {exc}") from None
            if ti["dag_run_id"] not in epoch_of:
                raise PlanError(f"failed task instance {ti['task_id']} of run {ti['dag_run_id']}: no task of that "
                                f"run is in the ledger, so its epoch is unknown; use --failed-task TASK:EPOCH")
            if FailedTask(name, epoch_of[ti["dag_run_id"]]) not in found:
                found.append(FailedTask(name, epoch_of[ti["dag_run_id"]]))
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


def _regimes(dag_id: str, client: AirflowClient) -> tuple[dict[ProcessorId, Regime], EpochClock | None]:
    """The regimes of the DAG's tasks and its epoch clock, as the plugin reads them from the
    serialized DAG."""
    try:
        body = client.request("GET", api_path("dags", dag_id, "regimes", root=FALKIRK_API))
    except AirflowError as exc:  # planning without the regimes would leave out tasks with no ledger row
        raise PlanError(f"the Falkirk API of Airflow at {client.base_url} did not give the regimes of {dag_id!r} "
                        f"({exc}); is falkirk-airflow installed where Airflow's API server runs?") from None
    # Keyed by processor: every partition of a partitioned task is one (falkirk.policies.partitions).
    regimes = {p: Regime.parse(t["regime"]) for t in body["tasks"] if t.get("regime")
               for p in processors(t["task_id"], t.get("partitions"), Regime.parse(t["regime"]).replicas)}
    clocks = {t["epoch_clock"] for t in body["tasks"] if t.get("epoch_clock")}
    return regimes, EpochClock.parse(clocks.pop()) if len(clocks) == 1 else None


__all__ = ["AlreadyReplayed", "LeaseHeld", "ReplayReport", "RunningReplay", "compute_plan", "plan", "replay",
           "start_replay"]
