"""Plans across DAGs joined by Assets, against a brute-force oracle.

The producer DAG is the four-regime pipeline of ``test_recovery`` (source → clean → model →
sink) under a random failure. A consumer DAG (report, stateful, → publish, stateless) is
scheduled on the Asset of one of its tasks, each of its runs consuming a random batch of that
task's epochs; a third DAG (audit, stateful) may be scheduled on publish's Asset in turn. The
oracle enumerates every choice of "runs kept" per consumer task and keeps those in which no
kept run read an epoch its producer redoes, then takes the greatest; the plan must name
exactly the re-runs that choice implies, in every DAG, and the producer's plan must be the one
it would have had alone.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings, strategies as st

from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint
from falkirk.policies.planning.assets import AssetEdge, dag_order, plan_across_dags
from falkirk.policies.planning.chains import DataEdge, TaskGraph
from falkirk.policies.planning.recovery import BadEpoch, FailedTask, LostScratch, PlanError, plan_recovery
from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef
from tests.unit.test_recovery import GRAPH, REGIMES, TASKS, history, readable_when
from tests.unit.test_recovery import oracle as producer_oracle


def batches(rng: random.Random, epochs: int) -> dict[int, tuple[int, ...]]:
    """Runs 1, 2, ... of a DAG scheduled on an Asset, each consuming the events since the last."""
    runs, epoch, run = {}, 1, 1
    one_each = rng.random() < 0.3
    while epoch <= epochs:
        size = 1 if one_each else rng.randint(1, 3)
        runs[run] = tuple(range(epoch, min(epoch + size, epochs + 1)))
        epoch, run = epoch + size, run + 1
    return runs


def chain_rows(dag: str, regimes: dict, runs: int) -> list[LedgerEntry]:
    """Ledger rows of ``runs`` runs of a linear DAG with ``regimes`` (in order), all committed."""
    rows, tasks = [], list(regimes)
    for t in range(1, runs + 1):
        for i, (task, regime) in enumerate(regimes.items()):
            tier = regime.output_tier(t).value
            state = (f"/{regime.state_tier(t).value}/{dag}/{task}/state", regime.state_tier(t).value) \
                if regime.keeps_state else (None, None)
            rows.append(LedgerEntry(dag_id=dag, task_id=task, epoch=t, regime=regime.spec(), run_id=f"run-{t}", try_number=1,
                                    outputs=(OutputRef("output", f"/{tier}/{dag}/{task}/output", tier, t, 10, None),),
                                    inputs=(InputRef(task_id=tasks[i - 1], output="output", through=t),) if i else (), notified_through=t,
                                    state_uri=state[0], state_tier=state[1], state_version=t if state[0] else None))
    return rows


def planner(graph: TaskGraph, rows: list[LedgerEntry], last: int, regimes: dict, scratch_lost: bool = False):
    def plan(dag: str, failures):
        return plan_recovery(dag, graph, rows, failures, last_epoch=last, readable=readable_when(scratch_lost),
                             regimes=regimes)
    return plan


def consumer_oracle(runs: dict[int, tuple[int, ...]], redone: set[int], tasks: list[str],
                    ) -> tuple[dict[str, int], set[tuple[str, int]]]:
    """Greatest runs kept per task of a linear consumer DAG whose first task is stateful and
    reads the Asset (the rest read the task before them), and its re-runs."""
    last = max(runs, default=0)
    best = None
    for kept in itertools.product(range(last + 1), repeat=len(tasks)):
        f = dict(zip(tasks, kept))
        fresh = all(not redone.intersection(runs[k]) for k in range(1, f[tasks[0]] + 1))
        if fresh and all(f[b] <= f[a] for a, b in zip(tasks, tasks[1:])):
            best = f if best is None else {t: max(best[t], f[t]) for t in tasks}
    return best, {(t, k) for t in tasks for k in range(best[t] + 1, last + 1)}


REPORTS = {"report": EagerCheckpoint(), "publish": Batch(log_outputs=True)}


@settings(max_examples=200, deadline=None)
@given(epochs=st.integers(3, 6), kind=st.sampled_from(["failed", "lost", "bad", "failed+lost"]),
       task=st.sampled_from(TASKS), at=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_the_plan_across_dags_reruns_exactly_what_the_oracle_derives(epochs, kind, task, at, seed) -> None:
    rng = random.Random(seed)
    at = min(at, epochs)
    failed = (task, at) if "failed" in kind else None
    rows = history(epochs, failed)
    failures = [FailedTask(task, at)] if failed else []
    failures += [LostScratch("/scratch")] if "lost" in kind else []
    failures += [BadEpoch(task, at)] if kind == "bad" else []

    # reports: on the Asset of one producer task, over the epochs that task committed
    asset_task = rng.choice(TASKS[1:])
    produced = max((r.epoch for r in rows if r.task_id == asset_task), default=0)
    if produced == 0:
        return
    reports_regimes = {"report": rng.choice([EagerCheckpoint(), LazyCheckpoint(every=2)]),
                       "publish": rng.choice([Batch(log_outputs=True), Ephemeral()])}
    report_runs = batches(rng, produced)
    reports_rows = chain_rows("reports", reports_regimes, len(report_runs))
    reports_graph = TaskGraph(("report", "publish"), (DataEdge("report", "output", "publish"),))
    edges = [AssetEdge("pipe", asset_task, "reports", "report", report_runs)]
    dags = {"pipe": planner(GRAPH, rows, epochs, REGIMES, "lost" in kind),
            "reports": planner(reports_graph, reports_rows, len(report_runs), reports_regimes)}
    audit_runs = batches(rng, len(report_runs)) if rng.random() < 0.5 else None
    if audit_runs:
        audit = {"audit": EagerCheckpoint()}
        dags["audit"] = planner(TaskGraph(("audit",), ()), chain_rows("audit", audit, len(audit_runs)),
                                len(audit_runs), audit)
        edges.append(AssetEdge("reports", "publish", "audit", "audit", audit_runs))

    plan = plan_across_dags(dags, edges, {"pipe": failures})

    frontiers, redo = producer_oracle(rows, epochs, (task, at) if kind == "bad" else None, "lost" in kind)
    alone = plan_recovery("pipe", GRAPH, rows, failures, last_epoch=epochs, readable=readable_when("lost" in kind),
                          regimes=REGIMES)
    assert plan.plan("pipe") == alone and alone.rerun_set() == redo
    expected = {("pipe", t, e) for t, e in redo}
    kept, reports_redo = consumer_oracle(report_runs, {e for t, e in redo if t == asset_task}, ["report", "publish"])
    expected |= {("reports", t, k) for t, k in reports_redo}
    if audit_runs:
        _, audit_redo = consumer_oracle(audit_runs, {k for t, k in reports_redo if t == "publish"}, ["audit"])
        expected |= {("audit", t, k) for t, k in audit_redo}
    assert plan.rerun_set() == expected
    if reports_redo:
        assert {t.task_id: t.kept_through for t in plan.plan("reports").tasks} == kept
    else:
        assert "reports" not in plan.dags()  # a consumer that read nothing redone is not touched
    assert list(plan.dags()) == [d for d in ("pipe", "reports", "audit") if d in plan.dags()]


def test_a_bad_producer_epoch_reruns_the_consumer_runs_from_the_first_that_read_it() -> None:
    # pipe runs epochs 1-6; reports ran on sink's Asset three times, on epochs 1-2, 3-4 and 5-6.
    # model's epoch 4 is bad: model restores its durable epoch 3 and, like sink, redoes 4-6; reports'
    # run 2 read sink 3-4: report restores its checkpoint of run 1 and redoes runs 2 and 3, publish too.
    rows = history(6, None)
    reports_rows = chain_rows("reports", REPORTS, 3)
    graph = TaskGraph(("report", "publish"), (DataEdge("report", "output", "publish"),))
    edge = AssetEdge("pipe", "sink", "reports", "report", {1: (1, 2), 2: (3, 4), 3: (5, 6)})
    plan = plan_across_dags({"pipe": planner(GRAPH, rows, 6, REGIMES), "reports": planner(graph, reports_rows, 3, REPORTS)},
                            [edge], {"pipe": [BadEpoch("model", 4)]})
    assert plan.rerun_set() == ({("pipe", t, e) for t in ("model", "sink") for e in (4, 5, 6)}
                                | {("reports", t, k) for t in ("report", "publish") for k in (2, 3)})
    assert plan.plan("reports").task("report").restore_from.epoch == 1
    assert plan.plan("reports").failures == (BadEpoch("report", 2), BadEpoch("report", 3))


def test_bad_asset_graphs_are_refused_naming_the_dag() -> None:
    with pytest.raises(PlanError, match="cycle among a, b"):
        dag_order(["a", "b"], [AssetEdge("a", "x", "b", "y"), AssetEdge("b", "y", "a", "x")])
    with pytest.raises(PlanError, match="DAG 'c' is not among the DAGs planned"):
        dag_order(["a"], [AssetEdge("a", "x", "c", "y")])
    with pytest.raises(PlanError, match="both ends are in one DAG"):
        AssetEdge("a", "x", "a", "y")
    with pytest.raises(PlanError, match="DAG 'nope' has no planner"):
        plan_across_dags({}, [], {"nope": [BadEpoch("x", 1)]})
