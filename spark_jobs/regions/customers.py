"""customers (Batch, logged): the customers that register in the epoch, with their region.

``join`` keeps every customer seen so far (its hash table), so it releases none of these
blocks before the execution ends: they stay in this task's log until then.
"""

from __future__ import annotations

from falkirk.spark_jobs.regions import customers_for_epoch
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

SCHEMA = "customer string, region string"


def compute(ctx: EpochContext) -> EpochResult:
    return EpochResult(outputs={"output": ctx.spark.createDataFrame(customers_for_epoch(ctx.epoch), schema=SCHEMA)})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
