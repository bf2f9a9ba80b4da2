"""falkirk_loops: long epochs that checkpoint inside themselves.

* ``links``  Batch(log_outputs=True): the epoch's new links between pages;
* ``rank``   LazyCheckpoint(every=2): PageRank, 30 iterations per epoch, checkpointed every
  5 at lex times (epoch, iteration);
* ``tally``  Batch(log_outputs=True): the epoch's links worked out in 6 chunks, each chunk's
  result checkpointed at (epoch, chunk).

A task instance that dies inside an epoch is retried by Airflow (one retry, after a few
seconds), and the retry resumes after the last checkpoint, not at the epoch's start. One DAG
run is one epoch (midnight UTC, from 2026-01-01).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EpochClock, LazyCheckpoint

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.loops"
REGIMES = {"links": Batch(log_outputs=True), "rank": LazyCheckpoint(every=2), "tally": Batch(log_outputs=True)}
EDGES = [("links", "rank"), ("links", "tally")]


def build_dag(dag_id: str = "falkirk_loops", conn_id: str = "spark_default") -> DAG:
    """The pipeline under ``dag_id`` (several copies can live side by side, each with its own tables)."""
    with DAG(
        dag_id=dag_id,
        description="Links -> PageRank in checkpointed iterations, and a tally in checkpointed chunks",
        schedule=EpochTimetable(EPOCHS),
        start_date=EPOCHS.first,
        catchup=False,
        max_active_runs=4,
        tags=["falkirk"],
        default_args={"conn_id": conn_id, "retries": 1, "retry_delay": timedelta(seconds=3)},
        doc_md=__doc__,
    ) as dag:
        tasks = {t: RegimeSparkSubmitOperator(task_id=t, application=f"{JOBS}.{t}", regime=r)
                 for t, r in REGIMES.items()}
        for up, down in EDGES:
            tasks[up] >> tasks[down]
    return dag


dag = build_dag()
