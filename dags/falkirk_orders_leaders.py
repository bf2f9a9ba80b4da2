"""falkirk_orders_leaders: a DAG that runs on ``falkirk_orders``' committed epochs.

It is scheduled on the Asset ``falkirk_orders.ranking``, which ``falkirk_orders``' ``publish``
updates with each committed epoch. Its events carry the epoch's logical date as their partition
key (``partition_outlets=True``), so this DAG gets one run per producer epoch, on the same epoch
clock:

* ``leaders`` EagerCheckpoint: per customer, the epochs spent in the ranking's top three.

Its ledger rows record which epoch of ``falkirk_orders.publish``, and which incarnation of it,
each run read: a recovery in ``falkirk_orders`` that redoes an epoch shows which of these
checkpoints it left stale.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, Asset, PartitionedAssetTimetable

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.policies import EagerCheckpoint, EpochClock

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))  # falkirk_orders'
RANKING = "falkirk_orders.ranking"
# What a run without Airflow needs (devstack.inprocess, given the epochs of RANKING it consumes).
REGIMES = {"leaders": EagerCheckpoint()}
EDGES: list[tuple[str, str]] = []

with DAG(
    dag_id="falkirk_orders_leaders",
    description="Customers in the top three of falkirk_orders' ranking, one run per ranking epoch",
    schedule=PartitionedAssetTimetable(assets=Asset(RANKING)),
    start_date=EPOCHS.first,
    catchup=False,
    max_active_runs=1,  # leaders keeps state: one epoch after the other
    tags=["falkirk"],
    default_args={"conn_id": "spark_default", "retries": 0},
    doc_md=__doc__,
) as dag:
    RegimeSparkSubmitOperator(
        task_id="leaders", application="falkirk.spark_jobs.pipeline.leaders", regime=REGIMES["leaders"],
        epoch_clock=EPOCHS,
    )
