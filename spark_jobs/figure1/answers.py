"""answers (Ephemeral): the epoch's user queries answered from the batch and iterative outputs.

Each query asks about an item; the answer joins the item's popularity (from the logged
batch output) and its PageRank (from the iterative task's output). Nothing is durable:
the answers are delivered by ``stats``.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.spark_jobs.figure1.data import queries
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job


def compute(ctx: EpochContext) -> EpochResult:
    asked = queries(ctx.spark, ctx.epoch)
    popularity = ctx.read_input("popularity").select("item", "clicks", "popularity_rank")
    ranks = ctx.read_input("rank").select("item", "page_rank")
    answered = (asked.join(popularity, "item", "left").join(ranks, "item", "left")
                .select("query_id", "user", "item",
                        F.coalesce("clicks", F.lit(0)).cast("long").alias("clicks"),
                        F.coalesce("popularity_rank", F.lit(0)).cast("long").alias("popularity_rank"),
                        F.coalesce("page_rank", F.lit(0)).cast("long").alias("page_rank")))
    return EpochResult(outputs={"output": answered})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
