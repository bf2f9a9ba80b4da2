"""ingest (Batch, logged): the epoch's orders, as the source delivers them (invalid ones too).

``ORDERS_ENV`` orders per epoch (default 24), generated from the epoch number alone, so a
re-run delivers the same block. Its output is the log ``clean`` replays: each epoch is kept
until ``clean`` has released it.
"""

from __future__ import annotations

import os

from pyspark.sql import functions as F

from falkirk.spark_jobs.pipeline.source import CUSTOMERS
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

ORDERS_ENV = "FALKIRK_REGIONS_ORDERS"
DEFAULT_ORDERS = 24


def orders_per_epoch() -> int:
    text = os.environ.get(ORDERS_ENV, str(DEFAULT_ORDERS))
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{ORDERS_ENV}={text!r}: give the number of orders per epoch, a whole number >= 1")
    return int(text)


def compute(ctx: EpochContext) -> EpochResult:
    i, epoch = F.col("id"), F.lit(ctx.epoch)
    names = F.array(*(F.lit(c) for c in CUSTOMERS))
    orders = ctx.spark.range(orders_per_epoch()).select(
        (epoch * 10_000_000 + i).cast("long").alias("order_id"),
        F.element_at(names, ((i * 7 + epoch) % len(CUSTOMERS) + 1).cast("int")).alias("customer"),
        ((i * 37 + epoch * 11) % 50 - 5).cast("long").alias("amount"))
    return EpochResult(outputs={"output": orders})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
