"""aggregate (EagerCheckpoint): running totals per customer across epochs.

State: one row per customer with the totals through the previous epoch. Each epoch adds
its orders and commits the new totals (state) and the epoch's view (output) durably,
so the task can restore to any epoch and a re-run never counts an epoch twice.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

STATE_SCHEMA = "customer string, total_amount long, total_orders long"


def compute(ctx: EpochContext) -> EpochResult:
    orders = ctx.read_input("ingest")
    this_epoch = orders.groupBy("customer").agg(
        F.sum("amount").alias("epoch_amount"), F.count("*").alias("epoch_orders")
    )
    previous = ctx.previous_state()
    if previous is None:
        previous = ctx.spark.createDataFrame([], schema=STATE_SCHEMA)
    joined = previous.join(this_epoch, "customer", "full_outer").select(
        "customer",
        F.coalesce("epoch_amount", F.lit(0)).cast("long").alias("epoch_amount"),
        F.coalesce("epoch_orders", F.lit(0)).cast("long").alias("epoch_orders"),
        (F.coalesce("total_amount", F.lit(0)) + F.coalesce("epoch_amount", F.lit(0))).cast("long").alias("total_amount"),
        (F.coalesce("total_orders", F.lit(0)) + F.coalesce("epoch_orders", F.lit(0))).cast("long").alias("total_orders"),
    )
    state = joined.select("customer", "total_amount", "total_orders")
    return EpochResult(outputs={"output": joined}, state=state)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
