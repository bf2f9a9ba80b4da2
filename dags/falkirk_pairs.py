"""falkirk_pairs: process pairs on Flux's running example; a lost replica costs no rollback.

* ``ingress``  Batch(log_outputs=True): the epoch's connection events, numbered (SN);
* ``sessions`` ProcessPairs, 4 partitions by (src, dst): open sessions; closed ones go downstream;
* ``stats``    ProcessPairs, 4 partitions by (app, src): running count, sum and maximum of the
  session durations; each update goes to the sink, written by both replicas (first wins).

Each partition of ``sessions`` and ``stats`` runs twice, as replicas A and B (task instances
2p and 2p+1) on two workers, chained: replica A of partition p on the p-th worker, B on the
next. When a worker is lost (``falkirk pairs --fail-worker``), its replicas are declared dead
and their twins' outputs, already committed, are read instead: nothing re-runs. ``falkirk pairs
--catch-up`` recreates them on a spare. One DAG run is one epoch (midnight UTC, from 2026-01-01).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Mapping, Sequence

from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EpochClock, ProcessPairs, Regime

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
JOBS = "falkirk.spark_jobs.sessions"
# task: (regime, partitions)
TASKS = {"ingress": (Batch(log_outputs=True), None), "sessions": (ProcessPairs(), 4), "stats": (ProcessPairs(), 4)}
# What a run without Airflow needs (devstack.inprocess).
REGIMES = {task: regime for task, (regime, _) in TASKS.items()}
PARTITIONS = {task: n for task, (_, n) in TASKS.items() if n}
EDGES = list(zip(TASKS, list(TASKS)[1:]))


def build_dag(dag_id: str = "falkirk_pairs", conn_id: str = "spark_default", partitions: int = 4,
              regimes: Mapping[str, Regime] | None = None, queues: Mapping[str, str] | None = None,
              tags: Sequence[str] = (), retries: int = 0) -> DAG:
    """The pipeline under ``dag_id`` (several copies can live side by side, each with its own
    tables), with ``partitions`` partitions per paired task; ``regimes`` replaces tasks' regimes
    (process pairs beside the checkpointing regimes, say), ``queues`` gives tasks a queue and
    ``retries`` the retries of the tasks that are not paired (a replica never retries)."""
    with DAG(
        dag_id=dag_id,
        description="Events -> sessions per (src, dst) -> running statistics per (app, src), paired partitions",
        schedule=EpochTimetable(EPOCHS),
        start_date=EPOCHS.first,
        catchup=False,
        max_active_runs=4,
        tags=["falkirk", *tags],
        default_args={"conn_id": conn_id, "retries": retries, "retry_delay": timedelta(seconds=3)},
        doc_md=__doc__,
    ) as dag:
        tasks = []
        for task, (regime, count) in TASKS.items():
            regime = (regimes or {}).get(task, regime)
            queue = {"queue": queues[task]} if queues and task in queues else {}
            if count is None:
                tasks.append(RegimeSparkSubmitOperator(task_id=task, application=f"{JOBS}.{task}", regime=regime,
                                                       **queue))
            else:
                tasks.append(RegimeSparkSubmitOperator.partial(task_id=task, application=f"{JOBS}.{task}",
                                                               regime=regime, **queue)
                             .expand(partition=range(partitions)))
        for up, down in zip(tasks, tasks[1:]):
            up >> down
    return dag


dag = build_dag()
