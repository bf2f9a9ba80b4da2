"""join2: a hash join of the demonstration (:mod:`falkirk.spark_jobs.colours.join`)."""

from falkirk.spark_jobs.colours.join import compute
from falkirk.spark_jobs.runtime import run_job

__all__ = ["compute"]

if __name__ == "__main__":
    raise SystemExit(run_job(compute))
