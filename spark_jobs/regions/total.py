"""total (SenderLog, ``join: at_end``): running totals per region, emitted every epoch.

A full aggregation: its state depends on every ``join`` block, so none is released before the
execution's last epoch. Rebuilding the state replays them all, from empty state.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

STATE_SCHEMA = "region string, orders long, amount long"


def compute(ctx: EpochContext) -> EpochResult:
    before = ctx.previous_state()
    if before is None:
        before = ctx.spark.createDataFrame([], schema=STATE_SCHEMA)
    epoch = ctx.read_input("join").groupBy("region").agg(F.count("*").alias("epoch_orders"),
                                                         F.sum("amount").alias("epoch_amount"))
    totals = before.join(epoch, "region", "full_outer").select(
        "region",
        (F.coalesce("orders", F.lit(0)) + F.coalesce("epoch_orders", F.lit(0))).cast("long").alias("orders"),
        (F.coalesce("amount", F.lit(0)) + F.coalesce("epoch_amount", F.lit(0))).cast("long").alias("amount"))
    return EpochResult(outputs={"output": totals}, state=totals)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
