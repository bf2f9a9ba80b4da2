"""falkirk_sampled: a non-deterministic producer and an exactly-once sink, side by side.

* ``draw``     Batch(log_outputs=True), ``deterministic=False``: samples each epoch's keys in
  4 chunks (no seed: a re-run draws other rows), checkpoints each chunk durably (the log of
  its determinants) and streams it to ``deliver`` over an edge with marker pairs;
* ``deliver``  LazyCheckpoint(every=2), ``concurrent_inputs=["draw"]``: commits the rows to
  the SQL table ``samples`` (``FALKIRK_QUERY_DB``) and the Delta table ``delivered`` in
  transactions of at most 8 rows, each as soon as the rows' determinants are saved, while
  ``draw`` is still drawing.

The two tasks have no Airflow edge: a DAG run starts both, and the ledger records that
``deliver`` read ``draw`` (so a recovery knows). ``build_dag`` also builds the two negative
controls the tests run: ``markers="slow"`` (slow travellers only: the sink stalls) and
``deterministic=True`` (``draw`` treated as deterministic, its output in scratch: a recovery
draws again and re-delivers other rows). One DAG run is one epoch (midnight UTC, from
2026-01-01).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EpochClock, LazyCheckpoint

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.sampled"


def build_dag(dag_id: str = "falkirk_sampled", conn_id: str = "spark_default", markers: str = "pairs",
              capacity: int = 8, deterministic: bool = False) -> DAG:
    """The pipeline under ``dag_id`` (several copies can live side by side, each with its own tables)."""
    env = {"FALKIRK_SAMPLED_MARKERS": markers, "FALKIRK_SAMPLED_CAPACITY": str(capacity)}
    with DAG(
        dag_id=dag_id,
        description="Sampled rows delivered exactly once, in small transactions, while they are drawn",
        schedule=EpochTimetable(EPOCHS),
        start_date=EPOCHS.first,
        catchup=False,
        max_active_runs=1,
        tags=["falkirk"],
        default_args={"conn_id": conn_id, "retries": 1, "retry_delay": timedelta(seconds=3)},
        doc_md=__doc__,
    ) as dag:
        RegimeSparkSubmitOperator(task_id="draw", application=f"{JOBS}.draw", env_vars=env,
                                  regime=Batch(log_outputs=not deterministic), deterministic=deterministic)
        RegimeSparkSubmitOperator(task_id="deliver", application=f"{JOBS}.deliver", env_vars=env,
                                  regime=LazyCheckpoint(every=2), concurrent_inputs=["draw"])
    return dag


dag = build_dag()
