"""The TaskFlow form of ``make bench-overhead``'s Falkirk DAG: the same job, written inline as one
``@falkirk_task`` per regime, one after another, on the worker's job host."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from benchmarks.overhead_job import compute
from falkirk.plugins.taskflow import falkirk_task
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, EpochClock, LazyCheckpoint

# As bench_overhead.py's (not imported from it: a task loads this file alone, as a team's would be)
EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
REGIMES = {"ephemeral": Ephemeral(), "batch": Batch(log_outputs=True), "lazy": LazyCheckpoint(every=10),
           "eager": EagerCheckpoint()}
COMMON = dict(schedule=EpochTimetable(EPOCHS), start_date=EPOCHS.first, catchup=False, max_active_runs=1,
              default_args={"conn_id": "spark_default", "retries": 0})


@falkirk_task(regime=REGIMES["ephemeral"])
def ephemeral(ctx):
    return compute(ctx)


@falkirk_task(regime=REGIMES["batch"])
def batch(ctx):
    return compute(ctx)


@falkirk_task(regime=REGIMES["lazy"])
def lazy(ctx):
    return compute(ctx)


@falkirk_task(regime=REGIMES["eager"])
def eager(ctx):
    return compute(ctx)


with DAG(dag_id="bench_taskflow", **COMMON):
    ephemeral() >> batch() >> lazy() >> eager()
