"""model (LazyCheckpoint every=3): running quantity and event count per item.

State in scratch every epoch, durable every third; the output (this epoch's and the
running figures per item) goes to scratch.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

STATE_SCHEMA = "item string, total_qty long, events long"


def compute(ctx: EpochContext) -> EpochResult:
    this = ctx.read_input("clean").groupBy("item").agg(F.sum("qty").alias("epoch_qty"),
                                                      F.count("*").alias("epoch_events"))
    previous = ctx.previous_state()
    if previous is None:
        previous = ctx.spark.createDataFrame([], schema=STATE_SCHEMA)
    joined = previous.join(this, "item", "full_outer").select(
        "item",
        F.coalesce("epoch_qty", F.lit(0)).cast("long").alias("epoch_qty"),
        (F.coalesce("total_qty", F.lit(0)) + F.coalesce("epoch_qty", F.lit(0))).cast("long").alias("total_qty"),
        (F.coalesce("events", F.lit(0)) + F.coalesce("epoch_events", F.lit(0))).cast("long").alias("events"),
    )
    return EpochResult(outputs={"output": joined}, state=joined.select("item", "total_qty", "events"))


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
