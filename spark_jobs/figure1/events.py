"""events (Ephemeral): the epoch's raw clickstream, reduced before it leaves the region.

Bots and views shorter than two seconds are dropped, only (user, item) is kept, and the
events are pre-aggregated per (user, item): tens of thousands of records become a few
thousand rows. Nothing is durable; after a loss the epoch is generated again.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from spark_jobs.figure1.data import clickstream
from spark_jobs.runtime import EpochContext, EpochResult, run_job

MIN_DWELL_MS = 2_000


def compute(ctx: EpochContext) -> EpochResult:
    raw = clickstream(ctx.spark, ctx.epoch)
    kept = raw.where((F.col("kind") != "bot") & (F.col("dwell_ms") >= MIN_DWELL_MS))
    reduced = kept.groupBy("user", "item").agg(
        F.count("*").alias("events"),
        F.sum(F.when(F.col("kind") == "click", 1).otherwise(0)).cast("long").alias("clicks"))
    return EpochResult(outputs={"output": reduced})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
