"""falkirk_clicks: the four regimes in one pipeline, source -> clean -> model -> sink.

* ``source`` Ephemeral: the epoch's click events from the inbox, kept in scratch only;
* ``clean``  Batch(log_outputs=True): valid events, logged durably;
* ``model``  LazyCheckpoint(every=3): running totals per item, durable every third epoch;
* ``sink``   EagerCheckpoint: the epoch's top items, published exactly once.

The stateful tasks run their epochs in order (``depends_on_past``), so after
``falkirk replay`` Airflow re-runs them oldest first; the stateless ones may run any
epoch at any time. One DAG run is one epoch (midnight UTC, from 2026-01-01).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, EpochClock, LazyCheckpoint

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.clicks"  # the jobs, found by package
REGIMES = {"source": Ephemeral(), "clean": Batch(log_outputs=True), "model": LazyCheckpoint(every=3),
           "sink": EagerCheckpoint()}


def build_dag(dag_id: str = "falkirk_clicks", conn_id: str = "spark_default") -> DAG:
    """The pipeline under ``dag_id`` (several copies can live side by side, each with its own tables)."""
    with DAG(
        dag_id=dag_id,
        description="Click events -> valid events -> running totals per item -> top items, one epoch per run",
        schedule=EpochTimetable(EPOCHS),  # one run per epoch; off-grid triggers are refused
        start_date=EPOCHS.first,
        catchup=False,
        max_active_runs=8,
        tags=["falkirk"],
        default_args={"conn_id": conn_id, "retries": 0},
        doc_md=__doc__,
    ) as dag:
        tasks = [
            RegimeSparkSubmitOperator(task_id=task, application=f"{JOBS}.{task}", regime=regime)
            for task, regime in REGIMES.items()
        ]
        for up, down in zip(tasks, tasks[1:]):
            up >> down
    return dag


dag = build_dag()
