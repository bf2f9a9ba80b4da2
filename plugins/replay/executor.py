"""A replay of a recorded plan: check, take the lease, check again, invalidate, then the loop.

:func:`start_replay` refuses, changing nothing, a plan that finished, whose DAG another recovery
holds, that the store can no longer carry out, or whose instances Airflow does not let the caller
clear; then it takes the lease, rolls back the ledger rows of every instance to re-run (one append
per plan), starts the runs Airflow never started, and runs the loop's first pass (the clears).
:meth:`RunningReplay.wait` runs the loop to the end and gives the lease back.
"""

from __future__ import annotations

import getpass
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from falkirk.plugins.airflow_rest import AirflowClient
from falkirk.plugins.dag_facts import regimes_and_clock, runs_at_dates
from falkirk.plugins.replay.apply import Applier
from falkirk.plugins.replay.checks import (
    check_may_clear,
    check_missing_runs,
    check_no_rows_without_runs,
    check_still_current,
    run_ids,
)
from falkirk.plugins.replay.loop import POLL_SECONDS, reconcile
from falkirk.plugins.replay.observe import Observer
from falkirk.policies.faults import crash_point
from falkirk.policies.planning.recovery import DiscardedEpochs, PlanError, RecoveryPlan
from falkirk.policies.planning.recovery_log import (
    AlreadyReplayed,
    Lease,
    RecoveryLog,
    check_lease_free,
    check_not_finished,
    invalidations_made,
    open_lease,
)
from falkirk.policies.replay import Memory
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import StoreUnreachable, unanswered
from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot, entries_of

_log = logging.getLogger(__name__)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ReplayReport:
    """What a replay did: the task instances it cleared, per DAG run, and how long it took."""

    plan_id: str
    cleared: dict[str, tuple[str, ...]]
    invalidated: int
    seconds: float
    already_done: bool = False
    resumed: bool = False
    ledger_reads: int | None = None  # whole reads of the ledger table before the first clear (None: no clear)


def replay(plan_id: str, store: StoreConfig, client: AirflowClient, holder: str | None = None,
           progress: Progress = print, timeout: float = 3600, poll: float = POLL_SECONDS) -> ReplayReport:
    """Execute the recorded plan ``plan_id`` and wait for it. Run again after an executor died
    half-way, it resumes: what is invalidated stays so, and only the instances that did not
    already re-run (or are not already waiting to) are cleared."""
    try:
        running = start_replay(plan_id, store, client, holder, progress)
    except AlreadyReplayed:
        progress(f"plan {plan_id} was already executed; nothing to do")
        return ReplayReport(plan_id, {}, 0, 0.0, already_done=True)
    return running.wait(progress, timeout, poll)


@dataclass
class RunningReplay:
    """A replay whose lease is held and whose first pass is done; :meth:`wait` finishes it."""

    plan: RecoveryPlan
    log: RecoveryLog
    observer: Observer
    applier: Applier
    memory: Memory
    invalidated: int
    started: float

    @property
    def cleared(self) -> dict[str, tuple[str, ...]]:
        return dict(self.memory.cleared)

    def run(self, progress: Progress, timeout: float = 3600, poll: float = POLL_SECONDS,
            until: Callable[[Memory], bool] | None = None) -> None:
        """Passes of the loop until the replay is done (or ``until``); a failure is recorded."""
        self.applier.progress = progress
        try:
            self.memory = reconcile(self.plan, self.observer, self.applier, self.memory, progress, timeout=timeout,
                                    poll=poll, until=until)
        except BaseException as exc:
            self.fail(exc)
            raise

    def wait(self, progress: Progress = print, timeout: float = 3600, poll: float = POLL_SECONDS) -> ReplayReport:
        """Run the loop to its end, then give the lease back."""
        self.run(progress, timeout, poll)
        rerun = self.plan.rerun_set()
        self.log.end(self.applier.lease, "finished", f"{len(rerun)} task instances re-ran")
        seconds = time.monotonic() - self.started
        progress(f"plan {self.plan.plan_id}: done, {len(rerun)} task instances re-ran in {seconds:.0f}s")
        return ReplayReport(self.plan.plan_id, self.cleared, self.invalidated, seconds,
                            resumed=self.applier.lease.resumed, ledger_reads=self.applier.reads_before_clear)

    def fail(self, exc: BaseException) -> None:
        """Record the failure and give the lease back; if the store cannot take that row (it is
        what failed), the lease simply expires and the plan resumes from where it stopped."""
        lease = self.applier.lease
        try:
            self.log.end(lease, "failed", f"{type(exc).__name__}: {exc}"[:2000])
        except Exception as unrecorded:  # noqa: BLE001 (the original failure is what the caller sees)
            if not (unanswered(unrecorded) or isinstance(unrecorded, StoreUnreachable)):
                raise
            _log.warning("plan %s: could not record the failure (%s); the lease expires at %s", self.plan.plan_id,
                         type(unrecorded).__name__, lease.expires_at())


@dataclass(frozen=True)
class Checked:
    """A plan that passed :func:`check_replay`, with what the checks read: whether it resumes, the
    DAG's ledger snapshot, the DAG run of each epoch it re-runs, and what the checks found
    unchanged since the plan (``log_rows``, the DAG's rows in the recovery log, ``None`` when a
    lease was open; ``dag_version``, the ledger's as checked)."""

    plan: RecoveryPlan
    resuming: bool
    snapshot: LedgerSnapshot
    runs: dict[int, str]
    log_rows: int | None
    dag_version: int

    def unchanged_under(self, lease: Lease) -> bool:
        """Whether nothing the lease excludes happened between these checks and ``lease``: no
        commit to the DAG's ledger (the snapshot, brought forward, is at the checked version), and
        no recovery, collection or plan of the DAG recorded in its log (no lease was open when
        checked, expired or not)."""
        return (self.log_rows is not None and lease.log_rows == self.log_rows
                and self.snapshot.dag_version == self.dag_version)


def check_replay(plan_id: str, store: StoreConfig, client: AirflowClient) -> Checked:
    """Everything a replay checks before it writes, changing nothing: the plan is not a discard,
    not finished, its DAG's lease is free, the store still carries it out, every epoch it re-runs
    has a DAG run (or can get one), and Airflow lets ``client``'s user clear its task instances
    (a dry run). Raises as :func:`start_replay` does."""
    log = RecoveryLog(store)
    recovery = log.plan(plan_id)
    if any(isinstance(f, DiscardedEpochs) for f in recovery.failures):
        raise PlanError(f"plan {plan_id} records a discard (`falkirk discard`), which re-runs nothing; there is "
                        f"nothing to replay")
    events = log.events(recovery.dag_id)
    check_not_finished(events, plan_id)
    check_lease_free(events, recovery.dag_id)
    resuming = any(r["plan_id"] == plan_id and r["event"] in ("started", "resumed") for r in events)
    snapshot = LedgerSnapshot(Ledger(store), recovery.dag_id)  # the one read of the DAG's rows; brought forward since
    check_still_current(recovery, store, snapshot, resuming)
    current, rolled = entries_of(snapshot.rows, snapshot.gone)
    check_no_rows_without_runs(recovery, current, client)
    runs = run_ids(recovery, [*current, *rolled], client)
    check_missing_runs(recovery, runs, client)
    check_may_clear(recovery, runs, client)
    log_rows = len(events) if open_lease(events, recovery.dag_id) is None else None
    return Checked(recovery, resuming, snapshot, runs, log_rows, snapshot.dag_version)


def start_replay(plan_id: str, store: StoreConfig, client: AirflowClient, holder: str | None = None,
                 progress: Progress = print) -> RunningReplay:
    """Check, take the lease, check again, invalidate, and run the first pass (see the module
    docstring). Raises :class:`AlreadyReplayed` for a plan that finished, ``LeaseHeld`` while
    another recovery (or a garbage collection) of the DAG runs, :class:`PlanError` when the
    ledger or the store changed since the plan was computed, and ``AirflowError`` when Airflow
    refuses to clear the task instances (checked with a dry run first); in each case no ledger
    row is invalidated and no task instance cleared."""
    started, reads_from = time.monotonic(), Ledger.reads
    # Airflow checks the caller's rights (changing nothing) before the lease is taken: a caller it
    # refuses leaves no "started" record behind, which would let the next replay resume the plan
    # without checking that it is still current.
    checked = check_replay(plan_id, store, client)
    recovery, snapshot, runs = checked.plan, checked.snapshot, checked.runs
    log = RecoveryLog(store)
    lease = log.begin(recovery, holder or getpass.getuser())
    applier = Applier(recovery, store, client, log, lease, progress, reads_from)
    running = RunningReplay(recovery, log, Observer(recovery, store, client, snapshot), applier,
                            Memory(), 0, started)
    try:
        if lease.resumed:
            progress(f"plan {plan_id}: resuming (the lease was {'taken over' if not checked.resuming else 'taken again'})")
        crash_point("replay", 0, "after-lease", dag_id=recovery.dag_id)
        snapshot.refresh()
        # Again under the lease, which nothing changes now; the plan is computed again only if
        # the ledger or the log changed since the checks (a collection deletes under its lease).
        check_still_current(recovery, store, snapshot, checked.resuming, replan=not checked.unchanged_under(lease))
        rerun = recovery.rerun_set()
        # Once per plan: a resumed replay must not roll back what the plan's re-runs committed since
        # (with nothing to roll back, the plan's invalidations leave no rollback row to find).
        if not invalidations_made(log.events(recovery.dag_id), plan_id):
            doomed = [e for e in snapshot.entries() if (e.processor, e.epoch) in rerun]
            running.invalidated = snapshot.ledger.invalidations.record(doomed, plan_id)  # one append per plan
            applier.lease = log.rolled_back(applier.lease, running.invalidated)
        progress(f"plan {plan_id}: invalidated {running.invalidated} ledger rows past the frontiers")
        crash_point("replay", 0, "after-invalidations", dag_id=recovery.dag_id)
        # Only now the epochs with no run get theirs (their runs commit as soon as they start,
        # which the checks and the invalidations above must not see).
        start_missing_runs(recovery, runs, client, snapshot, progress)
        running.memory = Memory.fresh(rerun, runs, started, recovery.last_epoch)
    except BaseException as exc:
        running.fail(exc)
        raise
    _log.debug("plan %s: checked, leased and invalidated in %.3fs", plan_id, time.monotonic() - started)
    running.run(progress, until=lambda m: m.stage != "start")
    return running


# How long a replay waits for the run Airflow starts on an event it emitted again.
REDELIVERED_RUN_SECONDS = 120.0


def start_missing_runs(recovery: RecoveryPlan, runs: dict[int, str], client: AirflowClient,
                       snapshot: LedgerSnapshot, progress: Progress) -> None:
    """Start the runs of the plan's epochs of a DAG scheduled on Assets that Airflow never started,
    by emitting their partitions' events again, and add them to ``runs``; raises
    :class:`PlanError` when one does not start."""
    from falkirk.plugins.outlet_events import redeliver_events
    from falkirk.policies.asset_events import epoch_partition_key

    dag_id = recovery.dag_id
    missing = sorted({e for _, e in recovery.rerun_set()} - set(runs))
    if not missing:
        return
    clock = regimes_and_clock(dag_id, client)[1]
    if clock is None:
        _no_runs(recovery, missing)
    ledger = snapshot.ledger

    def current(record: Any) -> LedgerEntry | None:
        return ledger.find(record.dag_id, record.task_id, record.epoch, record.map_index)

    sent = set()
    for epoch in missing:
        assets = redeliver_events(client, dag_id, epoch_partition_key(clock.logical_date(epoch)), current)
        if assets:
            sent.add(epoch)
            progress(f"plan {recovery.plan_id}: {dag_id} has no run of epoch {epoch} (it was paused when the event "
                     f"arrived, or the event was dropped); emitted again: {', '.join(assets)}")
    started: dict[int, str] = {}
    deadline = time.monotonic() + REDELIVERED_RUN_SECONDS
    while sent - set(started) and time.monotonic() < deadline:
        started.update(runs_at_dates(dag_id, client, clock, sorted(sent - set(started))))
        if sent - set(started):
            time.sleep(1.0)
    for epoch, run in sorted(started.items()):
        progress(f"plan {recovery.plan_id}: Airflow started {run} for epoch {epoch} of {dag_id}")
    # Running before anything is cleared: a run cleared later waits behind it for a slot, so the
    # epochs run in order (a run started on asset events has no logical date for depends_on_past).
    waiting = set(started.values())
    while waiting and time.monotonic() < deadline:
        waiting = {r for r in waiting if client.dag_run(dag_id, r).get("state") == "queued"}
        if waiting:
            time.sleep(1.0)
    runs.update(started)
    left = [e for e in missing if e not in started]
    if left:
        _no_runs(recovery, left)


def _no_runs(recovery: RecoveryPlan, left: list[int]) -> NoReturn:
    raise PlanError(f"epochs {left} of {recovery.dag_id} have no DAG run, and no event of their partitions could be "
                    f"emitted again (the producer has no current commit of them) or Airflow started none in "
                    f"{REDELIVERED_RUN_SECONDS:.0f}s; recover the producer's epochs first, or resume with: "
                    f"falkirk replay {recovery.plan_id}")
