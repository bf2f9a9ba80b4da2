"""join (SenderLog, ``customers: at_end``, ``clean: immediate``): each order with its customer's region.

A hash join: its state is the build side, every customer registered so far (kept in scratch
only); each epoch's orders probe it. Rebuilding the state replays every ``customers`` block,
and no ``clean`` block: the probe side is released epoch by epoch.
"""

from __future__ import annotations

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

STATE_SCHEMA = "customer string, region string"


def compute(ctx: EpochContext) -> EpochResult:
    known = ctx.previous_state()
    if known is None:
        known = ctx.spark.createDataFrame([], schema=STATE_SCHEMA)
    build = known.unionByName(ctx.read_input("customers").select("customer", "region"))
    matched = ctx.read_input("clean").join(build, "customer").select("order_id", "customer", "region", "amount")
    return EpochResult(outputs={"output": matched}, state=build)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
