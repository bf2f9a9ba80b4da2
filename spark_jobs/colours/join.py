"""A hash join on ``colour`` (SenderLog): its state is the build side received so far.

The build side is the input the regime releases ``at_end``, the probe side the one it releases
at once. Each epoch adds its build block to the state and probes the whole state with the
epoch's probe block. Rebuilding the state replays every build block and no probe block.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.policies.regimes import SenderLog
from falkirk.spark_jobs.colours.scan import SCHEMA
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, JobError


def compute(ctx: EpochContext) -> EpochResult:
    regime = ctx.args.regime
    if not isinstance(regime, SenderLog):
        raise JobError(f"{ctx.args.processor}: the join runs under SenderLog (its release policies pick the build "
                       f"side), not {regime.spec()}")
    policies = {u: p.name for u, p in regime.policies().items()}
    build_input = [u for u, p in policies.items() if p == "at_end"]
    probe_input = [u for u, p in policies.items() if p == "immediate"]
    if len(build_input) != 1 or len(probe_input) != 1:
        raise JobError(f"{ctx.args.processor}: a hash join releases one input at_end (its build side) and one "
                       f"immediate (its probe side); its release= says {policies}")
    known = ctx.previous_state()
    if known is None:
        known = ctx.spark.createDataFrame([], schema=SCHEMA)
    build = known.unionByName(ctx.read_input(build_input[0]).select("colour", "pos"))
    probe = ctx.read_input(probe_input[0]).select("colour", F.col("pos").alias("probe"))
    matched = probe.join(build, "colour").select("colour", F.concat_ws("+", "pos", "probe").alias("pos"))
    return EpochResult(outputs={"output": matched}, state=build)
