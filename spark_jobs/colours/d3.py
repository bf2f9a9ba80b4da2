"""d3: a scan of the demonstration's dataset d3 (:mod:`falkirk.spark_jobs.colours.scan`)."""

from falkirk.spark_jobs.colours.scan import compute
from falkirk.spark_jobs.runtime import run_job

__all__ = ["compute"]

if __name__ == "__main__":
    raise SystemExit(run_job(compute))
