"""falkirk_regions: orders by region under sender-side logs, with no state checkpoint anywhere.

* ``ingest``, ``customers``  Batch(log_outputs=True): the sources; their outputs are the logs
  the tasks below replay, each epoch kept until its readers have released it;
* ``clean``   SenderLog, ``ingest: immediate``: drops invalid orders (stateless);
* ``join``    SenderLog, ``customers: at_end``, ``clean: immediate``: a hash join whose build
  side, every customer registered so far, is its state;
* ``total``   SenderLog, ``join: at_end``: running totals per region;
* ``report``  Batch(log_outputs=True): the ranking, the pipeline's sink.

The SenderLog tasks keep their state in the scratch tier only. When it is lost (the worker, or
its scratch directory), the next epoch rebuilds it by running the job again over the blocks
its producers retain: ``join`` replays every ``customers`` epoch and no ``clean`` one, ``total``
every ``join`` epoch. The execution ends with epoch ``END`` (``FALKIRK_REGIONS_END``, default
10): then the ``at_end`` inputs are released, and their logs are pruned. One DAG run is one epoch (midnight UTC, from 2026-01-01).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EpochClock, Regime, SenderLog

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.regions"
END_ENV = "FALKIRK_REGIONS_END"


def _end() -> int:
    text = os.environ.get(END_ENV, "10")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{END_ENV}={text!r}: give the execution's last epoch, a whole number >= 1")
    return int(text)


END = _end()
EDGES = [("ingest", "clean"), ("clean", "join"), ("customers", "join"), ("join", "total"), ("total", "report")]


def regimes(end: int = END) -> dict[str, Regime]:
    """Each task's regime, upstream first, for an execution that ends with epoch ``end``."""
    return {"ingest": Batch(log_outputs=True), "customers": Batch(log_outputs=True),
            "clean": SenderLog(release={"ingest": "immediate"}),
            "join": SenderLog(release={"customers": "at_end", "clean": "immediate"}, end=end),
            "total": SenderLog(release={"join": "at_end"}, end=end),
            "report": Batch(log_outputs=True)}


REGIMES = regimes()


def build_dag(dag_id: str = "falkirk_regions", end: int = END, conn_id: str = "spark_default",
              overrides: dict[str, Regime] | None = None, orders: int | None = None) -> DAG:
    """The pipeline under ``dag_id`` (several copies can live side by side, each with its own
    tables); ``overrides`` replaces the regime of some tasks, ``orders`` sets the orders per epoch."""
    with DAG(
        dag_id=dag_id,
        description="Orders -> clean -> join with customers -> totals per region -> ranking, under sender-side logs",
        schedule=EpochTimetable(EPOCHS),
        start_date=EPOCHS.first,
        catchup=False,
        max_active_runs=1,
        tags=["falkirk"],
        default_args={"conn_id": conn_id, "retries": 1, "retry_delay": timedelta(seconds=3)},
        doc_md=__doc__,
    ) as dag:
        size = {"env_vars": {"FALKIRK_REGIONS_ORDERS": str(orders)}} if orders else {}
        tasks = {t: RegimeSparkSubmitOperator(task_id=t, application=f"{JOBS}.{t}", regime=r,
                                              **(size if t == "ingest" else {}))
                 for t, r in {**regimes(end), **(overrides or {})}.items()}
        for up, down in EDGES:
            tasks[up] >> tasks[down]
    return dag


dag = build_dag()
