"""falkirk_shards: partitioned tasks, each partition recovered on its own.

* ``events``  Batch(log_outputs=True), 2 partitions: the epoch's purchases per source partition;
* ``totals``  LazyCheckpoint(every=4), 4 partitions behind a repartitioning edge (by user):
  running totals per user, each partition its own state;
* ``leaders`` Batch(log_outputs=True), 4 partitions, one-to-one with ``totals``: each
  partition's top two users;
* ``report``  Batch(log_outputs=True): the top three users, gathered from every partition.

A failed partition re-runs alone, with what reads it; the other partitions keep their
epochs and their state. One DAG run is one epoch (midnight UTC, from 2026-01-01).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EpochClock, LazyCheckpoint

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.shards"
# task: (regime, partitions)
TASKS = {"events": (Batch(log_outputs=True), 2), "totals": (LazyCheckpoint(every=4), 4),
         "leaders": (Batch(log_outputs=True), 4), "report": (Batch(log_outputs=True), None)}
# What a run without Airflow needs (python -m devstack.inprocess dags/falkirk_shards.py ...).
REGIMES = {task: regime for task, (regime, _) in TASKS.items()}
PARTITIONS = {task: n for task, (_, n) in TASKS.items() if n}
EDGES = list(zip(TASKS, list(TASKS)[1:]))


def build_dag(dag_id: str = "falkirk_shards", conn_id: str = "spark_default") -> DAG:
    """The pipeline under ``dag_id`` (several copies can live side by side, each with its own tables)."""
    with DAG(
        dag_id=dag_id,
        description="Purchases -> running totals per user (4 partitions) -> leaders per partition -> top users",
        schedule=EpochTimetable(EPOCHS),
        start_date=EPOCHS.first,
        catchup=False,
        max_active_runs=8,
        tags=["falkirk"],
        default_args={"conn_id": conn_id, "retries": 0},
        doc_md=__doc__,
    ) as dag:
        tasks = []
        for task, (regime, partitions) in TASKS.items():
            if partitions is None:
                tasks.append(RegimeSparkSubmitOperator(task_id=task, application=f"{JOBS}.{task}", regime=regime))
            else:
                tasks.append(RegimeSparkSubmitOperator.partial(task_id=task, application=f"{JOBS}.{task}",
                                                               regime=regime).expand(partition=range(partitions)))
        for up, down in zip(tasks, tasks[1:]):
            up >> down
    return dag


dag = build_dag()
