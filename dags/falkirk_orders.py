"""falkirk_orders: the first Falkirk pipeline, ingest -> aggregate -> publish.

Each DAG run is one epoch (see ``EPOCHS``); each task is a Spark job run through the
``spark_default`` connection and tagged with a fault-tolerance regime:

* ``ingest``    Ephemeral: reads the epoch's orders from the source, keeps nothing durable;
* ``aggregate`` EagerCheckpoint: running totals per customer, state and output durable every epoch;
* ``publish``   Batch(log_outputs=True): the epoch's ranking, logged durably, and the Asset
  ``falkirk_orders.ranking``: each committed epoch is an asset event whose extra names the
  epoch, its incarnation (a recovery's redo is a replacement) and the table's Delta version,
  and whose partition key is the epoch's date: ``falkirk_orders_leaders`` runs on it.

Trigger a run with a logical date on the epoch grid (midnight UTC, from 2026-01-01): the next
epoch after the latest run (``falkirk trigger --dag falkirk_orders`` picks it). A backfill needs
``--reprocess-behavior none``: aggregate depends on its past.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, Asset

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, EpochClock

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.pipeline"  # the jobs, found by package
RANKING = Asset("falkirk_orders.ranking")  # a DAG scheduled on it runs on each committed epoch

with DAG(
    dag_id="falkirk_orders",
    description="Orders -> running totals per customer -> ranking, one epoch per run",
    schedule=EpochTimetable(EPOCHS),  # one run per epoch; off-grid triggers are refused
    start_date=EPOCHS.first,
    catchup=False,
    max_active_runs=1,  # epochs run in logical-date order: aggregate's state flows from one to the next
    tags=["falkirk"],
    default_args={"conn_id": "spark_default", "retries": 0},
    doc_md=__doc__,
) as dag:
    ingest = RegimeSparkSubmitOperator(
        task_id="ingest", application=f"{JOBS}.ingest", regime=Ephemeral()
    )
    aggregate = RegimeSparkSubmitOperator(
        task_id="aggregate",
        application=f"{JOBS}.aggregate",
        regime=EagerCheckpoint(),  # keeps state: its epochs run in order (depends_on_past)
    )
    publish = RegimeSparkSubmitOperator(
        task_id="publish", application=f"{JOBS}.publish", regime=Batch(log_outputs=True),
        outlets=[RANKING], partition_outlets=True,  # one run of falkirk_orders_leaders per epoch
    )
    ingest >> aggregate >> publish

# What a run without Airflow needs (devstack.inprocess).
REGIMES = {task.task_id: task.regime for task in (ingest, aggregate, publish)}
EDGES = [("ingest", "aggregate"), ("aggregate", "publish")]
