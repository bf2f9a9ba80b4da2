"""falkirk_readings: meter readings from an inbox, running totals to an outbox (Falkirk Wheel §4.2-4.3: input and output acknowledgement).

::

    intake ──▶ tally ──▶ deliver ──▶ outbox (accepted by receipt)
    (Ephemeral) (LazyCheckpoint every 1, output logged) (Ephemeral, external output)

* ``intake`` reads the epoch's batch from the inbox and drops invalid readings; the inbox
  keeps a batch until the low-watermarks let it go, then archives it
  (``FALKIRK_INPUT_ACK=delete`` deletes instead);
* ``tally`` keeps the running kWh per meter, durable every epoch, and logs its output;
* ``deliver`` sends the totals to the outbox; an epoch counts as a checkpoint only once the
  outbox's reader has accepted it (``falkirk delivered`` records an acceptance reported by
  call-back; ``deliver`` also picks up receipts itself each run).

Because ``tally`` logs its output, the inbox may forget an epoch as soon as tally's
checkpoint of it is durable, before the outbox accepts anything (``falkirk_readings_discard``
shows the other case: the inbox then waits for the outbox). One DAG run is one epoch.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import EpochClock
from falkirk.spark_jobs.readings import EDGES, regimes

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.readings"  # the jobs, found by package


def build_dag(dag_id: str = "falkirk_readings", tally_logs: bool = True, conn_id: str = "spark_default") -> DAG:
    """The pipeline under ``dag_id``; ``tally_logs=False`` makes tally discard its output."""
    with DAG(
        dag_id=dag_id,
        description="Meter readings (inbox) -> running totals -> outbox, acknowledged at both ends",
        schedule=EpochTimetable(EPOCHS),  # one run per epoch; off-grid triggers are refused
        start_date=EPOCHS.first,
        catchup=False,
        max_active_runs=8,
        tags=["falkirk"],
        default_args={"conn_id": conn_id, "retries": 0},
        doc_md=__doc__,
    ) as dag:
        tasks = {task: RegimeSparkSubmitOperator(task_id=task, application=f"{JOBS}.{task}", regime=regime)
                 for task, regime in regimes(tally_logs).items()}
        for up, down in EDGES:
            tasks[up] >> tasks[down]
    return dag


dag = build_dag()
discard = build_dag("falkirk_readings_discard", tally_logs=False)
