"""clean (Batch, logged outputs): drop events with a quantity below one.

Stateless; its output is logged durably, so a failure below it never forces the source
to replay.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job


def compute(ctx: EpochContext) -> EpochResult:
    return EpochResult(outputs={"output": ctx.read_input("source").where(F.col("qty") >= 1)})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
