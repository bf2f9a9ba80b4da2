"""ingest (Ephemeral): read this epoch's orders from the source and drop invalid ones.

Persists nothing durable: its output goes to the scratch tier, and after a loss the
epoch is read again from the source.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.spark_jobs.pipeline.source import orders_for_epoch
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

SCHEMA = "order_id long, customer string, amount long"


def compute(ctx: EpochContext) -> EpochResult:
    orders = ctx.spark.createDataFrame(orders_for_epoch(ctx.epoch), schema=SCHEMA)
    valid = orders.where(F.col("amount") > 0)
    return EpochResult(outputs={"output": valid})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
