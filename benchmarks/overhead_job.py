"""The small job of ``make bench-overhead``: one epoch's word counts over a few thousand rows.

The plain Airflow task of the benchmark does the same work with a Spark Connect session of its
own and writes the counts to a Delta table (:func:`count_words`, :func:`write_plain`); the
Falkirk tasks run this file under each regime and commit through the runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

WORDS = ("spark", "airflow", "delta", "epoch", "frontier", "ledger", "regime", "worker")
ROWS = 2_000


def count_words(spark: "SparkSession", epoch: int) -> "DataFrame":
    """The epoch's word counts: ``ROWS`` words drawn deterministically from ``WORDS``."""
    from pyspark.sql import functions as F

    lines = spark.range(ROWS).select(
        F.lit(epoch).cast("long").alias("epoch"),
        F.element_at(F.array(*[F.lit(w) for w in WORDS]),
                     (F.pmod(F.col("id") * 7 + F.lit(epoch), F.lit(len(WORDS))) + 1).cast("int")).alias("word"))
    return lines.groupBy("epoch", "word").agg(F.count("*").alias("n"))


def write_plain(counts: "DataFrame", uri: str) -> int:
    """What a plain task does with its result: collect it and append it to a Delta table."""
    from deltalake import write_deltalake

    table = counts.toArrow()
    write_deltalake(uri, table, mode="append")
    return table.num_rows


def compute(ctx: EpochContext) -> EpochResult:
    counts = count_words(ctx.spark, ctx.epoch)
    state = counts if ctx.args.regime.keeps_state else None
    return EpochResult(outputs={"output": counts}, state=state)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
