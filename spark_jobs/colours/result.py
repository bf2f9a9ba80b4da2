"""result (Batch, logged): the query's answer, the pipeline's sink."""

from __future__ import annotations

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job


def compute(ctx: EpochContext) -> EpochResult:
    return EpochResult(outputs={"output": ctx.read_input("join2").select("colour", "pos")})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
