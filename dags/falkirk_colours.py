"""falkirk_colours: the sender-side logs paper's three-way join (Smith & Watson, CS-TR-861 §5), under SenderLog.

* ``d1``, ``d2``, ``d3``  Batch(log_outputs=True): scans sending their datasets in blocks of
  four colours, one block per epoch (``d1`` in epochs 1-2, ``d2`` in 3-5, ``d3`` in 6-7);
* ``join1``  SenderLog, ``d1: at_end`` (its build side), ``d2: immediate`` (its probe side);
* ``join2``  SenderLog, ``join1: at_end``, ``d3: immediate``;
* ``result`` Batch(log_outputs=True): the answer, green x4, red and blue.

A join that loses its state while probing rebuilds it from the blocks of its build side, which
its producer retains until the execution ends (epoch 7); no probe block it has processed is
read again. One DAG run is one epoch (midnight UTC, from 2026-01-01).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EpochClock, Regime, SenderLog

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.colours"
END = 7
EDGES = [("d1", "join1"), ("d2", "join1"), ("join1", "join2"), ("d3", "join2"), ("join2", "result")]


def regimes(end: int = END) -> dict[str, Regime]:
    """Each task's regime, upstream first."""
    return {"d1": Batch(log_outputs=True), "d2": Batch(log_outputs=True), "d3": Batch(log_outputs=True),
            "join1": SenderLog(release={"d1": "at_end", "d2": "immediate"}, end=end),
            "join2": SenderLog(release={"join1": "at_end", "d3": "immediate"}, end=end),
            "result": Batch(log_outputs=True)}


REGIMES = regimes()


def build_dag(dag_id: str = "falkirk_colours", end: int = END, conn_id: str = "spark_default",
              overrides: dict[str, Regime] | None = None) -> DAG:
    """The query under ``dag_id`` (copies live side by side, each with its own tables);
    ``overrides`` replaces the regime of some tasks."""
    with DAG(
        dag_id=dag_id,
        description="d1 join d2 join d3 on colour, under sender-side logs (the P2 demonstration)",
        schedule=EpochTimetable(EPOCHS),
        start_date=EPOCHS.first,
        catchup=False,
        max_active_runs=1,
        tags=["falkirk"],
        default_args={"conn_id": conn_id, "retries": 1, "retry_delay": timedelta(seconds=3)},
        doc_md=__doc__,
    ) as dag:
        tasks = {t: RegimeSparkSubmitOperator(task_id=t, application=f"{JOBS}.{t}", regime=r)
                 for t, r in {**regimes(end), **(overrides or {})}.items()}
        for up, down in EDGES:
            tasks[up] >> tasks[down]
    return dag


dag = build_dag()
