"""publish (Batch, logged outputs): this epoch's customer ranking by running total.

Stateless. Its output is logged durably, which makes it a firewall: a failure below it
never forces aggregate or ingest to roll back.
"""

from __future__ import annotations

from pyspark.sql import Window
from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job


def compute(ctx: EpochContext) -> EpochResult:
    totals = ctx.read_input("aggregate")
    order = Window.orderBy(F.col("total_amount").desc(), F.col("customer").asc())
    ranking = totals.select(
        F.row_number().over(order).cast("long").alias("rank"), "customer", "total_amount", "total_orders"
    )
    return EpochResult(outputs={"output": ranking})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
