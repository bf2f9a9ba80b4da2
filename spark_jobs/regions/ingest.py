"""ingest (Batch, logged): the epoch's orders, as the source delivers them (invalid ones too).

Its output is the log ``clean`` replays: each epoch is kept until ``clean`` has released it.
"""

from __future__ import annotations

from falkirk.spark_jobs.pipeline.source import orders_for_epoch
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

SCHEMA = "order_id long, customer string, amount long"


def compute(ctx: EpochContext) -> EpochResult:
    return EpochResult(outputs={"output": ctx.spark.createDataFrame(orders_for_epoch(ctx.epoch), schema=SCHEMA)})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
