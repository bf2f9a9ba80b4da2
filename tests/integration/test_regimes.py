"""Each regime, for several epochs of a real Spark job: exactly what the durable tier, the
scratch tier and the ledger hold after every epoch, with the durable tier on a local path
and on an S3-compatible server.

The job runs through the runtime's own context and commit (``EpochContext``, ``commit``)
in one local Spark session, so the executors write the files and the driver commits them
exactly as under ``spark-submit``.
"""

from __future__ import annotations

import pytest

from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint, Ledger, Regime, StoreConfig, Tier
from falkirk.policies.job_spec import JobSpec
from falkirk.policies.store.commits import open_table, scan
from falkirk.spark_jobs.pipeline.source import orders_for_epoch
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, commit

DAG = "regimes"
EPOCHS = [1, 2, 3]


def totals_job(ctx: EpochContext) -> EpochResult:
    """Per-customer amounts of the epoch (stateless regimes) or running totals (stateful ones)."""
    from pyspark.sql import functions as F

    orders = ctx.spark.createDataFrame(orders_for_epoch(ctx.epoch), "order_id long, customer string, amount long")
    this = orders.where("amount > 0").groupBy("customer").agg(F.sum("amount").alias("amount"))
    if not ctx.args.regime.keeps_state:
        return EpochResult(outputs={"output": this})
    previous = ctx.previous_state()
    if previous is None:
        previous = ctx.spark.createDataFrame([], "customer string, amount long")
    state = (previous.withColumnRenamed("amount", "before").join(this, "customer", "full_outer")
             .select("customer", (F.coalesce("before", F.lit(0)) + F.coalesce("amount", F.lit(0))).alias("amount")))
    return EpochResult(outputs={"output": state}, state=state)


def expected_amounts(epoch: int, running: bool) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in (range(1, epoch + 1) if running else [epoch]):
        for r in orders_for_epoch(e):
            if r["amount"] > 0:
                out[r["customer"]] = out.get(r["customer"], 0) + r["amount"]
    return out


def epochs_in(store: StoreConfig, tier: Tier, task: str, table: str) -> dict[int, dict[str, int]] | None:
    """The rows of a task's table per epoch, or None if the table does not exist in that tier."""
    uri = store.table_uri(tier, DAG, task, table)
    dt = open_table(uri, store.options_for(uri))
    if dt is None:
        return None
    out: dict[int, dict[str, int]] = {}
    for row in scan(dt).to_pylist():
        out.setdefault(row["epoch"], {})[row["customer"]] = row["amount"]
    return out


S, D = Tier.SCRATCH, Tier.DURABLE
# The Falkirk Wheel's Figure 1, written out: regime, the outputs' tier, and the state's tiers at epochs 1, 2, 3.
CASES = [
    ("ephemeral", Ephemeral(), S, [(), (), ()]),
    ("batch", Batch(), S, [(), (), ()]),
    ("batch_logged", Batch(log_outputs=True), D, [(), (), ()]),
    ("lazy", LazyCheckpoint(every=2), S, [(S,), (S, D), (S,)]),  # scratch every epoch, durable every 2nd
    ("eager", EagerCheckpoint(), D, [(D,), (D,), (D,)]),
]


@pytest.mark.parametrize("task, regime, out_tier, state_tiers", CASES, ids=[c[0] for c in CASES])
def test_regime_persists_exactly_what_it_promises(spark, store: StoreConfig, task: str, regime: Regime,
                                                  out_tier: Tier, state_tiers: list[tuple[Tier, ...]]) -> None:
    ledger = Ledger(store)
    running = regime.keeps_state
    for epoch in EPOCHS:
        ctx = EpochContext(JobSpec(dag_id=DAG, task_id=task, epoch=epoch, regime=regime, run_id=f"epoch-{epoch}"), store, ledger, spark)
        entry = commit(ctx, totals_job(ctx))
        done = [e for e in EPOCHS if e <= epoch]

        # Outputs: every epoch so far, in the regime's output tier only.
        other = Tier.SCRATCH if out_tier is Tier.DURABLE else Tier.DURABLE
        assert epochs_in(store, out_tier, task, "output") == {e: expected_amounts(e, running) for e in done}
        assert epochs_in(store, other, task, "output") is None

        # State: in each tier, exactly the epochs whose checkpoint the regime sends there.
        for tier in (Tier.SCRATCH, Tier.DURABLE):
            want = {e: expected_amounts(e, True) for e in done if tier in state_tiers[e - 1]}
            assert epochs_in(store, tier, task, "state") == (want or None), (tier, epoch)

        # Ledger: one row per epoch so far, pointing at the most durable copy of the state.
        rows = ledger.entries(DAG)
        assert [(r.task_id, r.epoch) for r in rows] == [(task, e) for e in done]
        assert entry.regime == regime.spec() and [o.tier for o in entry.outputs] == [out_tier.value]
        tier = state_tiers[epoch - 1][-1] if state_tiers[epoch - 1] else None
        assert entry.state_tier == (tier.value if tier else None)
        assert (entry.state_uri is None) == (tier is None)
        if tier is not None:
            assert entry.state_uri == store.table_uri(tier, DAG, task, "state")


def test_a_declared_product_is_recorded_and_a_wrong_name_refused_before_any_commit(spark, store: StoreConfig) -> None:
    """The operator's ``products=`` reaches the ledger row of each output it names (garbage
    collection keeps those whole); naming an output the job did not return is an error that
    commits nothing."""
    from falkirk.spark_jobs.runtime import JobError

    ledger = Ledger(store)
    wrong = EpochContext(JobSpec(dag_id=DAG, task_id="report", epoch=1, regime=Batch(log_outputs=True), run_id="epoch-1", products=("totals",)),
                         store, ledger, spark)
    with pytest.raises(JobError, match=r"report: products=\['totals'\] names outputs the job did not return; "
                                       r"it returned \['output'\]: name those in products="):
        commit(wrong, totals_job(wrong))
    assert ledger.entries(DAG, "report") == [] and epochs_in(store, Tier.DURABLE, "report", "output") is None
    ctx = EpochContext(JobSpec(dag_id=DAG, task_id="report", epoch=1, regime=Batch(log_outputs=True), run_id="epoch-1", products=("output",)),
                       store, ledger, spark)
    entry = commit(ctx, totals_job(ctx))
    assert [(o.name, o.product) for o in entry.outputs] == [("output", True)]
    assert [(o.name, o.product) for e in ledger.entries(DAG, "report") for o in e.outputs] == [("output", True)]


def test_what_a_job_caches_is_released_when_its_commit_ends(spark, tmp_path) -> None:
    """``ctx.cache`` keeps a frame for the epoch only: released after the commit, and after a
    commit that fails too; a frame cached by ``frame.cache()`` would stay in the executors for
    the life of the server."""
    from falkirk.spark_jobs.runtime import JobError

    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    ctx = EpochContext(JobSpec(dag_id=DAG, task_id="cached", epoch=1, regime=Batch(), run_id="epoch-1"), store, Ledger(store), spark)
    kept = ctx.cache(spark.range(10).withColumnRenamed("id", "n"))
    assert kept.is_cached
    entry = commit(ctx, EpochResult(outputs={"output": kept.selectExpr("n", "1 AS epoch")}))
    assert entry.output_rows == 10 and not kept.is_cached

    failing = EpochContext(JobSpec(dag_id=DAG, task_id="cached", epoch=2, regime=Batch(), run_id="epoch-2"), store, Ledger(store), spark)
    kept = failing.cache(spark.range(3))
    with pytest.raises(JobError, match="returned no outputs"):
        commit(failing, EpochResult(outputs={}))
    assert not kept.is_cached
