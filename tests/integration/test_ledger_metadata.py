"""Ξ from a stored pipeline equals Ξ computed by hand.

Pipeline (real Spark jobs through the runtime, 3 epochs, durable tier local and on S3):

    source (Ephemeral) --output--> clean (Batch, logs) --output--> totals (LazyCheckpoint every=2)

After epoch 3 the scratch tier is lost (its directory deleted). Then, by hand, in the
epoch domain where a checkpoint after epoch t is the bound t + 1 and ∅ is 0:

* ``clean``, a logging batch task: F* = ∅, 1, 2, 3; M̄(source→clean) = N̄ = ↓t; D̄ = ∅
  (every row it sent is logged);
* ``totals``, a lazy task between checkpoints: F* = ∅, 2 only (epochs 1 and 3 had their
  state in scratch, which is gone; epoch 2 is durable); M̄(clean→totals) = N̄ = ↓2;
* ``source``, an ephemeral task whose scratch is gone: F* = ∅, 1, 2, 3 (stateless), and
  D̄(source→clean) = ↓t at every t, since none of its rows can be read again. Before the
  loss the same rows are readable and D̄ = ∅: exact, where the commit-time value
  (``discarded_through``) says ↓t.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from falkirk.policies import Batch, Ephemeral, LazyCheckpoint, Ledger, StoreConfig
from falkirk.policies.job_spec import JobSpec
from falkirk.policies.planning.chains import TaskGraph, chains_from_ledger
from falkirk.policies.rollback.solver import solve
from falkirk.policies.store.readability import StoreReadability
from falkirk.spark_jobs.pipeline.source import orders_for_epoch
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, commit

DAG = "xi"
EPOCHS = [1, 2, 3]
SRC, CLEAN = "source.output->clean", "clean.output->totals"
TASKS = {
    "source": (Ephemeral(), ()),
    "clean": (Batch(log_outputs=True), ("source",)),
    "totals": (LazyCheckpoint(every=2), ("clean",)),
}


def job(ctx: EpochContext) -> EpochResult:
    from pyspark.sql import functions as F

    if ctx.args.task_id == "source":
        return EpochResult(outputs={"output": ctx.spark.createDataFrame(
            orders_for_epoch(ctx.epoch), "order_id long, customer string, amount long")})
    if ctx.args.task_id == "clean":
        return EpochResult(outputs={"output": ctx.read_input("source").where("amount > 0")})
    this = ctx.read_input("clean").groupBy("customer").agg(F.sum("amount").alias("amount"))
    previous = ctx.previous_state()
    state = this if previous is None else (
        previous.withColumnRenamed("amount", "before").join(this, "customer", "full_outer")
        .select("customer", (F.coalesce("before", F.lit(0)) + F.coalesce("amount", F.lit(0))).alias("amount")))
    return EpochResult(outputs={"output": this}, state=state)


def run_pipeline(spark, store: StoreConfig) -> Ledger:
    ledger = Ledger(store)
    for epoch in EPOCHS:
        for task, (regime, inputs) in TASKS.items():
            ctx = EpochContext(JobSpec(dag_id=DAG, task_id=task, epoch=epoch, regime=regime, run_id=f"epoch-{epoch}", inputs=inputs), store, ledger, spark)
            commit(ctx, job(ctx))
    return ledger


def xi(chain) -> list[tuple]:
    return [(c.f, dict(c.M), c.N, dict(c.D)) for c in chain]


def test_ledger_yields_hand_computed_xi(spark, store: StoreConfig, monkeypatch, capsys) -> None:
    ledger = run_pipeline(spark, store)
    entries = ledger.entries(DAG)
    graph = TaskGraph.from_ledger(entries)
    assert set(graph.tasks) == set(TASKS) and {e.id for e in graph.edges} == {SRC, CLEAN}

    # What the commits recorded: M̄ and N̄ exactly, D̄ as seen at commit time (scratch = not logged).
    source_rows = [e for e in entries if e.task_id == "source"]
    assert [o.discarded_through for e in source_rows for o in e.outputs] == [1, 2, 3]
    assert [(i.task_id, i.through) for e in entries if e.task_id == "clean" for i in e.inputs] == [
        ("source", 1), ("source", 2), ("source", 3)]
    assert [e.notified_through for e in entries if e.task_id == "totals"] == [1, 2, 3]

    # Scratch still there: every output is readable, so nothing counts as discarded.
    before = chains_from_ledger(entries, graph, StoreReadability(store))
    assert xi(before["source"]) == [(0, {}, 0, {}), (2, {}, 2, {SRC: 0}), (3, {}, 3, {SRC: 0}),
                                    (4, {}, 4, {SRC: 0})]
    assert [c.f for c in before["totals"]] == [0, 2, 3, 4]

    shutil.rmtree(Path(store.scratch_uri))  # the worker's scratch directory is gone
    after = chains_from_ledger(entries, graph, StoreReadability(store), failed=["totals"])

    # (1) clean, a logging batch task.
    assert xi(after["clean"]) == [
        (0, {}, 0, {}),
        (2, {SRC: 2}, 2, {CLEAN: 0}),
        (3, {SRC: 3}, 3, {CLEAN: 0}),
        (4, {SRC: 4}, 4, {CLEAN: 0}),
    ]
    # (2) totals, lazy, after epoch 3: only the durable checkpoint of epoch 2 is left.
    assert xi(after["totals"]) == [(0, {}, 0, {}), (3, {CLEAN: 3}, 3, {})]
    # (3) source, ephemeral, its scratch gone: every row it sent is discarded.
    assert xi(after["source"]) == [(0, {}, 0, {}), (2, {}, 2, {SRC: 2}), (3, {}, 3, {SRC: 3}),
                                   (4, {}, 4, {SRC: 4})]

    # The solver on these chains: totals restarts after epoch 2; clean's log is a firewall,
    # so neither clean nor source rolls back.
    answer = solve(graph.solver_graph(failed=["totals"]), after)
    assert {t: answer.bound(t) for t in TASKS} == {"source": 4, "clean": 4, "totals": 3}

    # The same, planned from the ledger by the CLI (read-only): only totals re-runs epoch 3,
    # from its durable state of epoch 2; clear-downstream from the lost data would redo all 9.
    from falkirk.plugins.cli import main

    for name, value in store.env().items():
        monkeypatch.setenv(name, value)
    before_rows = ledger.read().num_rows
    assert main(["plan", "--dag", DAG, "--lost-scratch", store.scratch_uri, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {t["task_id"]: t["rerun"] for t in plan["tasks"]} == {"source": [], "clean": [], "totals": [3]}
    assert plan["tasks"][2]["restore_from"]["epoch"] == 2
    assert sorted(len(t["clear_downstream"]) for t in plan["tasks"]) == [3, 3, 3]
    assert ledger.read().num_rows == before_rows
    assert main(["plan", "--dag", DAG, "--bad-epoch", "clean:7"]) == 2
    assert "failures[0].epoch: 7 is not an epoch that has run; choose one of 1..3" in capsys.readouterr().err
