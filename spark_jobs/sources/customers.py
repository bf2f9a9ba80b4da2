"""customers (Batch): each epoch's count of customers per country, from a team's own Delta table.

The table is outside the Falkirk store (``FALKIRK_CUSTOMERS_TABLE``: a local path, ``s3://`` or
``s3a://``) and is read with Spark's Delta reader by :meth:`EpochContext.read_delta`, which
records in the epoch's ledger row the table's URI and the Delta version read: when the team
corrects the table later, a newer version than an epoch's tells which epochs read the old data.

    FALKIRK_CUSTOMERS_TABLE=s3://crm/customers  # the Spark server reaches it (Delta jars, s3a settings)
"""

from __future__ import annotations

import os

from pyspark.sql import functions as F

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, JobError, run_job

TABLE_ENV = "FALKIRK_CUSTOMERS_TABLE"


def compute(ctx: EpochContext) -> EpochResult:
    uri = os.environ.get(TABLE_ENV, "").strip()
    if not uri:
        raise JobError(f"{TABLE_ENV} is not set: name the customers' Delta table (a path, s3:// or s3a:// URI)")
    customers = ctx.read_delta(uri)
    return EpochResult(outputs={"output": customers.groupBy("country").agg(F.count("*").alias("customers"))})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
