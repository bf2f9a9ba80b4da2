"""(a) three epochs through the real scheduler; (b) clearing one task instance is idempotent;
(e) the plugin answers through the running API server, with Airflow's auth; (f) the
falkirk_maintenance DAG collects garbage on its schedule (last: it deletes what (b) re-reads)."""

from __future__ import annotations

from datetime import datetime, timezone

import httpx

from devstack.airflow import AirflowStack
from devstack.demo import DAG_ID, run_id_of
from devstack.processes import wait_until
from falkirk.plugins.recovery import plan, replay
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.control import Collections
from falkirk.policies.store.ledger import Ledger
from tests.integration.conftest import EPOCHS
from tests.oracle import canonical, expected_tables
from tests.tables import TABLES, snapshot, table_rows

MAINTENANCE = "falkirk_maintenance"


def test_three_epochs_fill_the_tables_exactly(three_epochs, local_store: StoreConfig) -> None:
    expected = expected_tables(EPOCHS)
    for name in TABLES:
        assert canonical(table_rows(local_store, name)) == canonical(expected[name]), name

    # Hand-checked: ada's epoch-1 orders are i = 2, 7, 12, 17, 22 with amounts 30, 15, 0, 35, 20;
    # the zero is invalid, so she has 100 over 4 orders, and the running total only grows.
    state = {(r["epoch"], r["customer"]): r for r in table_rows(local_store, "aggregate/state")}
    assert (state[1, "ada"]["total_amount"], state[1, "ada"]["total_orders"]) == (100, 4)
    for customer in {c for _, c in state}:
        totals = [state[e, customer]["total_amount"] for e in EPOCHS]
        assert totals == sorted(totals) and totals[0] < totals[-1]


def test_ledger_has_one_row_per_task_and_epoch(three_epochs, local_store: StoreConfig) -> None:
    entries = Ledger(local_store).entries(DAG_ID)
    expected = expected_tables(EPOCHS)
    got = {(e.task_id, e.epoch): e for e in entries}
    assert sorted(got) == sorted((t, e) for t in ("ingest", "aggregate", "publish") for e in EPOCHS)
    assert len(entries) == 9
    for (task, epoch), entry in got.items():
        assert entry.run_id == run_id_of(epoch) and entry.try_number == 1 and entry.incarnation == 0
        rows = sum(1 for r in expected[f"{task}/output"] if r["epoch"] == epoch)
        assert [(o.name, o.rows) for o in entry.outputs] == [("output", rows)]
    assert {t: got[t, 1].regime for t in ("ingest", "aggregate", "publish")} == {
        "ingest": "ephemeral", "aggregate": "eager_checkpoint", "publish": "batch(log_outputs=true)"}
    assert [o.tier for o in got["ingest", 2].outputs] == ["scratch"]
    assert got["aggregate", 2].state_tier == "durable" and got["aggregate", 2].state_rows == 5
    assert got["publish", 2].state_uri is None


def test_clearing_a_completed_epoch_is_refused_naming_the_plan_that_redoes_it(
        three_epochs, airflow_stack: AirflowStack, local_store: StoreConfig) -> None:
    """Airflow's Clear of aggregate's completed epoch 2, with downstream, as after correcting
    its input: running it again would find the epoch committed and change nothing, leaving the
    results stale behind green task instances. Instead aggregate fails at once (no retries)
    naming the plan, nothing changes, and that plan redoes epochs 2 and 3 of aggregate and
    publish, after which every table equals the failure-free run."""
    before = snapshot(local_store)
    client = airflow_stack.client()
    run_id = run_id_of(2)
    cleared = client.request("POST", f"/api/v2/dags/{DAG_ID}/clearTaskInstances", json={
        "dry_run": False, "task_ids": ["aggregate"], "dag_run_id": run_id, "only_failed": False,
        "include_downstream": True, "include_upstream": False, "reset_dag_runs": True})["task_instances"]
    assert sorted(ti["task_id"] for ti in cleared) == ["aggregate", "publish"]
    assert client.wait_for_run(DAG_ID, run_id, progress=print) == "failed"
    tis = client.task_instances(DAG_ID, run_id)
    assert (tis["aggregate"]["state"], tis["aggregate"]["try_number"]) == ("failed", 2)
    assert tis["publish"]["state"] == "upstream_failed" and tis["ingest"]["try_number"] == 1
    log = client.task_log(DAG_ID, run_id, "aggregate", 2)
    assert "aggregate epoch 2 already completed (committed by run epoch-2, try 1)" in log, log[-3000:]
    assert f"falkirk plan --dag {DAG_ID} --bad-epoch aggregate:2, then falkirk replay PLAN_ID" in log, log[-3000:]
    assert snapshot(local_store) == before  # every table, its Delta version, and the ledger

    p = plan(DAG_ID, local_store, client, bad_epochs=[("aggregate", 2)])
    assert sorted(p.rerun_set()) == [("aggregate", 2), ("aggregate", 3), ("publish", 2), ("publish", 3)]
    replay(p.plan_id, local_store, client, holder="admin")
    expected = expected_tables(EPOCHS)
    for name in TABLES:
        assert canonical(table_rows(local_store, name)) == canonical(expected[name]), name
    for epoch in (2, 3):
        assert {t: ti["state"] for t, ti in client.task_instances(DAG_ID, run_id_of(epoch)).items()} == {
            "ingest": "success", "aggregate": "success", "publish": "success"}


def test_plugin_route_answers_through_the_api_server(three_epochs, airflow_stack: AirflowStack,
                                                     monkeypatch) -> None:
    url = f"{airflow_stack.base_url}/falkirk/api/v1/dags/{DAG_ID}/ledger"
    assert httpx.get(url).status_code == 401  # Airflow does not guard plugin apps; the plugin does
    assert httpx.get(url, headers={"Authorization": "Bearer not-a-token"}).status_code in (401, 403)
    for user in ("admin", "viewer"):
        client = airflow_stack.client(user)
        body = client.request("GET", f"/falkirk/api/v1/dags/{DAG_ID}/ledger")
        assert body["total_entries"] == 9
        assert {(e["task_id"], e["epoch"]) for e in body["entries"]} == {
            (t, e) for t in ("ingest", "aggregate", "publish") for e in EPOCHS}
    regimes = airflow_stack.client("viewer").request("GET", f"/falkirk/api/v1/dags/{DAG_ID}/regimes")
    daily = "first=2026-01-01T00:00:00+00:00,period_seconds=86400,first_epoch=1"
    assert regimes["tasks"] == [{"task_id": "aggregate", "regime": "eager_checkpoint", "epoch_clock": daily},
                                {"task_id": "ingest", "regime": "ephemeral", "epoch_clock": daily},
                                {"task_id": "publish", "regime": "batch(log_outputs=true)", "epoch_clock": daily}]
    assert httpx.get(f"{airflow_stack.base_url}/falkirk/api/v1/dags/{DAG_ID}/regimes").status_code == 401
    health = airflow_stack.client().request("GET", "/falkirk/api/v1/health")
    assert health == {"status": "ok", "ledger": airflow_stack.store.ledger_uri, "user": "admin"}
    # The CLI acting with a token alone records the Airflow user the token belongs to, not the OS user.
    from falkirk.plugins.airflow_rest import AirflowClient
    from falkirk.plugins.cli import _airflow_user

    viewer = AirflowClient(airflow_stack.base_url, token=airflow_stack.client("viewer").token)
    monkeypatch.delenv("FALKIRK_AIRFLOW_USER", raising=False)
    assert _airflow_user(viewer) == "viewer"


def _epochs(store: StoreConfig, name: str) -> list[int]:
    return sorted({r["epoch"] for r in table_rows(store, name)})


def _first_scheduled_run(stack: AirflowStack, timeout: float = 120) -> str:
    client, found = stack.client(), []

    def scheduled() -> bool:
        runs = client.request("GET", f"/api/v2/dags/{MAINTENANCE}/dagRuns")["dag_runs"]
        found[:] = [r["dag_run_id"] for r in runs if r["run_type"] == "scheduled"]
        return bool(found)

    wait_until(f"a scheduled run of {MAINTENANCE}", scheduled, timeout, stack.services, interval=2)
    return found[0]


def test_the_maintenance_dag_collects_on_its_schedule(three_epochs, airflow_stack: AirflowStack,
                                                      local_store: StoreConfig) -> None:
    client = airflow_stack.client()
    client.wait_for_dag(MAINTENANCE)
    state_3 = [r for r in table_rows(local_store, "aggregate/state") if r["epoch"] == 3]
    publish = table_rows(local_store, "publish/output")
    client.set_paused(MAINTENANCE, False)  # the scheduler creates the latest hourly run at once
    try:
        scheduled = _first_scheduled_run(airflow_stack)
        assert client.wait_for_run(MAINTENANCE, scheduled, progress=print) == "success"

        # Every task's low-watermark is epoch 3 (aggregate checkpoints durably every epoch,
        # publish logs its output), so: aggregate's states of epochs 1-2 go, its checkpoint of 3
        # stays; the outputs of epochs 1-3 that only aggregate and publish read go, since
        # neither re-runs an epoch before 4; publish's output is the product and stays whole.
        assert _epochs(local_store, "aggregate/state") == [3]
        assert canonical(table_rows(local_store, "aggregate/state")) == canonical(state_3)
        assert _epochs(local_store, "ingest/output") == [] and _epochs(local_store, "aggregate/output") == []
        assert canonical(table_rows(local_store, "publish/output")) == canonical(publish)
        assert Collections(local_store).through(DAG_ID) == {"ingest": 2, "aggregate": 2, "publish": 2}

        # A dry run, then a second real run, through Airflow: neither changes anything.
        after = snapshot(local_store)
        for run_id, dry_run in (("maintenance-dry-run", True), ("maintenance-again", False)):
            client.trigger(MAINTENANCE, run_id, datetime.now(timezone.utc), conf={"dry_run": dry_run})
            assert client.wait_for_run(MAINTENANCE, run_id, progress=print) == "success"
            assert snapshot(local_store) == after, run_id
            assert Collections(local_store).through(DAG_ID) == {"ingest": 2, "aggregate": 2, "publish": 2}
    finally:
        client.set_paused(MAINTENANCE, True)
