"""Recovery across DAGs joined by Airflow Assets: one plan per DAG, in dependency order.

A consumer DAG scheduled on an Asset that a producer DAG's task updates runs on the asset
events that arrived since its previous run: its run k consumed a set S(k) of the producer's
epochs (Airflow records each run's consumed events). Between the two DAGs this is an edge of
the rollback graph whose projection depends on that history
(:class:`~falkirk.policies.rollback.projections.Consumed`). Asset edges only run forward
(a producer never reads its consumers), so the joint greatest frontier is found DAG by DAG:

1. plan each DAG with the failures named in it and the ones its producers hand down;
2. every consumer run that consumed an epoch its producer re-runs read an input that changes:
   it is a bad epoch of the consuming task (:class:`~falkirk.policies.planning.recovery.BadEpoch`),
   and the consumer DAG's own planner does the rest (its state, its downstream, its regimes).

For a stateful consuming task whose checkpoints read every run before them (every Falkirk
regime's do) this gives the frontiers of the joint solver; ``tests/unit/test_cross_dag_plans.py``
checks it against a brute-force oracle.

>>> from falkirk.policies.planning.recovery import FailedTask
>>> edge = AssetEdge("orders", "totals", "reports", "report", {1: (1, 2), 2: (3, 4), 3: (5, 6)})
>>> edge.stale_runs({"totals": (3, 4, 5, 6)})
(2, 3)
>>> sorted(edge.handed_down({"totals": (5, 6)}), key=lambda b: b.epoch)
[BadEpoch(task_id='report', epoch=3)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.recovery import BadEpoch, Failure, PlanError, RecoveryPlan
from falkirk.policies.store.ledger import AssetInput, LedgerEntry


@dataclass(frozen=True)
class AssetEdge:
    """``consumer_dag``'s task ``consumer_task`` reads the output of ``producer_dag``'s task
    ``producer_task`` through an Asset; ``consumed[k]``: the producer epochs the consumer's
    run (epoch) ``k`` consumed."""

    producer_dag: str
    producer_task: str
    consumer_dag: str
    consumer_task: str
    consumed: Mapping[int, Sequence[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.producer_dag == self.consumer_dag:
            raise PlanError(f"asset edge {self.producer_dag}.{self.producer_task} -> {self.consumer_task}: both ends "
                            f"are in one DAG; an edge inside a DAG is a data edge of its TaskGraph")
        object.__setattr__(self, "consumed", {int(k): tuple(sorted(int(e) for e in v))
                                              for k, v in dict(self.consumed).items()})

    def stale_runs(self, reruns: Mapping[ProcessorId, Sequence[int]]) -> tuple[int, ...]:
        """The consumer runs that consumed an epoch the producer re-runs; ``reruns``: the
        producer DAG's re-run epochs per processor (a partition ``task[i]`` counts for its task)."""
        redone = {e for p, epochs in reruns.items() if ProcessorId.parse(p).task == self.producer_task for e in epochs}
        return tuple(sorted(k for k, epochs in self.consumed.items() if redone.intersection(epochs)))

    def handed_down(self, reruns: Mapping[ProcessorId, Sequence[int]]) -> list[BadEpoch]:
        """The consumer's bad epochs: one per stale run (for a stateful task the first decides;
        a stateless one redoes exactly these)."""
        return [BadEpoch(self.consumer_task, k) for k in self.stale_runs(reruns)]


# One DAG's planner: its failures in, its plan out (plan_recovery over its own ledger rows).
PlanDag = Callable[[str, Sequence[Failure]], RecoveryPlan]


@dataclass(frozen=True)
class CrossDagPlan:
    """Per DAG touched, its plan, in the order a replay runs them (producers first)."""

    plans: tuple[RecoveryPlan, ...]
    edges: tuple[AssetEdge, ...]

    def plan(self, dag_id: str) -> RecoveryPlan:
        for p in self.plans:
            if p.dag_id == dag_id:
                return p
        raise KeyError(dag_id)

    def dags(self) -> tuple[str, ...]:
        return tuple(p.dag_id for p in self.plans)

    def rerun_set(self) -> frozenset[tuple[str, str, int]]:
        """Every (DAG, task, epoch) the recovery re-runs."""
        return frozenset((p.dag_id, t, e) for p in self.plans for t, e in p.rerun_set())

    def table(self) -> str:
        """Each DAG's plan table, producers first."""
        return "\n\n".join(p.table() for p in self.plans)


def dag_order(dags: Sequence[str], edges: Sequence[AssetEdge]) -> tuple[str, ...]:
    """``dags`` with every producer before its consumers (ties keep the given order).

    >>> dag_order(["reports", "orders"], [AssetEdge("orders", "t", "reports", "r")])
    ('orders', 'reports')
    """
    known = set(dags)
    for e in edges:
        for dag in (e.producer_dag, e.consumer_dag):
            if dag not in known:
                raise PlanError(f"asset edge {e.producer_dag} -> {e.consumer_dag}: DAG {dag!r} is not among "
                                f"the DAGs planned ({', '.join(dags)}); add it")
    order: list[str] = []
    left = list(dags)
    while left:
        ready = [d for d in left if not any(e.consumer_dag == d and e.producer_dag in left for e in edges)]
        if not ready:
            raise PlanError(f"asset edges form a cycle among {', '.join(left)}; a DAG cannot consume, even "
                            f"through other DAGs, an Asset it produces")
        order.append(ready[0])
        left.remove(ready[0])
    return tuple(order)


def plan_across_dags(dags: Mapping[str, PlanDag], edges: Sequence[AssetEdge],
                     failures: Mapping[str, Sequence[Failure]]) -> CrossDagPlan:
    """One plan per DAG the failures reach, through asset edges (see the module docstring).

    ``dags``: each DAG's planner; ``failures``: the failures named in each DAG. A DAG that
    neither has a failure nor is handed one has no plan (nothing of it re-runs).
    """
    for dag in failures:
        if dag not in dags:
            raise PlanError(f"failures: DAG {dag!r} has no planner; plan one of {', '.join(sorted(dags))}")
    if not any(failures.values()):
        raise PlanError("failures: name at least one, in one of the DAGs")
    handed: dict[str, list[Failure]] = {d: list(failures.get(d, ())) for d in dags}
    plans: list[RecoveryPlan] = []
    for dag in dag_order(list(dags), edges):
        if not handed[dag]:
            continue
        plan = dags[dag](dag, tuple(dict.fromkeys(handed[dag])))
        plans.append(plan)
        reruns = {t.task_id: t.rerun for t in plan.tasks}
        for e in edges:
            if e.producer_dag == dag:
                handed[e.consumer_dag].extend(e.handed_down(reruns))
    return CrossDagPlan(tuple(plans), tuple(edges))


def asset_edges(rows: Iterable[LedgerEntry]) -> list[AssetEdge]:
    """The asset edges that consumers' ledger rows record: one per (producer task, consuming
    task), with ``consumed[k]`` the producer epochs the consumer's epoch ``k`` read (over all
    partitions of either task).

    >>> from falkirk.policies.store.ledger import AssetInput
    >>> def row(k, *epochs):
    ...     return LedgerEntry(dag_id="reports", task_id="report", epoch=k, regime="eager_checkpoint", run_id=f"r{k}", try_number=1, asset_inputs=tuple(
    ...         AssetInput(asset="orders.ranking", dag_id="orders", task_id="publish", output="output", epoch=e) for e in epochs))
    >>> [(e.producer_dag, e.producer_task, e.consumer_task, e.consumed) for e in asset_edges([row(1, 1, 2), row(2, 3)])]
    [('orders', 'publish', 'report', {1: (1, 2), 2: (3,)})]
    """
    consumed: dict[tuple[str, str, str, str], dict[int, set[int]]] = {}
    for row in rows:
        for read in row.asset_inputs:
            edge = consumed.setdefault((read.dag_id, read.task_id, row.dag_id, row.task_id), {})
            edge.setdefault(row.epoch, set()).add(read.epoch)
    return [AssetEdge(p_dag, p_task, c_dag, c_task, {k: tuple(sorted(v)) for k, v in runs.items()})
            for (p_dag, p_task, c_dag, c_task), runs in sorted(consumed.items())]


def stale_reads(consumers: Iterable[LedgerEntry],
                producers: Iterable[LedgerEntry]) -> list[tuple[LedgerEntry, AssetInput]]:
    """The consumer checkpoints that read a producer epoch in an incarnation its ledger no
    longer names (a recovery redid the epoch since, or rolled it back and has not yet redone
    it), each with the read that is stale: what a recovery upstream left behind downstream.

    >>> from falkirk.policies.store.ledger import AssetInput
    >>> publish = [LedgerEntry(dag_id="orders", task_id="publish", epoch=e, regime="eager_checkpoint", run_id=f"r{e}", try_number=1, incarnation=i)
    ...            for e, i in ((1, 0), (2, 1))]
    >>> report = [LedgerEntry(dag_id="reports", task_id="report", epoch=k, regime="eager_checkpoint", run_id=f"k{k}", try_number=1, asset_inputs=(
    ...           AssetInput(asset="orders.ranking", dag_id="orders", task_id="publish", output="output", epoch=k),)) for k in (1, 2)]
    >>> [(row.epoch, read.epoch, read.incarnation) for row, read in stale_reads(report, publish)]
    [(2, 2, 0)]
    """
    current = {e.commit_id for e in producers}
    return [(row, read) for row in consumers for read in row.asset_inputs if read.commit_id not in current]
