"""Keep the results of a DAG run whose re-run was refused: ``falkirk keep --dag D --run RUN_ID``.

Airflow's Clear of task instances whose epochs completed runs their jobs again, and each job
refuses (running it again would change nothing): the instances fail, their downstream instances
end ``upstream_failed``, the run fails. To keep the results as they are, each of those instances
is marked success, downstream ones first, then the run. Marking one instance success by hand is
not enough: Airflow then clears its failed downstream instances, which are refused in turn, and
leaves the run failed when nothing downstream failed.

A keep marks only instances whose epoch is committed in the ledger: an instance that never
committed must run (clear it in Airflow, or plan a recovery). Without ``--yes`` the command only
prints what it would mark.

Example::

    print(plan_keep("orders", store, client, "manual__epoch-6").describe())
    keep("orders", store, client, "manual__epoch-6")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from falkirk.plugins.airflow_rest import AirflowClient, AirflowError
from falkirk.policies.ids import check_dag_id
from falkirk.policies.partitions import split_processor
from falkirk.policies.planning.recovery import PlanError
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger, LedgerSnapshot

ACTIVE = ("queued", "running")
DONE = ("success", "skipped")
NOTE = "kept as committed (falkirk keep): the epoch completed before this attempt, which its job refused"


@dataclass(frozen=True)
class Keep:
    """What a keep marks success: ``marks`` (processors of the run, downstream ones first), then
    the run ``run_id`` of epoch ``epoch``."""

    dag_id: str
    run_id: str
    epoch: int
    marks: tuple[str, ...]

    def describe(self) -> str:
        """The keep for people.

        >>> print(Keep("orders", "manual__epoch-6", 6, ("publish", "aggregate")).describe())
        keep DAG run manual__epoch-6 of orders (epoch 6) as committed: marks publish, aggregate success, then the run
        """
        marks = f"marks {', '.join(self.marks)} success, then the run" if self.marks else "marks the run success"
        return f"keep DAG run {self.run_id} of {self.dag_id} (epoch {self.epoch}) as committed: {marks}"


def downstream_first(marks: Sequence[str], edges: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """``marks`` (processors) ordered so that each comes before every processor upstream of it:
    marking an instance success makes Airflow clear its failed downstream instances, so those are
    marked first.

    >>> downstream_first(["ingest", "publish", "aggregate[1]", "aggregate[0]"],
    ...                  {"ingest": ["aggregate"], "aggregate": ["publish"], "publish": []})
    ('publish', 'aggregate[0]', 'aggregate[1]', 'ingest')
    """
    depth: dict[str, int] = {}

    def below(task: str, seen: frozenset[str] = frozenset()) -> int:
        if task not in depth:
            depth[task] = 1 + max((below(d, seen | {task}) for d in edges.get(task, ()) if d not in seen), default=-1)
        return depth[task]

    return tuple(sorted(marks, key=lambda p: (below(split_processor(p)[0]), p)))


def plan_keep(dag_id: str, store: StoreConfig, client: AirflowClient, run_id: str) -> Keep:
    """What keeping DAG run ``run_id`` marks; changes nothing. Raises :class:`PlanError`, naming
    the fix, when the run is still active or one of its unfinished instances never committed."""
    from falkirk.plugins.discard import _epoch_of_run
    from falkirk.plugins.recovery import _regimes

    check_dag_id(dag_id)
    if not client.dag_exists(dag_id):
        raise PlanError(f"--dag: Airflow has no DAG {dag_id!r}")
    _, clock = _regimes(dag_id, client)
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
    unfinished = sorted(p for p, ti in client.task_instances(dag_id, run_id).items() if ti["state"] not in DONE)
    committed = {e.processor for e in LedgerSnapshot(Ledger(store), dag_id).entries() if e.epoch == epoch}
    missing = [p for p in unfinished if p not in committed]
    if missing:
        raise PlanError(f"--run {run_id}: {', '.join(missing)} of epoch {epoch} never committed, so there is no "
                        f"result to keep; it must run: clear it in Airflow, or plan a recovery (falkirk plan --dag "
                        f"{dag_id} --failed-task '*')")
    if not unfinished and run["state"] == "success":
        raise PlanError(f"--run {run_id}: the run and its task instances are already success; nothing to keep")
    return Keep(dag_id, run_id, epoch, downstream_first(unfinished, client.downstream(dag_id)))


def keep(dag_id: str, store: StoreConfig, client: AirflowClient, run_id: str,
         progress: Callable[[str], None] = print) -> Keep:
    """Keep DAG run ``run_id`` (see the module docstring): mark its refused instances success,
    downstream ones first, then the run."""
    planned = plan_keep(dag_id, store, client, run_id)
    for processor in planned.marks:
        client.set_state(dag_id, run_id, processor, "success", note=NOTE)
    client.set_run_state(dag_id, run_id, "success", NOTE)
    progress(f"kept DAG run {run_id} of {dag_id} (epoch {planned.epoch}): "
             f"{', '.join(planned.marks) or 'no task instance'} and the run marked success")
    return planned
