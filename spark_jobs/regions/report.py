"""report (Batch, logged): the regions ranked by their running total; the pipeline's sink."""

from __future__ import annotations

from pyspark.sql import Window
from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job


def compute(ctx: EpochContext) -> EpochResult:
    order = Window.orderBy(F.col("amount").desc(), F.col("region").asc())
    totals = ctx.read_input("total")
    return EpochResult(outputs={"output": totals.select(F.row_number().over(order).cast("long").alias("rank"),
                                                        "region", "orders", "amount")})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
