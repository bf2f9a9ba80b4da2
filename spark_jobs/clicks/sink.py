"""sink (EagerCheckpoint): publish the top items of each epoch, exactly once.

Output: this epoch's top three items by running quantity. State: per item, in how many
epochs it was published. Both durable every epoch.
"""

from __future__ import annotations

from pyspark.sql import Window
from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

STATE_SCHEMA = "item string, times_published long"
TOP = 3


def compute(ctx: EpochContext) -> EpochResult:
    order = Window.orderBy(F.col("total_qty").desc(), F.col("item").asc())
    top = (ctx.read_input("model").select("item", "total_qty")
           .withColumn("rank", F.row_number().over(order).cast("long")).where(F.col("rank") <= TOP))
    previous = ctx.previous_state()
    if previous is None:
        previous = ctx.spark.createDataFrame([], schema=STATE_SCHEMA)
    state = previous.join(top.select("item", F.lit(1).alias("now")), "item", "full_outer").select(
        "item", (F.coalesce("times_published", F.lit(0)) + F.coalesce("now", F.lit(0))).cast("long")
        .alias("times_published"))
    return EpochResult(outputs={"output": top}, state=state)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
