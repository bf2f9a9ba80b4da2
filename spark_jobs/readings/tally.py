"""tally (lazy checkpoint): running kWh per meter; its output is the totals after the epoch."""

from __future__ import annotations

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

STATE_SCHEMA = "meter string, kwh long"


def compute(ctx: EpochContext) -> EpochResult:
    from pyspark.sql import functions as F

    this = ctx.read_input("intake").groupBy("meter").agg(F.sum("kwh").alias("kwh"))
    previous = ctx.previous_state()
    if previous is None:
        previous = ctx.spark.createDataFrame([], STATE_SCHEMA)
    totals = (previous.withColumnRenamed("kwh", "before").join(this, "meter", "full_outer")
              .select("meter", (F.coalesce("before", F.lit(0)) + F.coalesce("kwh", F.lit(0))).cast("long").alias("kwh")))
    return EpochResult(outputs={"output": totals}, state=totals)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
