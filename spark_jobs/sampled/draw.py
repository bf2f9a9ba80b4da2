"""draw (Batch, logged; non-deterministic): sample the epoch's keys chunk by chunk and stream
each chunk to ``deliver`` as it is drawn (see :mod:`falkirk.spark_jobs.sampled`).

An attempt that dies mid-epoch is retried; the retry reads back the chunks already
checkpointed (their determinants) instead of drawing them again, withdraws from the edge the
rows of the chunk it was drawing, and draws the rest.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from falkirk.spark_jobs.marker_edge import MarkerEdge
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job
from falkirk.spark_jobs.sampled import CHUNKS, KEYS_PER_CHUNK, edge_tables, markers

SCHEMA = "key string, value long, chunk long"


def compute(ctx: EpochContext) -> EpochResult:
    tables = edge_tables(ctx.store, ctx.args.dag_id)
    edge = MarkerEdge(tables, ctx.epoch, CHUNKS, markers())
    keys = ctx.spark.range(KEYS_PER_CHUNK * CHUNKS).select(
        F.concat_ws("-", F.lit(str(ctx.epoch)), F.col("id").cast("string")).alias("key"), "id")

    def draw(chunk: DataFrame, i: int) -> DataFrame:
        sample = chunk.sample(fraction=0.5).select(
            "key", (F.col("id") * 1000 + F.floor(F.rand() * 1000)).cast("long").alias("value"))
        rows = sample.toArrow().to_pylist()  # drawn once: evaluating `sample` again would draw other rows
        edge.send(i, rows)  # in band as soon as drawn, before the chunk is saved
        return ctx.spark.createDataFrame([(r["key"], r["value"], i) for r in rows], SCHEMA)

    # The edge is named in the ledger row: if deliver ran this epoch on another worker (it clears
    # the edge on its own disk), garbage collection empties it here once deliver committed.
    return EpochResult(outputs={"output": ctx.chunks(keys, draw, count=CHUNKS, key="key", observer=edge)},
                       channels=(tables.edge, tables.control))


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
