"""clean (SenderLog, ``ingest: immediate``): drops the orders with no positive amount.

Stateless: each block of ``ingest`` is released as soon as this epoch is committed.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job


def compute(ctx: EpochContext) -> EpochResult:
    return EpochResult(outputs={"output": ctx.read_input("ingest").where(F.col("amount") > 0)})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
