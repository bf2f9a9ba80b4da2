"""The asset events of a task instance that a replay marks success instead of running it again.

A Falkirk task emits its asset events when its attempt succeeds
(:meth:`falkirk.plugins.operators.RegimeSparkSubmitOperator.execute`). An attempt that failed
after its job had committed and completed the epoch (killed after the commit, or refused as a
re-run of a completed epoch) emitted none, and a replay that keeps the epoch marks the task
instance success through Airflow's REST API, which emits none either. The DAGs scheduled on the
task's Assets would then never get a run of that epoch. :func:`emit_missing_events` emits,
through the REST API, the events the attempt would have emitted: the same ``extra`` (the commit
record, :class:`~falkirk.policies.asset_events.CommittedEpoch`) and, for a task with
``partition_outlets=True``, the epoch's partition key. An Asset that already has an event of
this commit gets none (a replay resumed after emitting them, or an epoch whose first attempt
succeeded and whose later re-run was refused), so a consumer never gets a second run of it.

Example::

    row = next(e for e in Ledger(store).entries("falkirk_orders") if (e.task_id, e.epoch) == ("publish", 15))
    emit_missing_events(client, row)
    # ['falkirk_orders.ranking']: falkirk_orders_leaders gets its run of 2026-01-15
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from falkirk.plugins.airflow_rest import FALKIRK_API, AirflowClient, api_path
from falkirk.policies.asset_events import AssetEventError, CommittedEpoch, epoch_partition_key
from falkirk.policies.epochs import EpochClock
from falkirk.policies.store.ledger import LedgerEntry

# The events of a commit are stamped by Airflow after the job stamped its ledger row; the two
# clocks may differ (another machine), so events are looked for from this long before the row.
CLOCK_SLACK = timedelta(hours=1)


def emit_missing_events(client: AirflowClient, entry: LedgerEntry) -> list[str]:
    """Emit an event of each Asset ``entry``'s task names as an outlet that has no event of the
    commit ``entry`` records; returns the names of the Assets it emitted events of."""
    assets = client.produced_assets(entry.dag_id, entry.task_id)
    if not assets:
        return []
    record = CommittedEpoch.from_entry(entry)
    key = _partition_key(client, entry)
    emitted = []
    for asset in assets:
        events = client.asset_events(asset["id"], since=entry.committed_at - CLOCK_SLACK)
        if any(record.same_commit(_record(e)) for e in events):
            continue
        client.create_asset_event(asset["id"], record.extra(), partition_key=key)
        emitted.append(asset["name"])
    return emitted


def redeliver_events(client: AirflowClient, dag_id: str, partition_key: str,
                     current: Callable[[CommittedEpoch], LedgerEntry | None]) -> list[str]:
    """Emit again, for ``dag_id`` (a DAG scheduled on Assets), the newest event of each Asset it
    is scheduled on that carries ``partition_key``: Airflow starts no run of a DAG that is paused
    when an event arrives, and starts none later, so that DAG never runs the partition. Each
    event is emitted with the commit the producer's ledger names now (``current``: the current
    row of the commit an event records, ``None`` once it is rolled back: not emitted). Returns
    the names of the Assets emitted; Airflow then starts the run as for the producer's own event."""
    emitted = []
    for asset in client.scheduling_assets(dag_id):
        keyed = [e for e in client.asset_events(asset["id"], newest=True) if e.get("partition_key") == partition_key]
        record = next((r for e in keyed if (r := _record(e)) is not None), None)
        row = current(record) if record is not None else None
        if row is None:
            continue
        client.create_asset_event(asset["id"], CommittedEpoch.from_entry(row).extra(), partition_key=partition_key)
        emitted.append(asset["name"])
    return emitted


def _partition_key(client: AirflowClient, entry: LedgerEntry) -> str | None:
    """The partition key the task's events carry (``partition_outlets=True``), as the Falkirk API
    reads the task from the serialized DAG; ``None`` for a task whose events carry none."""
    tasks = client.request("GET", api_path("dags", entry.dag_id, "regimes", root=FALKIRK_API))["tasks"]
    task: dict = next((t for t in tasks if t["task_id"] == entry.task_id), {})
    if not task.get("partition_outlets") or not task.get("epoch_clock"):
        return None
    return epoch_partition_key(EpochClock.parse(task["epoch_clock"]).logical_date(entry.epoch))


def _record(event: dict) -> CommittedEpoch | None:
    try:
        return CommittedEpoch.from_extra(event.get("extra"))
    except AssetEventError:  # an event another task (or a person) emitted with an extra of its own
        return None
