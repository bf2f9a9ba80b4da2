"""events (Ephemeral): the epoch's raw clickstream, reduced before it leaves the region.

Bots and views shorter than two seconds are dropped, only (user, item) is kept, and the
events are pre-aggregated per (user, item): tens of thousands of records become a few
thousand rows. Nothing is durable; after a loss the epoch is read from the source again.

Before reading, the task acknowledges to the source every epoch the region has passed:
those inside its low-watermark over the durable checkpoints (see ``source.py``).
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.policies.planning.monitor import acknowledged_inputs
from falkirk.policies.store.readability import StoreReadability, durable_only
from falkirk.spark_jobs.figure1 import GRAPH
from falkirk.spark_jobs.figure1.source import ClickstreamSource
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

MIN_DWELL_MS = 2_000


def compute(ctx: EpochContext) -> EpochResult:
    source = ClickstreamSource.for_dag(ctx.store.durable_uri, ctx.args.dag_id)
    readable = durable_only(StoreReadability(ctx.store), ctx.store.scratch_uri)
    acknowledged = acknowledged_inputs(ctx.ledger.entries(ctx.args.dag_id), readable, GRAPH)
    source.acknowledge(acknowledged.get(ctx.args.processor, 0))
    raw = source.read(ctx.spark, ctx.epoch)
    kept = raw.where((F.col("kind") != "bot") & (F.col("dwell_ms") >= MIN_DWELL_MS))
    reduced = kept.groupBy("user", "item").agg(
        F.count("*").alias("events"),
        F.sum(F.when(F.col("kind") == "click", 1).otherwise(0)).cast("long").alias("clicks"))
    return EpochResult(outputs={"output": reduced})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
