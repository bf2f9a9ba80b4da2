"""source (Ephemeral): this epoch's click events, as delivered; nothing durable.

Its output goes to scratch: after a loss the epoch is read again from the inbox.
"""

from __future__ import annotations

from falkirk.spark_jobs.clicks.feed import read_batch
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

SCHEMA = "event_id long, item string, qty long"


def compute(ctx: EpochContext) -> EpochResult:
    rows = read_batch(ctx.args.dag_id, ctx.epoch)
    return EpochResult(outputs={"output": ctx.spark.createDataFrame(rows, schema=SCHEMA)})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
