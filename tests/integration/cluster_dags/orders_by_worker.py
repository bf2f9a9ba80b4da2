"""Airflow DAG file for the distributed shape's test: falkirk_orders twice, each copy's tasks on
one Celery worker's queue (``orders_on_a`` on worker-a, ``orders_on_b`` on worker-b)."""

from __future__ import annotations

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, EpochClock

from datetime import datetime, timedelta, timezone

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.pipeline"

for worker in ("a", "b"):
    with DAG(dag_id=f"orders_on_{worker}", schedule=EpochTimetable(EPOCHS), start_date=EPOCHS.first,
             catchup=False, tags=["falkirk"], default_args={"queue": f"worker-{worker}", "retries": 0}) as dag:
        ingest = RegimeSparkSubmitOperator(task_id="ingest", application=f"{JOBS}.ingest", regime=Ephemeral())
        aggregate = RegimeSparkSubmitOperator(task_id="aggregate", application=f"{JOBS}.aggregate",
                                              regime=EagerCheckpoint())
        publish = RegimeSparkSubmitOperator(task_id="publish", application=f"{JOBS}.publish",
                                            regime=Batch(log_outputs=True))
        ingest >> aggregate >> publish
    globals()[dag.dag_id] = dag
