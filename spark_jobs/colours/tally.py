"""tally (SenderLog, ``palette: at_end``): how many times each colour has been seen so far.

Its state is the running count per colour, kept in scratch only; rebuilding it replays every
``palette`` block. Each epoch outputs the counts of the colours the epoch's block holds.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

STATE_SCHEMA = "colour string, n long"


def compute(ctx: EpochContext) -> EpochResult:
    seen = ctx.previous_state()
    if seen is None:
        seen = ctx.spark.createDataFrame([], schema=STATE_SCHEMA)
    block = ctx.read_input("palette")
    counts = (seen.unionByName(block.groupBy("colour").agg(F.count("*").alias("n")))
              .groupBy("colour").agg(F.sum("n").cast("long").alias("n")))
    touched = counts.join(block.select("colour").distinct(), "colour")
    return EpochResult(outputs={"output": touched}, state=counts)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
