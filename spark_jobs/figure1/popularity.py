"""popularity (Batch, outputs logged): item popularity over the last WINDOW epochs.

A periodic heavy computation that keeps no state between epochs: each epoch it reads the
reduced events of the window again and recomputes. Its output is logged durably, so it
is a firewall: a failure downstream never needs the ephemeral region to run again.
"""

from __future__ import annotations

from pyspark.sql import Window
from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

WINDOW = 3


def compute(ctx: EpochContext) -> EpochResult:
    frames = [ctx.read_input("events", epoch=e) for e in range(max(1, ctx.epoch - WINDOW + 1), ctx.epoch + 1)]
    events = frames[0]
    for f in frames[1:]:
        events = events.unionByName(f)
    per_item = events.groupBy("item").agg(F.sum("clicks").cast("long").alias("clicks"),
                                          F.countDistinct("user").cast("long").alias("users"))
    order = Window.orderBy(F.col("clicks").desc(), F.col("item").asc())
    return EpochResult(outputs={"output": per_item.withColumn("popularity_rank", F.row_number().over(order).cast("long"))})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
