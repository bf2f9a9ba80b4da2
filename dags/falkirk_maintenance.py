"""falkirk_maintenance: the monitor on a schedule.

Every hour, for each DAG in the Falkirk ledger, it garbage-collects what the DAG's
low-watermarks release: checkpoints no recovery can restore any more, logged outputs
every consumer has passed, scratch copies below the watermark (``falkirk.policies.planning.collector``,
the same as ``falkirk gc --dag D``). The task's log lists what was reclaimed. Trigger it
with the param ``dry_run`` set to only print the plan.
"""

from __future__ import annotations

from datetime import datetime, timezone

from airflow.sdk import Param, dag, task


@dag(
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    tags=["falkirk"],
    params={"dry_run": Param(False, type="boolean", description="only print what would be reclaimed")},
    doc_md=__doc__,
)
def falkirk_maintenance():
    @task
    def collect_garbage(**context) -> dict[str, int]:
        """Collect every DAG in the ledger; returns the bytes reclaimed per DAG."""
        from falkirk.plugins.store_hook import FalkirkStoreHook
        from falkirk.policies.planning.collector import collect
        from falkirk.policies.store.ledger import Ledger

        store = FalkirkStoreHook().get_store()
        dry_run = bool(context["params"].get("dry_run"))
        return {d: collect(store, d, dry_run=dry_run, progress=print).plan.bytes for d in Ledger(store).dags()}

    collect_garbage()


falkirk_maintenance()
