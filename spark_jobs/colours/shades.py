"""shades (SenderLog, ``palette: immediate``; stateless): each colour of the block, in capitals."""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job


def compute(ctx: EpochContext) -> EpochResult:
    block = ctx.read_input("palette")
    return EpochResult(outputs={"output": block.select("colour", F.upper("colour").alias("shade"), "pos")})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
