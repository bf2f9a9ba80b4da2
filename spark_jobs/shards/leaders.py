"""leaders (Batch, logged; one partition per ``totals`` partition): each partition's top two users.

Partition ``i`` reads partition ``i`` of ``totals`` alone (``OneToOne()``).
"""

from __future__ import annotations

from pyspark.sql import Window
from pyspark.sql import functions as F

from falkirk.policies.partitions import OneToOne
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

TOP = 2


def compute(ctx: EpochContext) -> EpochResult:
    order = Window.orderBy(F.col("total_amount").desc(), F.col("user").asc())
    top = (ctx.read_input("totals", routing=OneToOne()).select("user", "total_amount")
           .withColumn("rank", F.row_number().over(order).cast("long")).where(F.col("rank") <= TOP))
    return EpochResult(outputs={"output": top})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
