"""stats (EagerCheckpoint): per-query statistics, delivered exactly once per epoch.

The epoch's answers go to the query-statistics store (a SQL table, see
:mod:`falkirk.spark_jobs.figure1.query_store`) in one transaction that replaces the epoch, and to
a durable Delta output. The state, per user the number of queries answered so far, is
checkpointed durably every epoch, so a rollback never reaches back before the last epoch
this task finished.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from falkirk.spark_jobs.figure1.query_store import COLUMNS, QueryStatsStore
from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

STATE_SCHEMA = "user long, answered long"


def compute(ctx: EpochContext) -> EpochResult:
    answers = ctx.read_input("answers").select(*COLUMNS)
    delivered = [row.asDict() for row in answers.orderBy("query_id").collect()]  # a few hundred rows
    QueryStatsStore.for_dag(ctx.store.durable_uri, ctx.args.dag_id).deliver(ctx.epoch, ctx.args.incarnation, delivered)
    previous = ctx.previous_state()
    if previous is None:
        previous = ctx.spark.createDataFrame([], schema=STATE_SCHEMA)
    now = answers.groupBy("user").agg(F.count("*").alias("n"))
    state = previous.join(now, "user", "full_outer").select(
        "user", (F.coalesce("answered", F.lit(0)) + F.coalesce("n", F.lit(0))).cast("long").alias("answered"))
    return EpochResult(outputs={"output": answers}, state=state)


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
