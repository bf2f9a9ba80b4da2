"""rank (LazyCheckpoint every=3): incremental PageRank over the growing item graph.

Each epoch adds edges between the items a user clicked one after the other (weights
accumulate across epochs) and runs ITERATIONS PageRank steps starting from the previous
epoch's ranks. The state (edge weights and ranks) goes to scratch every epoch and to the
durable tier every third; the output (the ranks) to scratch.

Ranks are fixed-point integers (SCALE stands for 1.0): integer sums do not depend on the order in
which Spark adds them, so a re-run reproduces the failure-free ranks exactly.

The state is one table: edge rows (src, dst, weight) and rank rows (src = item, dst null,
rank).
"""

from __future__ import annotations

from pyspark.sql import Window
from pyspark.sql import functions as F

from falkirk.spark_jobs.figure1.data import ITEMS
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

ITERATIONS = 3  # per epoch; warm-started from the previous epoch's ranks, so they converge across epochs
SCALE = 1_000_000_000
DAMPING_PERCENT = 85
STATE_SCHEMA = "src long, dst long, weight long, rank long"


def compute(ctx: EpochContext) -> EpochResult:
    spark = ctx.spark
    events = ctx.read_input("events").where(F.col("clicks") > 0)
    order = Window.partitionBy("user").orderBy("item")
    new_edges = (events.withColumn("next", F.lead("item").over(order)).where(F.col("next").isNotNull())
                 .groupBy(F.col("item").alias("src"), F.col("next").alias("dst")).agg(F.count("*").alias("weight")))
    previous = ctx.previous_state()
    if previous is None:
        previous = spark.createDataFrame([], schema=STATE_SCHEMA)
    old_edges = previous.where(F.col("dst").isNotNull()).select("src", "dst", "weight")
    edges = old_edges.unionByName(new_edges).groupBy("src", "dst").agg(F.sum("weight").cast("long").alias("weight"))
    items = spark.range(ITEMS).select(F.col("id").alias("item"))
    start = F.lit(SCALE // ITEMS)
    ranks = items.join(previous.where(F.col("dst").isNull()).select(F.col("src").alias("item"), "rank"), "item", "left") \
        .select("item", F.coalesce("rank", start).cast("long").alias("rank"))
    out_weight = edges.groupBy("src").agg(F.sum("weight").alias("out"))
    links = ctx.cache(edges.join(out_weight, "src").select("src", "dst", "weight", "out"))
    teleport = F.lit((100 - DAMPING_PERCENT) * SCALE // (100 * ITEMS))
    for _ in range(ITERATIONS):
        flow = (links.join(ranks.withColumnRenamed("item", "src"), "src")
                .select("dst", F.expr("rank * weight div out").alias("share"))
                .groupBy("dst").agg(F.sum("share").cast("long").alias("inflow")))
        ranks = ctx.cache(items.join(flow.withColumnRenamed("dst", "item"), "item", "left")
                          .select("item", (teleport + F.expr(f"coalesce(inflow, 0) * {DAMPING_PERCENT} div 100"))
                                  .cast("long").alias("rank")))
    state = edges.select("src", "dst", "weight", F.lit(None).cast("long").alias("rank")).unionByName(
        ranks.select(F.col("item").alias("src"), F.lit(None).cast("long").alias("dst"),
                     F.lit(None).cast("long").alias("weight"), "rank"))
    return EpochResult(outputs={"output": ranks.withColumnRenamed("rank", "page_rank")}, state=state)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
