"""Keep the results of a DAG run whose re-run was refused: ``falkirk keep --dag D --run RUN_ID``.

Airflow's Clear of task instances whose epochs completed runs their jobs again, and each job
refuses (running it again would change nothing): the instances fail, their downstream instances
end ``upstream_failed``, the run fails. To keep the results as they are, each of those instances
is marked success, downstream ones first (after emitting any asset event of its commit that is
missing), then the run. Marking one instance success by hand is not enough: Airflow then
clears its failed downstream instances, which are refused in turn, and leaves the run failed
when nothing downstream failed.

A keep marks only instances whose epoch is committed in the ledger: an instance that never
committed must run (clear it in Airflow, or plan a recovery). Without ``--yes`` the command only
prints what it would mark.

Example::

    print(plan_keep("orders", store, client, "manual__epoch-6").describe())
    keep("orders", store, client, "manual__epoch-6")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from falkirk.plugins.airflow_rest import AirflowClient, AirflowError
from falkirk.plugins.outlet_events import emit_missing_events
from falkirk.policies.ids import check_dag_id
from falkirk.policies.planning.chains import TaskGraph
from falkirk.policies.planning.recovery import PlanError
from falkirk.policies.planning.replay_decisions import FAILED, marks_in_order
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot

ACTIVE = ("queued", "running")
DONE = ("success", "skipped")
NOTE = "kept as committed (falkirk keep): the epoch completed before this attempt, which its job refused"


@dataclass(frozen=True)
class Keep:
    """What a keep marks success: ``marks`` (processors of the run, downstream ones first, as a
    replay marks the refused instances of the epochs it keeps:
    :func:`~falkirk.policies.planning.replay_decisions.marks_in_order`), then the run ``run_id``
    of epoch ``epoch``; ``rows``: the ledger row of each mark."""

    dag_id: str
    run_id: str
    epoch: int
    marks: tuple[str, ...]
    rows: tuple[LedgerEntry, ...] = ()

    def describe(self) -> str:
        """The keep for people.

        >>> print(Keep("orders", "manual__epoch-6", 6, ("publish", "aggregate")).describe())
        keep DAG run manual__epoch-6 of orders (epoch 6) as committed: marks publish, aggregate success, then the run
        """
        marks = f"marks {', '.join(self.marks)} success, then the run" if self.marks else "marks the run success"
        return f"keep DAG run {self.run_id} of {self.dag_id} (epoch {self.epoch}) as committed: {marks}"


def plan_keep(dag_id: str, store: StoreConfig, client: AirflowClient, run_id: str) -> Keep:
    """What keeping DAG run ``run_id`` marks; changes nothing. Raises :class:`PlanError`, naming
    the fix, when the run is still active or one of its unfinished instances never committed."""
    from falkirk.plugins.dag_facts import regimes_and_clock
    from falkirk.plugins.discard import _epoch_of_run

    check_dag_id(dag_id)
    if not client.dag_exists(dag_id):
        raise PlanError(f"--dag: Airflow has no DAG {dag_id!r}")
    _, clock = regimes_and_clock(dag_id, client)
    try:
        run = client.dag_run(dag_id, run_id)
    except AirflowError:
        run = None
    epoch = _epoch_of_run(clock, run) if run is not None and clock is not None else None
    if run is None or epoch is None:
        raise PlanError(f"--run {run_id!r}: DAG {dag_id} has no run of an epoch with that id; the DAG's runs list "
                        f"in Airflow shows their ids")
    if run["state"] in ACTIVE:
        raise PlanError(f"--run {run_id}: the run is {run['state']}; wait for it to end, then keep it")
    states = {p: ti["state"] for p, ti in client.task_instances(dag_id, run_id).items()}
    unfinished = sorted(p for p, state in states.items() if state not in DONE)
    snapshot = LedgerSnapshot(Ledger(store), dag_id)
    committed = {e.processor: e for e in snapshot.entries() if e.epoch == epoch}
    missing = [p for p in unfinished if p not in committed]
    if missing:
        raise PlanError(f"--run {run_id}: {', '.join(missing)} of epoch {epoch} never committed, so there is no "
                        f"result to keep; it must run: clear it in Airflow, or plan a recovery (falkirk plan --dag "
                        f"{dag_id} --failed-task '*')")
    waiting = [p for p in unfinished if states[p] not in FAILED]
    if waiting:
        named = ", ".join(f"{p} ({states[p] or 'no state'})" for p in waiting)
        raise PlanError(f"--run {run_id}: {named} neither ran nor failed; clear the run's failed instances in "
                        f"Airflow, or mark the run failed first")
    if not unfinished and run["state"] == "success":
        raise PlanError(f"--run {run_id}: the run and its task instances are already success; nothing to keep")
    graph = TaskGraph.from_ledger(snapshot.entries())
    marks = marks_in_order({(p, epoch) for p in unfinished}, {epoch: states},
                           reach={t: len(graph.downstream(t)) for t in graph.tasks})
    return Keep(dag_id, run_id, epoch, tuple(p for p, _ in marks), tuple(committed[p] for p, _ in marks))


def keep(dag_id: str, store: StoreConfig, client: AirflowClient, run_id: str,
         progress: Callable[[str], None] = print) -> Keep:
    """Keep DAG run ``run_id`` (see the module docstring): mark its refused instances success,
    downstream ones first, then the run."""
    planned = plan_keep(dag_id, store, client, run_id)
    for processor, row in zip(planned.marks, planned.rows):
        # the events first, as a replay does: a keep run again after a crash between the two still emits them
        emitted = emit_missing_events(client, row)
        if emitted:
            progress(f"emitted the asset events of {processor} epoch {planned.epoch} that its refused attempt did "
                     f"not: {', '.join(emitted)}")
        client.set_state(dag_id, run_id, processor, "success", note=NOTE)
    client.set_run_state(dag_id, run_id, "success", NOTE)
    progress(f"kept DAG run {run_id} of {dag_id} (epoch {planned.epoch}): "
             f"{', '.join(planned.marks) or 'no task instance'} and the run marked success")
    return planned
