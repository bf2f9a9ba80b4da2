"""(a) three epochs through the real scheduler; (b) clearing one task instance is idempotent;
(e) the plugin answers through the running API server, with Airflow's auth; (f) the
falkirk_maintenance DAG collects garbage on its schedule (last: it deletes what (b) re-reads)."""

from __future__ import annotations

import dataclasses
import re
import time
from datetime import datetime, timezone

import httpx
import pytest

from devstack.airflow import PROJECT_ROOT, AirflowStack
from devstack.demo import DAG_ID, dag_epoch_clock, run_id_of
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


def test_a_task_instance_reads_the_ledger_once_on_the_job_host(three_epochs, airflow_stack: AirflowStack) -> None:
    """A job reads its DAG's ledger rows and rollbacks once (a snapshot) and answers every question
    of its own from it; around its commit point it brings the snapshot's rollbacks up to date,
    twice, reading only the commits made since, to withdraw a commit built on rows a recovery
    rolled back meanwhile. It runs on the job host."""
    client = airflow_stack.client()
    aggregate = client.task_log(DAG_ID, run_id_of(3), "aggregate", 1)  # one input and its own state
    assert "aggregate epoch 3: committed 5 output rows, 5 state rows" in aggregate, aggregate[-3000:]
    assert "(ledger read 1x, rollbacks read 1x, snapshot brought up to date 2x)" in aggregate, aggregate[-3000:]
    ingest = client.task_log(DAG_ID, run_id_of(3), "ingest", 1)  # reads nothing from the pipeline
    assert "(ledger read 1x, rollbacks read 1x, snapshot brought up to date 0x)" in ingest, ingest[-3000:]
    assert "Spark Connect client of sc://127.0.0.1:" in ingest and "on the job host" in ingest, ingest[-3000:]


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
    cleared = _clear_with_downstream(client, run_id, "aggregate")
    assert sorted(ti["task_id"] for ti in cleared) == ["aggregate", "publish"]
    assert client.wait_for_run(DAG_ID, run_id, progress=print) == "failed"
    tis = client.task_instances(DAG_ID, run_id)
    assert (tis["aggregate"]["state"], tis["aggregate"]["try_number"]) == ("failed", 2)
    assert tis["publish"]["state"] == "upstream_failed" and tis["ingest"]["try_number"] == 1
    log = client.task_log(DAG_ID, run_id, "aggregate", 2)
    assert "aggregate epoch 2 already completed (committed by run epoch-2, try 1)" in log, log[-3000:]
    assert f"falkirk plan --dag {DAG_ID} --bad-epoch aggregate:2 (re-runs 4 task instances, through epoch 3)" in log \
        and "falkirk replay PLAN_ID" in log, log[-3000:]
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

    # A refused Clear of publish's epoch 3 (a leaf: Airflow then fails the run) leaves run 3
    # failed. A later plan that keeps epoch 3 (a bad publish epoch 2) marks that instance success,
    # and the run it settles, where nothing re-ran, shows success in Airflow's runs list too.
    client.clear(DAG_ID, run_id_of(3), ["publish"])
    assert client.wait_for_run(DAG_ID, run_id_of(3), progress=print) == "failed"
    p = plan(DAG_ID, local_store, client, bad_epochs=[("publish", 2)])
    assert sorted(p.rerun_set()) == [("publish", 2)]
    said: list[str] = []
    replay(p.plan_id, local_store, client, holder="admin", progress=lambda m: (said.append(m), print(m)))
    assert client.task_instances(DAG_ID, run_id_of(3))["publish"]["state"] == "success"
    assert client.dag_run(DAG_ID, run_id_of(3))["state"] == "success", said
    assert any(f"set 1 DAG runs to success: {run_id_of(3)}" in m for m in said), said


def test_each_committed_epoch_is_an_asset_event_naming_its_incarnation_and_a_redo_replaces_it(
        three_epochs, airflow_stack: AirflowStack, local_store: StoreConfig) -> None:
    """publish's outlet, the Asset falkirk_orders.ranking: one event per commit, after the test
    before: epochs 1-3 (incarnation 0); the refused Clears emit nothing; the replay of aggregate:2
    redoes publish 2 and 3 (incarnation 1), the one of publish:2 redoes epoch 2 again
    (incarnation 2). Each redo is marked a replacement, and the latest event of each epoch names
    the Delta version the ledger's current row holds."""
    client = airflow_stack.client()
    events = client.request("GET", "/api/v2/assets/events", params={
        "source_dag_id": DAG_ID, "source_task_id": "publish", "order_by": "timestamp", "limit": 100})["asset_events"]
    records = [e["extra"]["falkirk"] for e in events]
    assert [(r["epoch"], r["incarnation"], r["replacement"]) for r in records] == [
        (1, 0, False), (2, 0, False), (3, 0, False), (2, 1, True), (3, 1, True), (2, 2, True)], records
    assert {e["name"] for e in events} == {"falkirk_orders.ranking"}
    assert [e["source_run_id"] for e in events] == [run_id_of(r["epoch"]) for r in records]
    versions = [r["outputs"]["output"]["version"] for r in records]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)  # one commit of the table each
    current = {e.epoch: e for e in Ledger(local_store).entries(DAG_ID, "publish")}
    latest = {r["epoch"]: r for r in records}  # the last event of each epoch
    assert {k: (r["incarnation"], r["outputs"]["output"]["version"], r["outputs"]["output"]["rows"])
            for k, r in latest.items()} == {
        k: (e.incarnation, e.outputs[0].version, e.outputs[0].rows) for k, e in current.items()}


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
    assert regimes["tasks"] == [
        {"task_id": "aggregate", "regime": "eager_checkpoint", "epoch_clock": daily, "partitions": None,
         "partition_outlets": False},
        {"task_id": "ingest", "regime": "ephemeral", "epoch_clock": daily, "partitions": None,
         "partition_outlets": False},
        {"task_id": "publish", "regime": "batch(log_outputs=true)", "epoch_clock": daily, "partitions": None,
         "partition_outlets": True}]
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


# After the collection above, the tests below add epochs 4-6. They compare each table from epoch
# 4 on (the collection deleted earlier epochs of what is not a product) and the product whole.
def _assert_tables_equal_the_failure_free_run(store: StoreConfig, epochs: list[int],
                                              withdrawn: tuple[int, ...] = ()) -> None:
    """``withdrawn``: epochs a discard rolled back, whose rows stay in the tables (readers ignore
    them) until a collection reclaims them."""
    expected = expected_tables(epochs)
    for name in TABLES:
        keep = (lambda r: r["epoch"] not in withdrawn) if name == "publish/output" else (
            lambda r: r["epoch"] >= 4 and r["epoch"] not in withdrawn)
        assert canonical([r for r in table_rows(store, name) if keep(r)]) == canonical(
            [r for r in expected[name] if keep(r)]), name


def test_a_trigger_off_the_epoch_grid_or_without_a_logical_date_is_refused_before_any_run_exists(
        three_epochs, airflow_stack: AirflowStack) -> None:
    """The DAG's EpochTimetable refuses, at trigger time, a run that would have no epoch: what the
    UI's Trigger dialog sends by default (now), a run without a logical date, and Airflow's own
    `airflow dags trigger` without one. Nothing is created, so nothing can block a later epoch."""
    client = airflow_stack.client()
    runs_before = client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["total_entries"]
    url = f"{airflow_stack.base_url}/api/v2/dags/{DAG_ID}/dagRuns"
    headers = {"Authorization": f"Bearer {client.token}"}
    clock = dag_epoch_clock()
    latest = max(clock.epoch_of(datetime.fromisoformat(r["logical_date"].replace("Z", "+00:00")))
                 for r in client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["dag_runs"])
    next_date = clock.logical_date(latest + 1).isoformat()
    off_grid = httpx.post(url, headers=headers, json={"logical_date": "2026-01-05T17:43:00Z"})
    assert off_grid.status_code == 400, off_grid.text
    assert ("logical date 2026-01-05T17:43:00+00:00 is not an epoch of this DAG (epoch 1 at 2026-01-01T00:00:00+00:00,"
            f" one every 1 day, 0:00:00): each run is one epoch. Trigger the next epoch, {latest + 1}, at logical date "
            f"{next_date}.") in off_grid.json()["detail"]
    # on the grid but far ahead (what a date picker's "now" gives): refused, proposing the next epoch
    ahead = httpx.post(url, headers=headers, json={"logical_date": "2026-11-25T00:00:00Z"})
    assert ahead.status_code == 400, ahead.text
    assert (f"epoch 329 would leave epochs {latest + 1}..328 of DAG {DAG_ID} without a run: its latest run is epoch "
            f"{latest}, and a task that keeps state runs its epochs in order. Trigger the next epoch, {latest + 1}, "
            f"at logical date {next_date}.") in ahead.json()["detail"]
    no_date = httpx.post(url, headers=headers, json={"logical_date": None})
    assert no_date.status_code == 400, no_date.text
    assert "a run of this DAG is an epoch, so it needs a logical date on the epoch grid" in no_date.json()["detail"]
    cli = airflow_stack.airflow("dags", "trigger", DAG_ID, check=False)
    assert cli.returncode != 0 and "needs a logical date on the epoch grid" in cli.stdout + cli.stderr, cli
    assert client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["total_entries"] == runs_before


def test_a_replay_on_a_dag_with_max_active_runs_1_lets_the_earlier_epochs_through(
        three_epochs, airflow_stack: AirflowStack, local_store: StoreConfig) -> None:
    """falkirk_orders allows one active run. aggregate's epoch 4 fails; epoch 5's run starts and
    holds the only slot, its aggregate waiting on epoch 4 (depends_on_past). The replay clears
    epochs 4 and 5: Airflow queues the finished run 4 but leaves run 5 running, so run 4 could
    never start. The replay queues run 5 again, the epochs run in order, and it finishes."""
    client = airflow_stack.client()
    (airflow_stack.home / "faults").write_text(f"{DAG_ID}/aggregate:4:before-commit\n")
    clock = dag_epoch_clock()
    for epoch in (4, 5):
        client.trigger(DAG_ID, run_id_of(epoch), clock.logical_date(epoch))
    assert client.wait_for_run(DAG_ID, run_id_of(4), progress=print) == "failed"
    wait_until("epoch 5's aggregate waiting on epoch 4 in a running run", lambda: (
        client.dag_run(DAG_ID, run_id_of(5))["state"] == "running"
        and client.task_instances(DAG_ID, run_id_of(5))["ingest"]["state"] == "success"), 300,
        airflow_stack.services, interval=2)
    assert client.task_instances(DAG_ID, run_id_of(5))["aggregate"]["state"] is None
    (airflow_stack.home / "faults").write_text("")

    p = plan(DAG_ID, local_store, client, failed_tasks=["aggregate"])
    assert sorted(p.rerun_set()) == [("aggregate", 4), ("aggregate", 5), ("publish", 4), ("publish", 5)]
    said: list[str] = []
    replay(p.plan_id, local_store, client, holder="admin", progress=lambda m: (said.append(m), print(m)),
           timeout=900)
    assert any("epoch-5 held one of the DAG's max_active_runs=1 slots" in m for m in said), said
    _assert_tables_equal_the_failure_free_run(local_store, [1, 2, 3, 4, 5])


def test_a_backfill_creates_numbered_epochs_and_one_reprocessing_completed_epochs_fails_them_visibly(
        three_epochs, airflow_stack: AirflowStack, local_store: StoreConfig) -> None:
    """A backfill of epoch 6 runs it as epoch 6. A backfill that reprocesses the completed
    epoch 6 (as after correcting its input) changes nothing and ends with failed task
    instances whose log names the plan; that plan then redoes them."""
    client = airflow_stack.client()
    clock = dag_epoch_clock()

    def backfill(first: int, last: int, reprocess: str) -> int:
        backfill_id = client.create_backfill(DAG_ID, clock.logical_date(first), clock.logical_date(last),
                                             reprocess)["id"]
        wait_until(f"backfill {backfill_id} of epochs {first}-{last}", lambda: client.request(
            "GET", f"/api/v2/backfills/{backfill_id}")["completed_at"] is not None, 900, airflow_stack.services,
            interval=3)
        return backfill_id

    backfill(6, 6, "failed")  # Airflow asks a DAG with depends_on_past to name one
    [run] = client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns",
                           params={"run_type": "backfill"})["dag_runs"]
    assert (run["logical_date"][:10], run["state"]) == ("2026-01-06", "success")
    assert {e.epoch for e in Ledger(local_store).entries(DAG_ID) if e.run_id == run["dag_run_id"]} == {6}
    _assert_tables_equal_the_failure_free_run(local_store, [1, 2, 3, 4, 5, 6])

    before = snapshot(local_store)
    backfill(6, 6, "completed")
    tis = client.task_instances(DAG_ID, run["dag_run_id"])
    assert {t: ti["state"] for t, ti in tis.items()} == {
        "ingest": "failed", "aggregate": "upstream_failed", "publish": "upstream_failed"}, tis
    log = client.task_log(DAG_ID, run["dag_run_id"], "ingest", tis["ingest"]["try_number"])
    assert "ingest epoch 6 already completed" in log and "--bad-epoch ingest:6" in log, log[-2000:]
    assert snapshot(local_store) == before

    p = plan(DAG_ID, local_store, client, bad_epochs=[("ingest", 6)])
    assert sorted(p.rerun_set()) == [("aggregate", 6), ("ingest", 6), ("publish", 6)]
    replay(p.plan_id, local_store, client, holder="admin", timeout=900)
    _assert_tables_equal_the_failure_free_run(local_store, [1, 2, 3, 4, 5, 6])
    assert {ti["state"] for ti in client.task_instances(DAG_ID, run["dag_run_id"]).values()} == {"success"}


def test_a_far_ahead_epoch_left_by_a_deleted_run_is_discarded_and_plans_stop_at_the_latest_run(
        three_epochs, airflow_stack: AirflowStack, local_store: StoreConfig, monkeypatch, capsys) -> None:
    """Rows of epoch 329 remain from a run made at a far-ahead date and deleted since (the trap the
    timetable now refuses at trigger time). A plan stops at the DAG's latest run and says so; its
    replay is refused until ``falkirk discard`` withdraws epoch 329 (previewed first, changing
    nothing); then the plan is replayed and the tables equal the failure-free run's."""
    from falkirk.plugins.cli import main
    from falkirk.policies.planning.recovery import PlanError
    from falkirk.policies.planning.recovery_log import RecoveryLog

    client = airflow_stack.client()
    for k, v in {**local_store.env(), "FALKIRK_AIRFLOW_USER": "admin", "FALKIRK_AIRFLOW_PASSWORD": "admin"}.items():
        monkeypatch.setenv(k, v)
    url = airflow_stack.base_url
    clock = dag_epoch_clock()
    latest = clock.epoch_of(client.latest_logical_date(DAG_ID))
    ledger = Ledger(local_store)
    for row in [e for e in ledger.entries(DAG_ID) if e.epoch == latest]:
        assert ledger.append(dataclasses.replace(row, epoch=329, run_id="manual__epoch-329"))

    p = plan(DAG_ID, local_store, client, bad_epochs=[("ingest", latest)])
    assert p.last_epoch == latest
    assert sorted(p.rerun_set()) == [("aggregate", latest), ("ingest", latest), ("publish", latest)]
    assert main(["plan", "--dag", DAG_ID, "--bad-epoch", f"ingest:{latest}", "--airflow-url", url]) == 0
    out = capsys.readouterr().out
    assert (f"the ledger has rows of epochs 329..329 past the DAG's latest run (epoch {latest}), left out of this "
            f"plan; if those runs were made by mistake, withdraw them: falkirk discard --dag {DAG_ID} --epochs "
            f"329-329") in out, out
    with pytest.raises(PlanError, match="the replay cannot clear task instances of runs that do not exist"):
        replay(p.plan_id, local_store, client, holder="admin")

    before = snapshot(local_store), ledger.dag_version(DAG_ID)
    assert main(["discard", "--dag", DAG_ID, "--epochs", "329", "--airflow-url", url]) == 0
    out = capsys.readouterr().out
    assert "  ingest: rolls back 1 ledger row (epochs 329)" in out and "deletes 0 DAG runs" in out, out
    assert f"the DAG's next epoch is then {latest + 1}" in out, out
    assert (snapshot(local_store), ledger.dag_version(DAG_ID)) == before  # a preview changes nothing
    assert main(["discard", "--dag", DAG_ID, "--epochs", "329", "--yes", "--airflow-url", url]) == 0
    assert f"discarded epochs 329..329 of {DAG_ID}; its next epoch is {latest + 1}" in capsys.readouterr().out
    assert max(e.epoch for e in ledger.entries(DAG_ID)) == latest
    events = [r for r in RecoveryLog(local_store).events(DAG_ID) if r["event"] in ("started", "finished")]
    assert events[-1]["event"] == "finished" and "discarded epochs 329..329: 3 ledger rows rolled back" in \
        events[-1]["detail"] and events[-1]["holder"] == "admin"
    # a discard is no plan to replay, and discarding again finds nothing
    with pytest.raises(PlanError, match="records a discard"):
        replay(events[-1]["plan_id"], local_store, client)
    assert main(["discard", "--dag", DAG_ID, "--epochs", "329", "--airflow-url", url]) == 2
    assert "nothing to discard" in capsys.readouterr().err

    p = plan(DAG_ID, local_store, client, bad_epochs=[("ingest", latest)])
    replay(p.plan_id, local_store, client, holder="admin", timeout=900)
    _assert_tables_equal_the_failure_free_run(local_store, list(range(1, latest + 1)))


def test_dags_test_of_an_unpaused_dag_with_the_scheduler_running_leaves_its_epochs_and_plans_as_they_were(
        three_epochs, airflow_stack: AirflowStack, local_store: StoreConfig, tmp_path, monkeypatch, capsys) -> None:
    """`airflow dags test` of falkirk_orders (unpaused, the scheduler running) at the DAG's next
    epoch: its task instances run once each, in the test's process, into a store of their own; a
    failing test run leaves nothing for `falkirk plan --failed-task` to plan from; the real store is
    unchanged and a plan computed afterwards equals one computed before."""
    from falkirk.plugins.dags_test import DAGS_TEST_POOL
    from falkirk.policies.planning.recovery import PlanError

    client = airflow_stack.client()
    clock = dag_epoch_clock()
    latest = clock.epoch_of(client.latest_logical_date(DAG_ID))
    before = snapshot(local_store), Ledger(local_store).dag_version(DAG_ID)
    planned = plan(DAG_ID, local_store, client, bad_epochs=[("ingest", latest)], record=False)
    test_store = tmp_path / "tests"
    date = clock.logical_date(latest + 1).isoformat()

    done = airflow_stack.airflow("dags", "test", DAG_ID, date, env={"FALKIRK_DAGS_TEST_STORE": str(test_store)})
    [run] = [r for r in client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["dag_runs"]
             if r["triggered_by"] == "test"]
    tis = client.task_instances(DAG_ID, run["dag_run_id"])
    assert {t: (ti["state"], ti["pool"]) for t, ti in tis.items()} == {
        t: ("success", DAGS_TEST_POOL) for t in ("ingest", "aggregate", "publish")}, done.stdout[-3000:]
    # each task committed once, in the test's store: the scheduler ran none of them a second time
    rows = Ledger(StoreConfig(str(test_store / DAG_ID / "durable"), str(test_store / DAG_ID / "scratch"))).entries(
        DAG_ID)
    assert sorted((e.task_id, e.epoch, e.incarnation) for e in rows) == [
        ("aggregate", latest + 1, 0), ("ingest", latest + 1, 0), ("publish", latest + 1, 0)]
    assert "already completed" not in done.stdout + done.stderr

    # The test run holds the epoch's logical date: to test it again (or to trigger the real
    # epoch) it is deleted first, by a discard that has no ledger row to roll back; the trigger
    # says so, naming the test run, instead of Airflow's raw 409.
    from falkirk.plugins.cli import main
    from falkirk.plugins.discard import discard

    for k, v in _cli_env(airflow_stack, local_store).items():
        monkeypatch.setenv(k, v)
    assert main(["trigger", "--dag", DAG_ID]) == 2
    err = capsys.readouterr().err
    assert f"is held by {run['dag_run_id']}, a run of `airflow dags test`" in err, err
    assert f"falkirk discard --dag {DAG_ID} --epochs {latest + 1} --yes" in err and "Unique constraint" not in err, err

    gone = discard(DAG_ID, local_store, client, latest + 1, latest + 1, holder="admin", progress=print)
    assert (gone.rows, gone.runs) == ((), (run["dag_run_id"],))

    # the same test again, with a task failing: a failed test run, which the planner leaves out
    (airflow_stack.home / "faults").write_text(f"{DAG_ID}/aggregate:{latest + 1}:before-commit\n")
    try:
        failing = airflow_stack.airflow("dags", "test", DAG_ID, date, check=False)
    finally:
        (airflow_stack.home / "faults").write_text("")
    [run] = [r for r in client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["dag_runs"]
             if r["triggered_by"] == "test"]
    assert client.task_instances(DAG_ID, run["dag_run_id"])["aggregate"]["state"] == "failed", \
        failing.stdout[-3000:] + failing.stderr[-3000:]
    with pytest.raises(PlanError, match="Airflow reports no failed task instance"):
        plan(DAG_ID, local_store, client, failed_tasks=["*"], record=False)

    assert (snapshot(local_store), Ledger(local_store).dag_version(DAG_ID)) == before
    again = plan(DAG_ID, local_store, client, bad_epochs=[("ingest", latest)], record=False)
    assert (again.last_epoch, again.rerun_set()) == (planned.last_epoch, planned.rerun_set()) == (
        latest, planned.rerun_set())
    discard(DAG_ID, local_store, client, latest + 1, latest + 1, holder="admin", progress=print)
    assert [r for r in client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["dag_runs"]
            if r["triggered_by"] == "test"] == []


def test_a_run_the_replay_queued_again_is_not_overtaken_by_an_epoch_triggered_meanwhile(
        three_epochs, airflow_stack: AirflowStack, local_store: StoreConfig) -> None:
    """falkirk_orders allows one active run, and Airflow starts a queued run it never looked at
    (a new one, or one cleared) before one it did. aggregate's epoch N fails; epoch N+1's run holds
    the slot, its aggregate waiting on N. A plan up to epoch N re-runs N alone: the replay queues
    N+1 again so that N runs, and epoch N+2 is triggered just then. When N is done, N+2 would take
    the slot and wait on N+1 for ever: the replay queues N+2 again too, and finishes once N+1 has
    started. Every epoch then completes."""
    client = airflow_stack.client()
    clock = dag_epoch_clock()
    first = clock.epoch_of(client.latest_logical_date(DAG_ID)) + 1
    (airflow_stack.home / "faults").write_text(f"{DAG_ID}/aggregate:{first}:before-commit\n")
    for epoch in (first, first + 1):
        client.trigger(DAG_ID, run_id_of(epoch), clock.logical_date(epoch))
    assert client.wait_for_run(DAG_ID, run_id_of(first), progress=print) == "failed"
    wait_until(f"epoch {first + 1}'s aggregate waiting on epoch {first} in a running run", lambda: (
        client.dag_run(DAG_ID, run_id_of(first + 1))["state"] == "running"
        and client.task_instances(DAG_ID, run_id_of(first + 1))["ingest"]["state"] == "success"), 300,
        airflow_stack.services, interval=2)
    (airflow_stack.home / "faults").write_text("")
    p = plan(DAG_ID, local_store, client, failed_tasks=["aggregate"], last_epoch=first)
    assert sorted(p.rerun_set()) == [("aggregate", first), ("publish", first)]

    said: list[str] = []

    def progress(message: str) -> None:
        said.append(message)
        print(message)
        if f"{run_id_of(first + 1)} held one of the DAG's max_active_runs=1 slots" in message:
            client.trigger(DAG_ID, run_id_of(first + 2), clock.logical_date(first + 2))

    replay(p.plan_id, local_store, client, holder="admin", progress=progress, timeout=900)
    assert any(f"{run_id_of(first + 1)} held one of the DAG's max_active_runs=1 slots" in m for m in said), said
    assert f"plan {p.plan_id}: {run_id_of(first + 2)} took a max_active_runs=1 slot before the earlier runs the " \
           f"plan queued again; queued it again" in said, said
    for epoch in (first + 1, first + 2):
        assert client.wait_for_run(DAG_ID, run_id_of(epoch), progress=print, timeout=300) == "success"
    _assert_tables_equal_the_failure_free_run(local_store, list(range(1, first + 3)))


def test_airflow_dags_trigger_and_backfill_create_run_the_next_epoch_and_refuse_a_gap_quoting_the_date(
        three_epochs, airflow_stack: AirflowStack, local_store: StoreConfig) -> None:
    """Airflow's own commands keep to the epoch grid: ``airflow dags trigger -l`` of an off-grid
    or far-ahead date is refused quoting that date, and ``airflow backfill create`` (and its dry
    run, and the REST API the UI's Backfill dialog calls) from a date past the next epoch is
    refused with the backfill that leaves no gap; each ends with a message, not a traceback, and
    creates nothing. ``airflow dags trigger -l`` of the next epoch's date runs that epoch."""
    client = airflow_stack.client()
    clock = dag_epoch_clock()
    latest = clock.epoch_of(client.latest_logical_date(DAG_ID))
    runs_before = client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["total_entries"]
    backfills_before = client.request("GET", "/api/v2/backfills", params={"dag_id": DAG_ID})["total_entries"]
    nxt = clock.logical_date(latest + 1).isoformat()

    off = airflow_stack.airflow("dags", "trigger", DAG_ID, "-l", "2026-01-05T17:43:00+00:00", check=False)
    assert off.returncode == 1 and "Traceback" not in off.stderr, off.stderr[-3000:]
    assert (f"airflow dags trigger {DAG_ID} -l 2026-01-05T17:43:00+00:00 refused: logical date "
            f"2026-01-05T17:43:00+00:00 is not an epoch of this DAG") in off.stderr, off.stderr[-3000:]
    assert f"Trigger the next epoch, {latest + 1}, at logical date {nxt}." in off.stderr
    ahead = clock.logical_date(latest + 5).isoformat()
    far = airflow_stack.airflow("dags", "trigger", DAG_ID, "-l", ahead, check=False)
    assert far.returncode == 1 and "Traceback" not in far.stderr, far.stderr[-3000:]
    assert (f"refused: epoch {latest + 5} would leave epochs {latest + 1}..{latest + 4} of DAG {DAG_ID} without "
            f"a run") in far.stderr, far.stderr[-3000:]

    fix = (f"Backfill from the next epoch: airflow backfill create --dag-id {DAG_ID} --from-date {nxt} "
           f"--to-date {clock.logical_date(latest + 4).isoformat()} --reprocess-behavior failed")
    for dry in ([], ["--dry-run"]):
        gap = airflow_stack.airflow("backfill", "create", "--dag-id", DAG_ID, "--from-date",
                                    clock.logical_date(latest + 3).isoformat(), "--to-date",
                                    clock.logical_date(latest + 4).isoformat(), "--reprocess-behavior", "failed",
                                    *dry, check=False)
        assert gap.returncode == 1 and "Traceback" not in gap.stderr, gap.stdout[-2000:] + gap.stderr[-3000:]
        assert (f"airflow backfill create --dag-id {DAG_ID} refused: a backfill from epoch {latest + 3} would leave "
                f"epochs {latest + 1}..{latest + 2} of DAG {DAG_ID} without a run") in gap.stderr, gap.stderr[-3000:]
        assert fix in gap.stderr, gap.stderr[-3000:]
    headers = {"Authorization": f"Bearer {client.token}"}
    body = {"dag_id": DAG_ID, "from_date": clock.logical_date(latest + 3).isoformat(),
            "to_date": clock.logical_date(latest + 4).isoformat(), "reprocess_behavior": "failed"}
    for path in ("/api/v2/backfills", "/api/v2/backfills/dry_run"):
        answer = httpx.post(f"{airflow_stack.base_url}{path}", headers=headers, json=body)
        assert answer.status_code == 422 and fix in answer.text, (path, answer.status_code, answer.text)
    assert client.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["total_entries"] == runs_before
    assert client.request("GET", "/api/v2/backfills", params={"dag_id": DAG_ID})["total_entries"] == backfills_before

    done = airflow_stack.airflow("dags", "trigger", DAG_ID, "-l", nxt)
    assert f"manual__epoch-{latest + 1}" in done.stdout, done.stdout[-2000:]
    assert client.wait_for_run(DAG_ID, f"manual__epoch-{latest + 1}", progress=print) == "success"
    _assert_tables_equal_the_failure_free_run(local_store, list(range(1, latest + 2)))


def _cli_env(airflow_stack: AirflowStack, store: StoreConfig) -> dict[str, str]:
    """What the ``falkirk`` command reads: the store and Airflow's URL and admin credentials."""
    return {**store.env(), "FALKIRK_AIRFLOW_URL": airflow_stack.base_url, "FALKIRK_AIRFLOW_USER": "admin",
            "FALKIRK_AIRFLOW_PASSWORD": "admin"}


def _clear_with_downstream(client, run_id: str, task_id: str) -> list[dict]:
    """Airflow's Clear of one task instance of ``run_id`` with its downstream (the UI's default);
    returns the instances cleared."""
    return client.request("POST", f"/api/v2/dags/{DAG_ID}/clearTaskInstances", json={
        "dry_run": False, "task_ids": [task_id], "dag_run_id": run_id, "only_failed": False,
        "include_downstream": True, "include_upstream": False, "reset_dag_runs": True})["task_instances"]


def _make_far_ahead_run(airflow_stack: AirflowStack, epoch: int) -> None:
    import subprocess

    subprocess.run([str(airflow_stack.venv_bin / "python"), "-c", _FAR_AHEAD_RUN, DAG_ID, str(epoch)], check=True,
                   env=airflow_stack.env(), cwd=airflow_stack.home, capture_output=True, text=True)


# A DAG run made past the timetable's checks (by an older deployment, or in the metadata database
# by hand), as Airflow's own CLI would make it.
_FAR_AHEAD_RUN = """
import sys
from airflow.models.dagbag import DBDagBag
from airflow.utils.session import create_session
from airflow.utils.state import DagRunState
from airflow.utils.types import DagRunTriggeredByType, DagRunType
dag_id, epoch = sys.argv[1], int(sys.argv[2])
with create_session() as session:
    dag = DBDagBag().get_latest_version_of_dag(dag_id, session=session)
    interval = dag.timetable.interval(epoch)
    dag.create_dagrun(run_id=f"manual__epoch-{epoch}", logical_date=interval.start, data_interval=interval,
                      run_after=interval.end, run_type=DagRunType.MANUAL, triggered_by=DagRunTriggeredByType.CLI,
                      state=DagRunState.QUEUED, session=session)
"""


def test_a_far_ahead_run_is_refused_by_its_stateful_task_and_planned_around_naming_the_discard_that_withdraws_it(
        three_epochs, airflow_stack: AirflowStack, local_store: StoreConfig, monkeypatch, capsys) -> None:
    """A run four epochs past the DAG's latest runs: its stateless ingest commits, its stateful
    aggregate refuses to start across the gap and names ``falkirk discard --dag D --epochs N-``;
    ``falkirk plan --failed-task '*'`` says that most of its re-runs are epochs without a run, with
    the same discard, instead of a table of them; the discard withdraws the run (printing the
    epoch the next trigger makes) and the tables equal the failure-free run's."""

    from falkirk.plugins.cli import main

    client = airflow_stack.client()
    for k, v in _cli_env(airflow_stack, local_store).items():
        monkeypatch.setenv(k, v)
    clock = dag_epoch_clock()
    latest = clock.epoch_of(client.latest_logical_date(DAG_ID))
    far = latest + 4
    _make_far_ahead_run(airflow_stack, far)
    run_id = f"manual__epoch-{far}"
    assert client.wait_for_run(DAG_ID, run_id, progress=print) == "failed"
    tis = client.task_instances(DAG_ID, run_id)
    assert {t: ti["state"] for t, ti in tis.items()} == {
        "ingest": "success", "aggregate": "failed", "publish": "upstream_failed"}, tis
    log = client.task_log(DAG_ID, run_id, "aggregate", tis["aggregate"]["try_number"])
    assert (f"If epochs {latest + 1}..{far - 1} have no DAG run (this run's date was far ahead by mistake), withdraw "
            f"this run and the ones after it instead (it previews; add --yes): falkirk discard --dag {DAG_ID} "
            f"--epochs {far}-") in log, log[-3000:]

    assert main(["plan", "--dag", DAG_ID, "--failed-task", "*"]) == 0
    out = capsys.readouterr().out
    assert (f"re-runs are epochs {latest + 1}..{far - 1}, which have no DAG run: the DAG's runs jump from epoch "
            f"{latest} to {far}") in out and f"falkirk discard --dag {DAG_ID} --epochs {far}-" in out, out
    assert "clear-downstream re-runs" not in out, out  # the note stands instead of the table

    assert main(["discard", "--dag", DAG_ID, "--epochs", f"{far}-"]) == 0
    out = capsys.readouterr().out
    assert f"do it with: falkirk discard --dag {DAG_ID} --epochs {far}-{far} --yes" in out, out
    assert main(["discard", "--dag", DAG_ID, "--epochs", f"{far}-", "--yes"]) == 0
    assert f"discarded epochs {far}..{far} of {DAG_ID}; its next epoch is {latest + 1}" in capsys.readouterr().out
    assert client.latest_logical_date(DAG_ID) == clock.logical_date(latest)
    assert max(e.epoch for e in Ledger(local_store).entries(DAG_ID)) == latest
    _assert_tables_equal_the_failure_free_run(local_store, list(range(1, latest + 1)), withdrawn=(far,))


MISTAKES = PROJECT_ROOT / "docs" / "howto" / "mistakes.md"
PAGE_LATEST = 14  # the page's DAG `orders`: one epoch a day from 2026-01-01, its latest run epoch 14


def _page_commands() -> list[list[str]]:
    """The mistakes page's command blocks (fenced without a language), in page order."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    fence: str | None = None  # the info string of the open fence
    for line in MISTAKES.read_text().splitlines():
        if fence is None and line.startswith("```"):
            fence, current = line[3:].strip(), []
        elif fence is not None and line == "```":
            if fence == "" and current:
                blocks.append(current)
            fence, current = None, None
        elif current is not None:
            current.append(line)
    return blocks


def _as_here(line: str, latest: int, run_ids: dict[int, str]) -> str:
    """A page command for ``falkirk_orders`` at its ``latest`` epoch: the page's DAG, epochs and
    dates moved by as many epochs as the two DAGs' latest runs are apart (both clocks are daily
    from 2026-01-01), and a run id the one of the run of that epoch here (``run_ids``)."""
    shift = latest - PAGE_LATEST
    clock = dag_epoch_clock()
    line = re.sub(r"--run manual__epoch-(\d+)", lambda m: f"--run {run_ids[int(m[1]) + shift]}", line)

    def date(m: re.Match) -> str:
        epoch = clock.epoch_of(datetime.fromisoformat(m[1]).replace(tzinfo=timezone.utc)) + shift
        moved = clock.logical_date(epoch)
        return moved.isoformat() if m[2] else moved.date().isoformat()

    line = re.sub(r"(?<!\w)orders\b", DAG_ID, line)
    line = re.sub(r"--epochs (\d+)(-?)(\d*)", lambda m: f"--epochs {int(m[1]) + shift}{m[2]}"
                  + (str(int(m[3]) + shift) if m[3] else ""), line)
    return re.sub(r"(2026-\d\d-\d\d)(T00:00:00\+00:00)?", date, line)


def test_the_mistakes_pages_commands_do_what_it_says(three_epochs, airflow_stack: AirflowStack,
                                                    local_store: StoreConfig) -> None:
    """Each command of ``docs/howto/mistakes.md``, in page order, on falkirk_orders in the state
    its section describes (a run far ahead; ledger rows of a deleted run): each exits 0, and the
    tables then equal the failure-free run's."""
    import shlex
    import subprocess

    client = airflow_stack.client()
    clock = dag_epoch_clock()
    env = {**airflow_stack.env(), **_cli_env(airflow_stack, local_store)}
    ledger = Ledger(local_store)
    blocks = _page_commands()
    assert [b[0].split()[:2] for b in blocks] == [
        ["falkirk", "trigger"], ["airflow", "dags"], ["falkirk", "discard"], ["falkirk", "discard"],
        ["falkirk", "discard"], ["falkirk", "keep"], ["airflow", "backfill"]], blocks
    withdrawn: list[int] = []
    start = clock.epoch_of(client.latest_logical_date(DAG_ID))
    for block in blocks:
        latest = clock.epoch_of(client.latest_logical_date(DAG_ID))
        far = 329 + latest - PAGE_LATEST
        if "--epochs 329-" in block[0]:  # "A run far ahead of the others"
            _make_far_ahead_run(airflow_stack, far)
            assert client.wait_for_run(DAG_ID, f"manual__epoch-{far}", progress=print) == "failed"
            withdrawn.append(far)
        elif "--epochs 329" in block[0]:  # "Rows of a run that should not have existed"
            for row in [e for e in ledger.entries(DAG_ID) if e.epoch == latest]:
                # a later incarnation: the section before rolled back this epoch's first one
                assert ledger.append(dataclasses.replace(row, epoch=far, run_id=f"manual__epoch-{far}",
                                                         incarnation=row.incarnation + 1))
        elif block[0].startswith("falkirk keep"):  # "Clear on a finished epoch", kept
            [run] = client.runs_between(DAG_ID, clock.logical_date(latest), clock.logical_date(latest))
            _clear_with_downstream(client, run["dag_run_id"], "ingest")
            assert client.wait_for_run(DAG_ID, run["dag_run_id"], progress=print) == "failed"
        run_ids = {e: r["dag_run_id"] for r in client.runs_between(DAG_ID, clock.logical_date(max(1, latest - 2)),
                                                                   clock.logical_date(latest))
                   if (e := clock.epoch_of(datetime.fromisoformat(r["logical_date"].replace("Z", "+00:00"))))}
        for line in block:
            argv = shlex.split(_as_here(line, latest, run_ids))
            if argv[0] == "airflow":
                done = airflow_stack.airflow(*argv[1:], check=False)
            else:
                done = subprocess.run([str(airflow_stack.venv_bin / "falkirk"), *argv[1:]], env=env,
                                      capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, (line, done.stdout[-3000:], done.stderr[-3000:])
            print(f"$ {shlex.join(argv)}\n{done.stdout[-1500:]}")
        if block[0].split()[:2] in (["falkirk", "trigger"], ["airflow", "dags"]):
            assert client.wait_for_run(DAG_ID, f"manual__epoch-{latest + 1}", progress=print) == "success"
        if block[0].startswith("airflow backfill"):
            [backfill] = [b for b in client.request("GET", "/api/v2/backfills", params={"dag_id": DAG_ID})["backfills"]
                          if b["completed_at"] is None] or [None]
            if backfill is not None:
                wait_until("the page's backfill", lambda: client.request(
                    "GET", f"/api/v2/backfills/{backfill['id']}")["completed_at"] is not None, 900,
                    airflow_stack.services, interval=3)
            assert clock.epoch_of(client.latest_logical_date(DAG_ID)) == latest + 2
    final = clock.epoch_of(client.latest_logical_date(DAG_ID))
    assert {e.epoch for e in ledger.entries(DAG_ID)} == set(range(1, final + 1))
    runs = client.runs_between(DAG_ID, clock.logical_date(start), clock.logical_date(final))
    assert sorted((clock.epoch_of(datetime.fromisoformat(r["logical_date"].replace("Z", "+00:00"))), r["state"])
                  for r in runs) == [(e, "success") for e in range(start, final + 1)], runs
    assert withdrawn and min(withdrawn) > final
    # the epochs discarded here and by the tests above stay in the tables until a collection
    _assert_tables_equal_the_failure_free_run(local_store, list(range(1, final + 1)),
                                              withdrawn=tuple(range(final + 1, 400)))


def test_a_refused_clear_of_a_completed_run_is_kept_as_advised_and_the_run_ends_green(
        three_epochs, airflow_stack: AirflowStack, local_store: StoreConfig, monkeypatch, capsys) -> None:
    """Airflow's Clear of the latest run's ingest, with downstream: ingest's job refuses (the epoch
    completed), its downstream end upstream_failed, the run fails. The refusal names
    ``falkirk keep``; as advised, it marks the three instances and the run success, changing no
    table, and the next epoch then runs on them."""
    from falkirk.plugins.cli import main

    client = airflow_stack.client()
    for k, v in _cli_env(airflow_stack, local_store).items():
        monkeypatch.setenv(k, v)
    clock = dag_epoch_clock()
    latest = clock.epoch_of(client.latest_logical_date(DAG_ID))
    [run] = client.runs_between(DAG_ID, clock.logical_date(latest), clock.logical_date(latest))
    run_id = run["dag_run_id"]
    before = snapshot(local_store)
    _clear_with_downstream(client, run_id, "ingest")
    assert client.wait_for_run(DAG_ID, run_id, progress=print) == "failed"
    tis = client.task_instances(DAG_ID, run_id)
    assert {t: ti["state"] for t, ti in tis.items()} == {
        "ingest": "failed", "aggregate": "upstream_failed", "publish": "upstream_failed"}, tis
    log = client.task_log(DAG_ID, run_id, "ingest", tis["ingest"]["try_number"])
    assert f"    falkirk keep --dag {DAG_ID} --run {run_id} --yes" in log, log[-3000:]

    assert main(["keep", "--dag", DAG_ID, "--run", run_id]) == 0
    out = capsys.readouterr().out
    assert (f"keep DAG run {run_id} of {DAG_ID} (epoch {latest}) as committed: marks publish, aggregate, ingest "
            f"success, then the run") in out, out
    assert client.dag_run(DAG_ID, run_id)["state"] == "failed"  # a preview changes nothing
    assert main(["keep", "--dag", DAG_ID, "--run", run_id, "--yes"]) == 0
    capsys.readouterr()
    assert client.dag_run(DAG_ID, run_id)["state"] == "success"
    assert {ti["state"] for ti in client.task_instances(DAG_ID, run_id).values()} == {"success"}
    time.sleep(5)  # nothing Airflow might clear or start after the marks
    assert client.dag_run(DAG_ID, run_id)["state"] == "success"
    assert {ti["state"] for ti in client.task_instances(DAG_ID, run_id).values()} == {"success"}
    assert snapshot(local_store) == before
    assert main(["keep", "--dag", DAG_ID, "--run", run_id]) == 2
    assert "already success; nothing to keep" in capsys.readouterr().err
    assert main(["keep", "--dag", DAG_ID, "--run", "no-such-run"]) == 2
    assert "has no run of an epoch with that id" in capsys.readouterr().err

    client.trigger(DAG_ID, run_id_of(latest + 1), clock.logical_date(latest + 1))
    assert client.wait_for_run(DAG_ID, run_id_of(latest + 1), progress=print) == "success"
    _assert_tables_equal_the_failure_free_run(local_store, list(range(1, latest + 2)),
                                              withdrawn=tuple(range(latest + 2, 400)))  # discarded above
