"""palette: the diamond's source, a scan (:mod:`falkirk.spark_jobs.colours.scan`) of four colours an epoch."""

from falkirk.spark_jobs.colours.scan import compute
from falkirk.spark_jobs.runtime import run_job

__all__ = ["compute"]

if __name__ == "__main__":
    raise SystemExit(run_job(compute))
