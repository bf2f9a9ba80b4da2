"""The benchmark's iterative job (:mod:`benchmarks.steps_bench`): PageRank over a fixed graph.

``BENCH_PAGES`` pages with ten links each, ``BENCH_ITERATIONS`` iterations, a checkpoint
inside the epoch every ``BENCH_EVERY`` iterations (more than the iterations: none); Spark's
lineage is cut every ``BENCH_CUT`` iterations either way (``localCheckpoint()`` where no
checkpoint does it).
"""

from __future__ import annotations

import os

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

SCALE = 1_000_000_000


def compute(ctx: EpochContext) -> EpochResult:
    pages_n, iterations = int(os.environ["BENCH_PAGES"]), int(os.environ["BENCH_ITERATIONS"])
    every, cut = int(os.environ["BENCH_EVERY"]), int(os.environ["BENCH_CUT"])
    spark = ctx.spark
    pages = spark.range(pages_n).select(F.col("id").alias("page")).cache()
    links = (spark.range(pages_n * 10).select((F.col("id") % pages_n).alias("src"),
                                               ((F.col("id") * 7919 + ctx.epoch) % pages_n).alias("dst"))
             .withColumn("out", F.lit(10)).cache())
    start = pages.select("page", F.lit(SCALE // pages_n).cast("long").alias("rank"))

    def step(ranks: DataFrame, i: int) -> DataFrame:
        flow = (links.join(ranks.withColumnRenamed("page", "src"), "src")
                .select("dst", F.expr("rank div out").alias("share"))
                .groupBy("dst").agg(F.sum("share").cast("long").alias("inflow")))
        out = (pages.join(flow.withColumnRenamed("dst", "page"), "page", "left")
               .select("page", (F.lit(15 * SCALE // (100 * pages_n)) + F.expr("coalesce(inflow, 0) * 85 div 100"))
                       .cast("long").alias("rank")))
        if every > iterations and i % cut == 0:  # no checkpoint inside the epoch: cut the lineage all the same
            out = out.localCheckpoint()
        return out

    ranks = ctx.iterate(step, start, times=iterations, checkpoint_every=every)
    return EpochResult(outputs={"output": ranks})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
