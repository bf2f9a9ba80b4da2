"""Recovery through Airflow: plan from the ledger and Airflow's failed task instances, then replay.

:func:`plan` gathers the facts (the ledger's rows, what the store can still read, the
failed task instances Airflow reports, the regimes of the DAG's tasks) and asks
:func:`policies.recovery.plan_recovery` for a :class:`~policies.recovery.RecoveryPlan`,
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
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from plugins.airflow_rest import AirflowClient, AirflowError
from policies.checkpoint_chains import StoreReadability, TaskGraph
from policies.ledger import Ledger, LedgerEntry
from policies.recovery import BadEpoch, FailedTask, Failure, LostScratch, PlanError, RecoveryPlan, plan_recovery
from policies.recovery_log import AlreadyReplayed, Lease, LeaseHeld, RecoveryLog
from policies.regimes import Regime
from policies.store import StoreConfig

Progress = Callable[[str], None]


def plan(
    dag_id: str,
    store: StoreConfig,
    client: AirflowClient | None = None,
    *,
    failed_tasks: Sequence[str] = (),
    failed_instances: Sequence[tuple[str, int]] = (),
    lost_scratch: Sequence[str] = (),
    bad_epochs: Sequence[tuple[str, int]] = (),
    last_epoch: int | None = None,
    record: bool = True,
) -> RecoveryPlan:
    """The recovery plan for the failures named (see the module docstring).

    ``failed_tasks`` names tasks whose failed instances are read from Airflow (every
    failed instance of the DAG when it holds ``"*"``); ``failed_instances`` names
    (task, epoch) pairs directly.
    """
    if client is not None and not client.dag_exists(dag_id):
        raise PlanError(f"--dag: Airflow has no DAG {dag_id!r}")
    failures: list[Failure] = [FailedTask(t, e) for t, e in failed_instances]
    if failed_tasks:
        if client is None:
            raise PlanError("--failed-task without an epoch reads failed task instances from Airflow: "
                            "give --airflow-url and credentials, or write TASK:EPOCH")
        every = Ledger(store).entries(dag_id, include_invalidated=True)
        failures += _failed_from_airflow(dag_id, client, failed_tasks, every)
    failures += [LostScratch(loc) for loc in lost_scratch]
    failures += [BadEpoch(t, e) for t, e in bad_epochs]
    regimes = _regimes(dag_id, client) if client is not None else {}
    return compute_plan(dag_id, store, failures, regimes, last_epoch=last_epoch, record=record)


def compute_plan(
    dag_id: str,
    store: StoreConfig,
    failures: Sequence[Failure],
    regimes: Mapping[str, Regime],
    *,
    last_epoch: int | None = None,
    record: bool = True,
) -> RecoveryPlan:
    """The plan for ``failures`` from the ledger, given the regimes of the DAG's tasks (which
    adds the tasks that have no ledger row yet); records it in the recovery log if ``record``."""
    ledger = Ledger(store)
    version = ledger.version()
    entries, rolled_back = ledger.entries_and_invalidated(dag_id)
    if not entries:
        raise PlanError(f"--dag: the ledger at {ledger.uri} has no rows for DAG {dag_id!r}; "
                        f"has it run with Falkirk's operator?")
    graph = TaskGraph.from_ledger(entries)
    if regimes:
        graph = TaskGraph(tuple(sorted(set(graph.tasks) | set(regimes))), graph.edges)
    last = last_epoch if last_epoch is not None else max(e.epoch for e in [*entries, *rolled_back])
    result = plan_recovery(dag_id, graph, entries, failures, last, StoreReadability(store),
                           regimes=regimes, ledger_version=version)
    if record:
        RecoveryLog(store).record(result)
    return result


@dataclass(frozen=True)
class ReplayReport:
    """What a replay did: the task instances it cleared, per DAG run, and how long it took."""

    plan_id: str
    cleared: dict[str, tuple[str, ...]]
    invalidated: int
    seconds: float
    already_done: bool = False


def replay(
    plan_id: str,
    store: StoreConfig,
    client: AirflowClient,
    holder: str | None = None,
    progress: Progress = print,
    timeout: float = 3600,
    poll: float = 2.0,
) -> ReplayReport:
    """Execute the recorded plan ``plan_id`` (see the module docstring) and wait for it."""
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

    def wait(self, progress: Progress = print, timeout: float = 3600, poll: float = 2.0) -> ReplayReport:
        """Wait until every cleared task instance succeeded, then give the lease back."""
        rerun = self.plan.rerun_set()
        try:
            _wait(self.client, self.plan, self.runs, progress, timeout, poll, self.started)
        except BaseException as exc:
            self.fail(exc)
            raise
        self.log.end(self.lease, "finished", f"{len(rerun)} task instances re-ran")
        seconds = time.monotonic() - self.started
        progress(f"plan {self.plan.plan_id}: done, {len(rerun)} task instances re-ran in {seconds:.0f}s")
        return ReplayReport(self.plan.plan_id, self.cleared, self.invalidated, seconds)

    def fail(self, exc: BaseException) -> None:
        self.log.end(self.lease, "failed", f"{type(exc).__name__}: {exc}"[:2000])


def start_replay(
    plan_id: str,
    store: StoreConfig,
    client: AirflowClient,
    holder: str | None = None,
    progress: Progress = print,
) -> RunningReplay:
    """Steps 1-4 of the module docstring: check, take the lease, invalidate, clear.

    Raises :class:`AlreadyReplayed` for a plan that finished, :class:`LeaseHeld` while
    another recovery of the DAG runs, :class:`PlanError` when the ledger changed since the
    plan was computed; in each case nothing was changed.
    """
    started = time.monotonic()
    holder = holder or getpass.getuser()
    log, ledger = RecoveryLog(store), Ledger(store)
    recovery = log.plan(plan_id)
    log.check_not_finished(recovery)
    now = ledger.version()
    if now != recovery.ledger_version:
        raise PlanError(f"plan {plan_id}: the ledger changed since the plan was computed (version "
                        f"{recovery.ledger_version} then, {now} now); compute a new plan with `falkirk plan`")
    runs = _run_ids(recovery, ledger.entries(recovery.dag_id, include_invalidated=True))
    lease = log.begin(recovery, holder)
    running = RunningReplay(recovery, log, lease, client, runs, {}, 0, started)
    try:
        rerun = recovery.rerun_set()
        doomed = [e for e in ledger.entries(recovery.dag_id) if (e.task_id, e.epoch) in rerun]
        running.invalidated = ledger.invalidate(doomed, plan_id)
        progress(f"plan {plan_id}: invalidated {running.invalidated} ledger rows past the frontiers")
        for epoch in sorted({e for _, e in rerun}):
            tasks = tuple(sorted(t for t, e in rerun if e == epoch))
            client.clear(recovery.dag_id, runs[epoch], list(tasks))
            running.cleared[runs[epoch]] = tasks
            progress(f"plan {plan_id}: cleared epoch {epoch} ({runs[epoch]}): {', '.join(tasks)}")
    except BaseException as exc:
        running.fail(exc)
        raise
    return running


def _wait(client: AirflowClient, recovery: RecoveryPlan, runs: dict[int, str], progress: Progress,
          timeout: float, poll: float, started: float) -> None:
    todo = set(recovery.rerun_set())
    seen: dict[tuple[str, int], str | None] = {}
    deadline = time.monotonic() + timeout
    while True:
        client.on_poll()
        done = 0
        for epoch in sorted({e for _, e in todo}):
            tis = client.task_instances(recovery.dag_id, runs[epoch])
            for task in sorted(t for t, e in todo if e == epoch):
                state = tis.get(task, {}).get("state")
                if seen.get((task, epoch), "-") != state:
                    seen[task, epoch] = state
                    progress(f"  {time.monotonic() - started:6.1f}s  epoch {epoch}  {task:<12} {state or 'waiting'}")
                if state in ("failed", "upstream_failed"):
                    raise AirflowError(f"{task} of epoch {epoch} ({runs[epoch]}) ended {state}; see its log in "
                                       f"Airflow, fix the cause, then plan again")
                done += state == "success"
        if done == len(todo):
            return
        if time.monotonic() > deadline:
            raise AirflowError(f"timed out after {timeout:.0f}s with {done}/{len(todo)} task instances done")
        time.sleep(poll)


def _run_ids(recovery: RecoveryPlan, entries: Iterable[LedgerEntry]) -> dict[int, str]:
    runs = {e.epoch: e.run_id for e in entries}
    missing = sorted({e for _, e in recovery.rerun_set()} - set(runs))
    if missing:
        raise PlanError(f"epochs {missing} have no ledger row from any task, so their DAG runs are unknown; "
                        f"plan with --last-epoch {min(missing) - 1}")
    return runs


def _failed_from_airflow(dag_id: str, client: AirflowClient, tasks: Sequence[str],
                         entries: Sequence[LedgerEntry]) -> list[FailedTask]:
    epoch_of = {e.run_id: e.epoch for e in entries}
    found = []
    for ti in client.failed_task_instances(dag_id):
        if "*" in tasks or ti["task_id"] in tasks:
            if ti["dag_run_id"] not in epoch_of:
                raise PlanError(f"failed task instance {ti['task_id']} of run {ti['dag_run_id']}: no task of that "
                                f"run is in the ledger, so its epoch is unknown; use --failed-task TASK:EPOCH")
            found.append(FailedTask(ti["task_id"], epoch_of[ti["dag_run_id"]]))
    named = {f.task_id for f in found}
    for task in tasks:
        if task != "*" and task not in named:
            raise PlanError(f"--failed-task {task}: Airflow reports no failed instance of {task!r} in {dag_id!r}; "
                            f"name an epoch (--failed-task {task}:EPOCH) or use --bad-epoch")
    if not found:
        raise PlanError(f"--failed-task: Airflow reports no failed task instance in {dag_id!r}")
    return sorted(found, key=lambda f: (f.epoch, f.task_id))


def _regimes(dag_id: str, client: AirflowClient) -> dict[str, Regime]:
    """The regimes of the DAG's tasks, as the plugin reads them from the serialized DAG."""
    try:
        body = client.request("GET", f"/falkirk/api/v1/dags/{dag_id}/regimes")
    except AirflowError:
        return {}
    return {t["task_id"]: Regime.parse(t["regime"]) for t in body["tasks"] if t.get("regime")}


__all__ = ["AlreadyReplayed", "LeaseHeld", "ReplayReport", "RunningReplay", "compute_plan", "plan", "replay",
           "start_replay"]
