"""falkirk_recovery: a recovery plan carried out as an Airflow task.

The Falkirk view and API start a replay by triggering a run of this DAG with the plan's id (and,
for a recovery across DAGs, the consumers' plans to replay after it). Its one task, ``replay``,
runs the replay's loop (``falkirk.plugins.replay``) and prints its progress to the task log. An
API-server restart does not touch it; a killed attempt is retried by Airflow, and the retry
resumes the plan from what the store and Airflow show was done.

Add this folder to Airflow as a DAG bundle (see docs/howto/recover.md) or copy this file into
your DAGs folder.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import Param, dag, task


@dag(
    dag_id="falkirk_recovery",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    is_paused_upon_creation=False,
    max_active_runs=16,
    tags=["falkirk"],
    params={
        "plan_id": Param("", type="string", description="the recorded plan to carry out (falkirk plan)"),
        "then": Param([], type="array", description="plans of consumer DAGs to replay after it, in order"),
        "holder": Param("", type="string", description="who started the recovery (recorded with its lease)"),
    },
    doc_md=__doc__,
)
def falkirk_recovery():
    @task(retries=5, retry_delay=timedelta(seconds=10))
    def replay(**context) -> dict:
        """Carry the plan out; returns what was cleared per DAG run."""
        from falkirk.plugins.supervised import replay_in_task

        return replay_in_task(context)

    replay()


falkirk_recovery()
