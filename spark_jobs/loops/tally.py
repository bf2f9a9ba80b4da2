"""tally (Batch, logged): per page, the links it gained this epoch and their weighted reach,
worked out chunk by chunk (CHUNKS chunks of the epoch's links, split by source page).

Each chunk's result is committed as it is done (``ctx.chunks``): an attempt that dies in
chunk 5 resumes there, reading chunks 1-4 back instead of working them out again.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

CHUNKS = 6


def compute(ctx: EpochContext) -> EpochResult:
    links = ctx.read_input("links")

    def tally(chunk: DataFrame, i: int) -> DataFrame:
        return (chunk.groupBy("src").agg(F.count("*").alias("links"), F.sum(F.col("dst") * F.col("dst")).alias("reach"))
                .select("src", F.lit(i).cast("int").alias("chunk"), "links", F.col("reach").cast("long")))

    return EpochResult(outputs={"output": ctx.chunks(links, tally, count=CHUNKS, key="src")})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
