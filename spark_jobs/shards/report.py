"""report (Batch, logged; not partitioned): the epoch's top three users over all partitions.

It reads every partition of ``leaders`` whole (a task that is not partitioned gathers them).
"""

from __future__ import annotations

from pyspark.sql import Window
from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

TOP = 3


def compute(ctx: EpochContext) -> EpochResult:
    order = Window.orderBy(F.col("total_amount").desc(), F.col("user").asc())
    top = (ctx.read_input("leaders").select("user", "total_amount")
           .withColumn("rank", F.row_number().over(order).cast("long")).where(F.col("rank") <= TOP))
    return EpochResult(outputs={"output": top})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
