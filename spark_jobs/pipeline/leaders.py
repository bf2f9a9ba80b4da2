"""leaders (EagerCheckpoint), in the DAG ``falkirk_orders_leaders``: how many epochs each
customer has ranked in the top three of ``falkirk_orders``' ranking, read through the Asset
``falkirk_orders.ranking``.

State: one row per customer who has ranked in the top three, with the number of epochs they
did and their best rank. Each run reads the ranking epochs its asset events name
(``ctx.read_asset``), at the incarnation ``falkirk_orders``' ledger names: after a recovery
there redid an epoch, the redo.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

RANKING = "falkirk_orders.ranking"
TOP = 3
STATE_SCHEMA = "customer string, epochs_on_top long, best_rank long"


def compute(ctx: EpochContext) -> EpochResult:
    ranking = ctx.read_asset(RANKING)
    top = ranking.where(F.col("rank") <= TOP).groupBy("customer").agg(
        F.count("*").alias("epochs"), F.min("rank").alias("best")
    )
    previous = ctx.previous_state()
    if previous is None:
        previous = ctx.spark.createDataFrame([], schema=STATE_SCHEMA)
    leaders = previous.join(top, "customer", "full_outer").select(
        "customer",
        (F.coalesce("epochs_on_top", F.lit(0)) + F.coalesce("epochs", F.lit(0))).cast("long").alias("epochs_on_top"),
        F.least(F.coalesce("best_rank", F.lit(TOP)), F.coalesce("best", F.lit(TOP))).cast("long").alias("best_rank"),
    )
    return EpochResult(outputs={"output": leaders}, state=leaders)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
