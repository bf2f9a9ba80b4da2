"""totals (LazyCheckpoint; partitioned by user): running amount and purchases per user.

Each partition reads its users' purchases from every partition of ``events``
(``Repartition(key="user")``) and keeps those users' running totals as its state.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.policies.partitions import Repartition
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

STATE_SCHEMA = "user string, total_amount long, purchases long"


def compute(ctx: EpochContext) -> EpochResult:
    this = (ctx.read_input("events", routing=Repartition(key="user"))
            .groupBy("user").agg(F.sum("amount").alias("epoch_amount"), F.count("*").alias("epoch_purchases")))
    previous = ctx.previous_state()
    if previous is None:
        previous = ctx.spark.createDataFrame([], schema=STATE_SCHEMA)
    joined = previous.join(this, "user", "full_outer").select(
        "user",
        F.coalesce("epoch_amount", F.lit(0)).cast("long").alias("epoch_amount"),
        (F.coalesce("total_amount", F.lit(0)) + F.coalesce("epoch_amount", F.lit(0))).cast("long").alias("total_amount"),
        (F.coalesce("purchases", F.lit(0)) + F.coalesce("epoch_purchases", F.lit(0))).cast("long").alias("purchases"),
    )
    return EpochResult(outputs={"output": joined}, state=joined.select("user", "total_amount", "purchases"))


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
