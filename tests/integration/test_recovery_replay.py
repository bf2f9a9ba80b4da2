"""Recovery through real Airflow, Spark (Connect) and Delta: plan, replay, and compare with a
failure-free run of the same six epochs.

Four copies of ``falkirk_clicks`` (source Ephemeral -> clean Batch(log) -> model
LazyCheckpoint(every=3) -> sink EagerCheckpoint) run side by side in one Airflow:

* ``clicks_ref`` runs epochs 1-6 without failure: the reference;
* ``clicks_a``: clean's epoch 4 is killed (a failed task instance, read from Airflow);
* ``clicks_b``: after epoch 4 the DAG's scratch directory is deleted (lost scratch); model's
  epoch 5 then fails with "state lost";
* ``clicks_c``: epoch 4's batch was delivered with eight events twice; it is corrected
  afterwards and the epoch declared bad.

Each plan's re-run set is checked against the brute force of ``tests/unit/test_recovery.py``.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from deltalake import DeltaTable

from devstack.airflow import AirflowStack
from devstack.demo import run_id_of
from devstack.spark import SparkConnectServer
from plugins.airflow_rest import AirflowClient, AirflowError
from plugins.recovery import plan, replay
from policies.epoch_tables import open_table, scan
from policies.ledger import Ledger
from policies.recovery import PlanError
from policies.recovery_log import LeaseHeld, RecoveryLog
from policies.regimes import Tier
from policies.store import StoreConfig
from spark_jobs.clicks.feed import clicks_for_epoch, deliver
from tests.oracle import canonical
from tests.unit.test_recovery import oracle

HERE = Path(__file__).resolve().parent
REF, A, B, C = "clicks_ref", "clicks_a", "clicks_b", "clicks_c"
EPOCHS = list(range(1, 7))
TASKS = ("source", "clean", "model", "sink")
TABLES = [("source", "output", Tier.SCRATCH), ("clean", "output", Tier.DURABLE), ("model", "output", Tier.SCRATCH),
          ("model", "state", Tier.SCRATCH), ("model", "state", Tier.DURABLE), ("sink", "output", Tier.DURABLE),
          ("sink", "state", Tier.DURABLE)]
DUPLICATED = clicks_for_epoch(4)[:8]  # clicks_c's wrong delivery of epoch 4: these eight events twice


@dataclass
class Drill:
    stack: AirflowStack
    store: StoreConfig
    client: AirflowClient
    inbox: Path
    stale_plan: str = ""


def wait_states(client: AirflowClient, dag: str, expected: dict[int, dict[str, set]], timeout: float = 900) -> None:
    """Wait until each (epoch, task) is in one of its expected states (None: never ran)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        client.on_poll()
        now = {e: {t: ti["state"] for t, ti in client.task_instances(dag, run_id_of(e)).items()} for e in expected}
        if all(now[e].get(t) in ok for e, want in expected.items() for t, ok in want.items()):
            return
        bad = [(e, t) for e in now for t, s in now[e].items() if s == "failed" and "failed" not in expected[e].get(t, ())]
        if bad or time.monotonic() > deadline:
            why = "a task failed" if bad else f"still not there after {timeout:.0f} s"
            raise AssertionError(f"{dag}: {why}: states {now}, expected {expected}; task logs under the Airflow home")
        time.sleep(2)


SUCCESS = {t: {"success"} for t in TASKS}


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("drill")
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    inbox, faults = root / "inbox", root / "faults"
    for dag in (REF, A, B, C):
        for e in EPOCHS:
            deliver(inbox, dag, e, clicks_for_epoch(e))
    deliver(inbox, C, 4, clicks_for_epoch(4) + DUPLICATED)
    faults.write_text(f"{A}/clean:4:before-commit\n")
    with SparkConnectServer(root) as connect:
        stack = AirflowStack(home=root / "airflow", store=store, dags_folder=HERE / "recovery_dags", extra_env={
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1",
                                                      "port": connect.port}),
            "FALKIRK_INBOX": str(inbox), "FALKIRK_CRASH_AT": f"@{faults}"})
        stack.init()
        stack.start()
        try:
            client = stack.client()
            clock = _clock()
            for dag in (REF, A, B, C):
                client.wait_for_dag(dag)
                client.set_paused(dag, False)
            # clicks_b first: its scratch is deleted once its first four epochs are done, while
            # the other DAGs' runs (already queued) keep the executor busy. On two cores the
            # whole setup is about 100 task instances, hence the generous wait.
            for dag, epochs in ((B, EPOCHS[:4]), (REF, EPOCHS), (A, EPOCHS), (C, EPOCHS)):
                for e in epochs:
                    client.trigger(dag, run_id_of(e), clock.logical_date(e))
            wait_states(client, B, {e: SUCCESS for e in EPOCHS[:4]}, timeout=1800)
            shutil.rmtree(root / "scratch" / B)  # the worker's directory for clicks_b is gone
            for e in (5, 6):
                client.trigger(B, run_id_of(e), clock.logical_date(e))
            wait_states(client, REF, {e: SUCCESS for e in EPOCHS})
            wait_states(client, C, {e: SUCCESS for e in EPOCHS})
            blocked = {"source": {"success"}, "clean": {"success"}, "model": {None}, "sink": {None}}
            wait_states(client, A, {**{e: SUCCESS for e in (1, 2, 3)}, 4: {
                "source": {"success"}, "clean": {"failed"}, "model": {"upstream_failed"},
                "sink": {"upstream_failed"}}, 5: blocked, 6: blocked})
            wait_states(client, B, {5: {"source": {"success"}, "clean": {"success"}, "model": {"failed"},
                                        "sink": {"upstream_failed"}}, 6: blocked})
            faults.write_text("")  # the fault is fixed
            yield Drill(stack, store, client, inbox)
        finally:
            stack.stop()


def _clock():
    from devstack.demo import dag_epoch_clock

    return dag_epoch_clock(HERE.parents[1] / "dags" / "falkirk_clicks.py")


def rows(store: StoreConfig, dag: str, task: str, table: str, tier: Tier) -> list[tuple]:
    uri = store.table_uri(tier, dag, task, table)
    dt = open_table(uri)
    return canonical(scan(dt).to_pylist()) if dt is not None else []


def assert_equals_reference(store: StoreConfig, dag: str, lost_scratch: bool = False) -> None:
    """Every output and state table equals the reference's, row for row; scratch tables of a
    lost scratch directory hold only epochs written since, and those equal the reference's."""
    for task, table, tier in TABLES:
        ref, got = rows(store, REF, task, table, tier), rows(store, dag, task, table, tier)
        if lost_scratch and tier is Tier.SCRATCH:
            epochs = {dict(r)["epoch"] for r in got}
            ref = [r for r in ref if dict(r)["epoch"] in epochs]
        assert got == ref, f"{dag}: {task}/{table} ({tier.value}) differs from the failure-free run"
    sink = [(dict(r)["epoch"], dict(r)["item"]) for r in rows(store, dag, "sink", "output", Tier.DURABLE)]
    assert len(sink) == len(set(sink)) == 3 * len(EPOCHS)  # published exactly once per epoch


def check_minimal(p, store: StoreConfig, dag: str, bad=None, scratch_lost=False) -> None:
    frontiers, redo = oracle(Ledger(store).entries(dag), len(EPOCHS), bad, scratch_lost)
    assert {t.task_id: t.frontier for t in p.tasks} == frontiers
    assert p.rerun_set() == redo
    ours, theirs = len(p.rerun_set()), len(p.clear_downstream_set())
    print(f"{dag}: {'; '.join(f.describe() for f in p.failures)}: re-runs {ours} task instances, "
          f"clear-downstream {theirs}")
    assert ours < theirs and p.rerun_set() < p.clear_downstream_set()


def tries(client: AirflowClient, dag: str) -> dict[tuple[int, str], tuple]:
    return {(e, t): (ti["state"], ti["try_number"]) for e in EPOCHS
            for t, ti in client.task_instances(dag, run_id_of(e)).items()}


def test_a_failed_task_instance_read_from_airflow(drill: Drill, monkeypatch, capsys) -> None:
    from plugins.cli import main

    for k, v in {**drill.store.env(), "FALKIRK_AIRFLOW_USER": "admin", "FALKIRK_AIRFLOW_PASSWORD": "admin"}.items():
        monkeypatch.setenv(k, v)
    # A plan computed now goes stale once the replay below commits (checked in the bad requests test).
    drill.stale_plan = plan(A, drill.store, drill.client, bad_epochs=[("sink", 6)]).plan_id
    url = drill.stack.base_url
    assert main(["plan", "--dag", A, "--failed-task", "clean", "--airflow-url", url, "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["failures"] == [{"kind": "failed_task", "task_id": "clean", "epoch": 4}]
    p = RecoveryLog(drill.store).plan(body["plan_id"])
    check_minimal(p, drill.store, A)
    assert {t.task_id: t.rerun for t in p.tasks if t.rerun} == {"clean": (4,), "model": (4, 5, 6), "sink": (4, 5, 6)}
    assert p.task("model").restore_from.epoch == 3 and p.task("model").restore_from.tier == "durable"
    assert main(["replay", p.plan_id, "--airflow-url", url]) == 0
    out = capsys.readouterr().out
    print(out)
    assert f"plan {p.plan_id}: done, 7 task instances re-ran" in out
    assert_equals_reference(drill.store, A)
    t = tries(drill.client, A)
    assert t[5, "clean"] == ("success", 1) and t[4, "clean"] == ("success", 2)  # clean 5 kept, 4 re-ran


def test_b_lost_scratch_with_concurrent_replays_and_a_second_replay(drill: Drill) -> None:
    log = drill.stack.home / "logs"
    model5 = "\n".join(p.read_text() for p in log.rglob("*.log") if f"dag_id={B}" in str(p)
                       and "task_id=model" in str(p) and "run_id=epoch-5" in str(p))
    assert "state lost: model's state of epoch 4 was kept in scratch" in model5

    p = plan(B, drill.store, drill.client, lost_scratch=[f"{drill.store.scratch_uri}/{B}"])
    check_minimal(p, drill.store, B, scratch_lost=True)
    assert {t.task_id: t.rerun for t in p.tasks if t.rerun} == {"model": (4, 5, 6), "sink": (4, 5, 6)}

    outcomes: dict[str, object] = {}

    def run(name: str) -> None:
        client = drill.stack.client()
        try:
            outcomes[name] = replay(p.plan_id, drill.store, client, holder=name, progress=print)
        except LeaseHeld as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [n for n, o in outcomes.items() if isinstance(o, LeaseHeld)]
    assert len(refused) == 1, outcomes
    print(f"refused: {outcomes[refused[0]]}")
    events = Counter(r["event"] for r in RecoveryLog(drill.store).events(B) if r["plan_id"] == p.plan_id)
    assert events == {"planned": 1, "started": 1, "finished": 1}
    assert_equals_reference(drill.store, B, lost_scratch=True)

    before = (snapshot(drill.store, B), tries(drill.client, B), len(Ledger(drill.store).invalidated(B)))
    again = replay(p.plan_id, drill.store, drill.stack.client(), progress=print)
    assert again.already_done and not again.cleared
    assert (snapshot(drill.store, B), tries(drill.client, B), len(Ledger(drill.store).invalidated(B))) == before


def test_c_bad_epoch_and_the_naive_clear_downstream_it_replaces(drill: Drill) -> None:
    deliver(drill.inbox, C, 4, clicks_for_epoch(4))  # the corrected batch
    p = plan(C, drill.store, drill.client, bad_epochs=[("source", 4)])
    check_minimal(p, drill.store, C, bad=("source", 4))
    assert {t.task_id: t.rerun for t in p.tasks if t.rerun} == {
        "source": (4,), "clean": (4,), "model": (4, 5, 6), "sink": (4, 5, 6)}

    # Negative control: Airflow's clear with downstream and future from source's epoch 4, for real.
    for e in (4, 5, 6):
        drill.client.clear(C, run_id_of(e), list(TASKS))
    wait_states(drill.client, C, {e: SUCCESS for e in EPOCHS})
    assert all(tr == 2 for (e, _), (_, tr) in tries(drill.client, C).items() if e >= 4)
    ref = {dict(r)["item"]: dict(r) for r in rows(drill.store, REF, "model", "state", Tier.DURABLE)
           if dict(r)["epoch"] == 6}
    naive = {dict(r)["item"]: dict(r) for r in rows(drill.store, C, "model", "state", Tier.DURABLE)
             if dict(r)["epoch"] == 6}
    extra = Counter()
    for r in DUPLICATED:
        if r["qty"] >= 1:
            extra[r["item"]] += r["qty"]
    # Every re-run found its epoch committed and kept it: the duplicated events stay counted twice.
    assert {i: naive[i]["total_qty"] - ref[i]["total_qty"] for i in ref} == {i: extra.get(i, 0) for i in ref}
    assert sum(extra.values()) > 0
    print(f"naive clear-downstream: model's totals at epoch 6 exceed the failure-free run by {dict(extra)}")

    assert Ledger(drill.store).version() == p.ledger_version  # the naive re-runs committed nothing
    report = replay(p.plan_id, drill.store, drill.stack.client(), progress=print)
    assert report.cleared == {"epoch-4": ("clean", "model", "sink", "source"),
                              "epoch-5": ("model", "sink"), "epoch-6": ("model", "sink")}
    assert_equals_reference(drill.store, C)


def test_bad_requests_change_nothing(drill: Drill) -> None:
    log, ledger = RecoveryLog(drill.store), Ledger(drill.store)
    before = (len(log.events()), len(ledger.invalidated()), ledger.version(), tries(drill.client, A))
    with pytest.raises(PlanError, match="Airflow has no DAG 'nope'"):
        plan("nope", drill.store, drill.client, bad_epochs=[("source", 2)])
    with pytest.raises(PlanError, match=r"failures\[0\].task_id: unknown task 'nope'"):
        plan(A, drill.store, drill.client, bad_epochs=[("nope", 2)])
    with pytest.raises(PlanError, match=r"failures\[0\].epoch: 9 is not an epoch that has run; choose one of 1..6"):
        plan(A, drill.store, drill.client, bad_epochs=[("source", 9)])
    with pytest.raises(PlanError, match="--failed-task sink: Airflow reports no failed instance of 'sink'"):
        plan(A, drill.store, drill.client, failed_tasks=["sink"])
    assert drill.stale_plan
    with pytest.raises(PlanError, match=f"plan {drill.stale_plan}: the ledger changed since the plan was computed"):
        replay(drill.stale_plan, drill.store, drill.client)
    with pytest.raises(PlanError, match="plan_id 'feedbeef': no such plan"):
        replay("feedbeef", drill.store, drill.client)
    assert (len(log.events()), len(ledger.invalidated()), ledger.version(), tries(drill.client, A)) == before


def snapshot(store: StoreConfig, dag: str) -> dict:
    out = {}
    for task, table, tier in TABLES:
        uri = store.table_uri(tier, dag, task, table)
        dt = open_table(uri)
        out[f"{task}/{table}/{tier.value}"] = (dt.version(), canonical(scan(dt).to_pylist())) if dt else None
    out["ledger"] = DeltaTable(store.ledger_uri).version()
    return out
