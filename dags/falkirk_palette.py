"""falkirk_palette: a diamond under sender-side logs (two paths from one source to one sink).

* ``palette``  Batch(log_outputs=True): four colours an epoch;
* ``tally``    SenderLog, ``palette: at_end``: how often each colour has been seen so far;
* ``shades``   SenderLog, ``palette: immediate``: each colour in capitals (stateless);
* ``merge``    SenderLog, ``tally: immediate``, ``shades: immediate``: each shade with its count.

Both paths from ``palette`` to ``merge`` have two edges: the graph is uniform, as the protocol's
slices need. ``palette``'s output is one log read by two tasks: it keeps each epoch until both
have released it (``shades`` at once, ``tally`` at the end, epoch 4). One DAG run is one epoch
(midnight UTC, from 2026-01-01).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EpochClock, Regime, SenderLog

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.colours"
END = 4
EDGES = [("palette", "tally"), ("palette", "shades"), ("tally", "merge"), ("shades", "merge")]


def regimes(end: int = END) -> dict[str, Regime]:
    """Each task's regime, upstream first."""
    return {"palette": Batch(log_outputs=True),
            "tally": SenderLog(release={"palette": "at_end"}, end=end),
            "shades": SenderLog(release={"palette": "immediate"}),
            "merge": SenderLog(release={"tally": "immediate", "shades": "immediate"})}


REGIMES = regimes()


def build_dag(dag_id: str = "falkirk_palette", end: int = END, conn_id: str = "spark_default",
              overrides: dict[str, Regime] | None = None) -> DAG:
    """The diamond under ``dag_id`` (copies live side by side, each with its own tables);
    ``overrides`` replaces the regime of some tasks."""
    with DAG(
        dag_id=dag_id,
        description="palette -> (tally, shades) -> merge: a diamond under sender-side logs",
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
