"""The DAGs of ``make bench-overhead``: the same small Spark job as a plain Airflow task and as a
Falkirk task under each regime, on the job host and (``*_cold``) in a fresh interpreter."""

from __future__ import annotations

import importlib.util
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow.sdk import DAG, task

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, EpochClock, LazyCheckpoint

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOB = "benchmarks.overhead_job"
REGIMES = {"ephemeral": Ephemeral(), "batch": Batch(log_outputs=True), "lazy": LazyCheckpoint(every=10),
           "eager": EagerCheckpoint()}
COMMON = dict(schedule=EpochTimetable(EPOCHS), start_date=EPOCHS.first, catchup=False, max_active_runs=1,
              default_args={"conn_id": "spark_default", "retries": 0})

with DAG(dag_id="bench_plain", **COMMON):

    @task
    def plain(logical_date=None) -> int:
        """The same work as a plain Airflow task: its own Spark Connect session, a Delta append."""
        from pyspark.sql import SparkSession

        from benchmarks.overhead_job import count_words, write_plain

        spark = SparkSession.builder.remote(os.environ["FALKIRK_BENCH_REMOTE"]).getOrCreate()
        try:
            rows = write_plain(count_words(spark, EPOCHS.epoch_of(logical_date)),
                               os.path.join(os.environ["FALKIRK_BENCH_PLAIN"], "counts"))
        finally:
            spark.stop()
        return rows

    plain()

for suffix, env in (("", {}), ("_cold", {"FALKIRK_JOB_HOST": "off"})):
    with DAG(dag_id=f"bench_falkirk{suffix}", **COMMON):
        # One after another, as the plain task runs alone: no task instance shares the cores.
        tasks = [RegimeSparkSubmitOperator(task_id=name, application=JOB, regime=regime, env_vars=env)
                 for name, regime in REGIMES.items()]
        for before, after in zip(tasks, tasks[1:]):
            before >> after


# The reference application (dags/falkirk_figure1.py), an epoch of five task instances, with and
# without the job host.
_spec = importlib.util.spec_from_file_location("falkirk_figure1_dag",
                                               Path(__file__).resolve().parents[2] / "dags" / "falkirk_figure1.py")
assert _spec is not None and _spec.loader is not None
_figure1 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_figure1)
figure1 = _figure1.build_dag("bench_figure1")
figure1_cold = _figure1.build_dag("bench_figure1_cold", env_vars={"FALKIRK_JOB_HOST": "off"})
