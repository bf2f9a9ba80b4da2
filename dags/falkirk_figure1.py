"""falkirk_figure1: the reference application, one regime per part.

::

    events ──▶ popularity ──┐
    (Ephemeral)  (Batch, log) ├──▶ answers ──▶ stats
         └────▶ rank ────────┘   (Ephemeral)   (EagerCheckpoint → SQL table)
                (LazyCheckpoint every 3)

* ``events``: the epoch's clickstream, filtered, projected and pre-aggregated inside the
  ephemeral region (nothing durable; any epoch can be generated again);
* ``popularity``: item popularity over a window of epochs, recomputed each epoch with no
  state, its output logged: a firewall between the cheap region and the rest;
* ``rank``: incremental PageRank over the growing item graph, state in scratch every
  epoch and durable every third;
* ``answers``: the epoch's user queries joined with both;
* ``stats``: per-query statistics, delivered exactly once per epoch to a SQL table.

Stateful tasks run their epochs in order (``depends_on_past``), and so does popularity,
whose window reads earlier epochs of events. One DAG run is one epoch.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import EpochClock
from falkirk.spark_jobs.figure1 import EDGES, REGIMES

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.figure1"  # the jobs, found by package
# Tasks that read earlier epochs of an upstream task: their epochs run in order too, so the
# epochs they read have committed (DAG runs otherwise run side by side).
READS_PAST = {"popularity"}


def build_dag(dag_id: str = "falkirk_figure1", conn_id: str = "spark_default", queue: str = "default",
              env_vars: dict[str, str] | None = None) -> DAG:
    """The pipeline under ``dag_id`` (copies can live side by side, each with its own tables);
    ``queue``: the Celery queue its tasks ask for (a worker's name pins them to that worker);
    ``env_vars``: added to every job's environment."""
    with DAG(
        dag_id=dag_id,
        description="Clickstream -> popularity (batch) and PageRank (iterative) -> query answers -> statistics",
        schedule=EpochTimetable(EPOCHS),  # one run per epoch; off-grid triggers are refused
        start_date=EPOCHS.first,
        catchup=False,
        max_active_runs=8,
        tags=["falkirk"],
        default_args={"conn_id": conn_id, "retries": 0, "queue": queue},
        doc_md=__doc__,
    ) as dag:
        tasks = {task: RegimeSparkSubmitOperator(task_id=task, application=f"{JOBS}.{task}", regime=regime,
                                                 depends_on_past=regime.keeps_state or task in READS_PAST,
                                                 env_vars=env_vars)
                 for task, regime in REGIMES.items()}
        for up, down in EDGES:
            tasks[up] >> tasks[down]
    return dag


dag = build_dag()
