"""merge (SenderLog, ``tally: immediate``, ``shades: immediate``; stateless): the diamond's sink side.

Reads the epoch's block from ``tally``, then from ``shades`` (a fixed order), and puts each
shade beside its colour's count so far.
"""

from __future__ import annotations

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job


def compute(ctx: EpochContext) -> EpochResult:
    counts = ctx.read_input("tally")
    shades = ctx.read_input("shades")
    return EpochResult(outputs={"output": shades.join(counts, "colour").select("pos", "shade", "n")})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
