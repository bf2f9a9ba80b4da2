"""Garbage collection on a real pipeline (real Spark, real Delta tables): storage stays
bounded over a long run, a dry run changes nothing, a real run is idempotent, and a
recovery planned after collections still runs and ends equal to a run that never collected.

The pipeline, run in-process through the runtime's own context and commit:

* ``events``  Batch(log_outputs=True): the epoch's orders per customer, logged durably;
* ``totals``  LazyCheckpoint(every=5): running totals, durable every fifth epoch;
* ``window``  Batch(log_outputs=True): the last three epochs of ``events`` (it reads back 2).

Two copies run side by side in one store: ``gc`` is collected after every epoch and
``keep`` never is.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from falkirk.policies import Batch, LazyCheckpoint, Ledger, StoreConfig
from falkirk.policies.job_spec import JobSpec
from falkirk.policies.planning.chains import DataEdge, TaskGraph
from falkirk.policies.planning.collector import collect, live_partitions
from falkirk.policies.planning.recovery import LostScratch, plan_recovery
from falkirk.policies.regimes import Tier
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.control import Collections
from falkirk.policies.store.readability import StoreReadability
from falkirk.spark_jobs.pipeline.source import orders_for_epoch
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, commit

GC, KEEP = "gc", "keep"
REGIMES = {"events": Batch(log_outputs=True), "totals": LazyCheckpoint(every=5), "window": Batch(log_outputs=True)}
INPUTS = {"events": (), "totals": ("events",), "window": ("events",)}
GRAPH = TaskGraph(tuple(REGIMES), (DataEdge("events", "output", "totals"), DataEdge("events", "output", "window")))
WINDOW = 3
EVERY = 5
# The bound the long run must stay under: with every=5, the low-watermark of totals is at
# most five epochs behind, so no table holds more than that many live epochs.
BOUND = EVERY


def job(ctx: EpochContext) -> EpochResult:
    from pyspark.sql import functions as F

    task = ctx.args.task_id
    if task == "events":
        orders = ctx.spark.createDataFrame(orders_for_epoch(ctx.epoch), "order_id long, customer string, amount long")
        return EpochResult(outputs={"output": orders.groupBy("customer").agg(F.sum("amount").alias("amount"))})
    if task == "window":
        frames = [ctx.read_input("events", epoch=e) for e in range(max(1, ctx.epoch - WINDOW + 1), ctx.epoch + 1)]
        rows = frames[0]
        for f in frames[1:]:
            rows = rows.unionByName(f)
        return EpochResult(outputs={"output": rows.groupBy("customer").agg(F.sum("amount").alias("amount"))})
    this = ctx.read_input("events")
    previous = ctx.previous_state()
    if previous is None:
        previous = ctx.spark.createDataFrame([], "customer string, amount long")
    state = (previous.withColumnRenamed("amount", "before").join(this, "customer", "full_outer")
             .select("customer", (F.coalesce("before", F.lit(0)) + F.coalesce("amount", F.lit(0))).alias("amount")))
    return EpochResult(outputs={"output": state}, state=state)


def run_epoch(spark, store: StoreConfig, dag: str, epoch: int, tasks=tuple(REGIMES)) -> None:
    ledger = Ledger(store)
    for task in tasks:
        inc = ledger.invalidations.next_incarnation(dag, task, epoch)
        ctx = EpochContext(JobSpec(dag_id=dag, task_id=task, epoch=epoch, regime=REGIMES[task], run_id=f"epoch-{epoch}", inputs=INPUTS[task],
                                   incarnation=inc), store, ledger, spark)
        commit(ctx, job(ctx))


def live(store: StoreConfig, dag: str) -> dict[str, int]:
    """How many epochs each collectable table holds now, and the ledger rows still live."""
    out = {
        "totals durable state": len(live_partitions(store, store.table_uri(Tier.DURABLE, dag, "totals", "state"))),
        "totals scratch state": len(live_partitions(store, store.table_uri(Tier.SCRATCH, dag, "totals", "state"))),
        "events log": len(live_partitions(store, store.table_uri(Tier.DURABLE, dag, "events", "output"))),
    }
    collected = Collections(store).through(dag)
    out["ledger rows"] = sum(1 for e in Ledger(store).entries(dag) if e.epoch > collected.get(e.task_id, 0))
    return out


def rows(store: StoreConfig, dag: str, task: str, table: str, tier: Tier) -> list[tuple]:
    t = open_table(store.table_uri(tier, dag, task, table))
    return sorted(tuple(sorted(r.items())) for r in scan(t).to_pylist()) if t is not None else []


@pytest.fixture(scope="module")
def local_store(tmp_path_factory) -> StoreConfig:
    root = tmp_path_factory.mktemp("collector")
    return StoreConfig(str(root / "durable"), str(root / "scratch"))


def test_storage_stays_bounded_over_sixty_epochs(spark, local_store: StoreConfig) -> None:
    store = local_store
    history = []
    for epoch in range(1, 61):
        for dag in (GC, KEEP):
            run_epoch(spark, store, dag, epoch)
        collect(store, GC, GRAPH, retain_hours=0)
        history.append(live(store, GC))
        if epoch % 10 == 0:
            print(f"epoch {epoch}: collected {history[-1]}, never collected {live(store, KEEP)}", flush=True)

    for epoch, counts in enumerate(history, start=1):
        assert counts["totals durable state"] <= 1, (epoch, counts)
        assert counts["totals scratch state"] <= BOUND and counts["events log"] <= BOUND, (epoch, counts)
        assert counts["ledger rows"] <= 3 * BOUND, (epoch, counts)
    # After epoch 60 totals' low-watermark is epoch 60 itself: one checkpoint of each kind is left.
    assert history[-1] == {"totals durable state": 1, "totals scratch state": 1, "events log": 2,
                           "ledger rows": 3}
    assert live(store, KEEP) == {"totals durable state": 12, "totals scratch state": 60, "events log": 60,
                                 "ledger rows": 180}
    # Vacuumed with no retention: the deleted epochs' files are gone from disk as well.
    state_dir = store.table_uri(Tier.SCRATCH, GC, "totals", "state")
    assert sorted(d for d in os.listdir(state_dir) if d.startswith("epoch=")) == ["epoch=60"]
    assert all(p.parent.name == "epoch=60" for p in Path(state_dir).rglob("*.parquet")
               if p.parent.name != "_delta_log")  # the log's own checkpoints are not data
    # What the pipeline delivers is never collected, and equals the uncollected copy's.
    for task, tier in (("window", Tier.DURABLE), ("totals", Tier.SCRATCH)):
        got, want = rows(store, GC, task, "output", tier), rows(store, KEEP, task, "output", tier)
        assert got == want and len({dict(r)["epoch"] for r in got}) == 60


def test_dry_run_changes_nothing_and_a_second_run_reclaims_nothing(spark, tmp_path, monkeypatch, capsys) -> None:
    from falkirk.plugins.cli import main

    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    for epoch in range(1, 13):
        run_epoch(spark, store, GC, epoch)

    def snapshot() -> dict:
        files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
        return {"files": files, "collected": Collections(store).through(GC), "ledger": Ledger(store).version()}

    before = snapshot()
    for k, v in store.env().items():
        monkeypatch.setenv(k, v)
    assert main(["gc", "--dag", GC, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "totals: low-watermark epoch 10; ledger rows through epoch 9 marked collected" in out
    assert "dry run: nothing was changed" in out and snapshot() == before
    assert main(["gc", "--dag", "nope", "--dry-run"]) == 2
    assert "has no rows for DAG 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # Delta's vacuum takes whole hours only
        main(["gc", "--dag", GC, "--retain-hours", "0.5"])
    assert refused.value.code == 2 and "--retain-hours" in capsys.readouterr().err and snapshot() == before
    dry = collect(store, GC, GRAPH, dry_run=True, retain_hours=0)
    assert snapshot() == before
    p = dry.plan
    assert p.watermarks == {"events": 12, "totals": 10, "window": 12}
    assert p.marks == {"events": 11, "totals": 9, "window": 11}
    assert {(r.task_id, r.what, r.uri.split("/")[-4]): r.epochs for r in p.tables} == {
        ("events", "output", "durable"): tuple(range(1, 11)),  # totals re-runs 11 on; window's 13 reads 11, 12
        ("totals", "state", "durable"): (5,),
        ("totals", "state", "scratch"): tuple(range(1, 10)),
    }
    assert "low-watermark epoch 10" in p.describe()

    done = collect(store, GC, GRAPH, retain_hours=0)
    assert done.plan == p and done.files_removed > 0
    after = snapshot()
    assert after != before and after["collected"] == {"events": 11, "totals": 9, "window": 11}
    again = collect(store, GC, GRAPH, retain_hours=0)
    assert again.plan.empty and snapshot() == after


def test_a_recovery_after_collection_still_runs_and_matches(spark, tmp_path) -> None:
    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    for epoch in range(1, 14):
        for dag in (GC, KEEP):
            run_epoch(spark, store, dag, epoch)
        collect(store, GC, GRAPH, retain_hours=0)
    shutil.rmtree(f"{store.scratch_uri}/{GC}/totals")  # totals' scratch tier is lost

    ledger = Ledger(store)
    p = plan_recovery(GC, GRAPH, ledger.entries(GC), [LostScratch(f"{store.scratch_uri}/{GC}/totals")], 13,
                      StoreReadability(store))
    assert {t.task_id: t.rerun for t in p.tasks if t.rerun} == {"totals": (11, 12, 13)}
    assert p.task("totals").restore_from.epoch == 10
    ledger.invalidations.record([e for e in ledger.entries(GC) if (e.task_id, e.epoch) in p.rerun_set()], p.plan_id)
    for epoch in (11, 12, 13):
        run_epoch(spark, store, GC, epoch, tasks=("totals",))

    assert rows(store, GC, "totals", "state", Tier.SCRATCH) == [
        r for r in rows(store, KEEP, "totals", "state", Tier.SCRATCH) if dict(r)["epoch"] in (11, 12, 13)]
    assert rows(store, GC, "totals", "state", Tier.DURABLE) == [
        r for r in rows(store, KEEP, "totals", "state", Tier.DURABLE) if dict(r)["epoch"] == 10]
    assert rows(store, GC, "window", "output", Tier.DURABLE) == rows(store, KEEP, "window", "output", Tier.DURABLE)
