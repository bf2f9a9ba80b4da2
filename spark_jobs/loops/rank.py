"""rank (LazyCheckpoint every=2): PageRank over the growing link graph, ITERATIONS steps per
epoch from the previous epoch's ranks, checkpointed every CHECKPOINT_EVERY iterations.

An attempt that dies at iteration 23 of 30 resumes at iteration 20 (``ctx.iterate``), not at
the epoch's start. Ranks are fixed-point integers (SCALE stands for 1.0): integer sums do not
depend on the order Spark adds them in, so a resumed run equals an uninterrupted one exactly.

The state is one table: link rows (src, dst, weight) and rank rows (src = page, dst null, rank).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from falkirk.spark_jobs.loops.links import PAGES
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

ITERATIONS = 30
CHECKPOINT_EVERY = 5
SCALE = 1_000_000_000
DAMPING_PERCENT = 85
STATE_SCHEMA = "src long, dst long, weight long, rank long"


def compute(ctx: EpochContext) -> EpochResult:
    spark = ctx.spark
    previous = ctx.previous_state()
    if previous is None:
        previous = spark.createDataFrame([], schema=STATE_SCHEMA)
    new = ctx.read_input("links").groupBy("src", "dst").agg(F.count("*").alias("weight"))
    edges = (previous.where(F.col("dst").isNotNull()).select("src", "dst", "weight").unionByName(new)
             .groupBy("src", "dst").agg(F.sum("weight").cast("long").alias("weight")))
    pages = spark.range(PAGES).select(F.col("id").alias("page"))
    start = (pages.join(previous.where(F.col("dst").isNull()).select(F.col("src").alias("page"), "rank"), "page", "left")
             .select("page", F.coalesce("rank", F.lit(SCALE // PAGES)).cast("long").alias("rank")))
    out = edges.groupBy("src").agg(F.sum("weight").alias("out"))
    links = ctx.cache(edges.join(out, "src").select("src", "dst", "weight", "out"))
    teleport = F.lit((100 - DAMPING_PERCENT) * SCALE // (100 * PAGES))

    def step(ranks: DataFrame, _: int) -> DataFrame:
        flow = (links.join(ranks.withColumnRenamed("page", "src"), "src")
                .select("dst", F.expr("rank * weight div out").alias("share"))
                .groupBy("dst").agg(F.sum("share").cast("long").alias("inflow")))
        return (pages.join(flow.withColumnRenamed("dst", "page"), "page", "left")
                .select("page", (teleport + F.expr(f"coalesce(inflow, 0) * {DAMPING_PERCENT} div 100"))
                        .cast("long").alias("rank")))

    ranks = ctx.iterate(step, start, times=ITERATIONS, checkpoint_every=CHECKPOINT_EVERY)
    state = edges.select("src", "dst", "weight", F.lit(None).cast("long").alias("rank")).unionByName(
        ranks.select(F.col("page").alias("src"), F.lit(None).cast("long").alias("dst"),
                     F.lit(None).cast("long").alias("weight"), "rank"))
    return EpochResult(outputs={"output": ranks}, state=state)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
