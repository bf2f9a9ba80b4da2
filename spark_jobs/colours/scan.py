"""A scan (Batch, logged; a graph source): the block of its dataset the epoch delivers.

The block depends on the task and the epoch alone, so a retry delivers the same rows.
"""

from __future__ import annotations

from falkirk.spark_jobs.colours import block
from falkirk.spark_jobs.runtime import EpochContext, EpochResult

SCHEMA = "colour string, pos string"


def compute(ctx: EpochContext) -> EpochResult:
    return EpochResult(outputs={"output": ctx.spark.createDataFrame(block(ctx.args.task_id, ctx.epoch),
                                                                    schema=SCHEMA)})
