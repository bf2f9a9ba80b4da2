"""A recovery started through the Falkirk API is carried out by a task of the ``falkirk_recovery``
DAG: the API server is SIGKILLed and started again while it runs, and the task's own first attempt
is SIGKILLed right after its first clear; Airflow's retry resumes the plan, and every table ends
equal to the failure-free run's, each re-run instance having run exactly once more."""

from __future__ import annotations

import time

from devstack.demo import run_id_of
from devstack.processes import wait_until
from falkirk.plugins.supervised import RECOVERY_DAG
from falkirk.policies.planning.recovery_log import RecoveryLog
from falkirk.policies.store.ledger import Ledger
from tests.integration.recovery.drill import EPOCHS, SUCCESS, C, Drill, assert_equals_reference, tries, wait_states


def test_a_recovery_started_from_the_api_outlives_the_api_server_and_its_own_killed_attempt(drill: Drill) -> None:
    faults = drill.inbox.parent / "faults"
    client = drill.client
    before = tries(client, C)
    faults.write_text(f"{C}/replay:5:after-clear:once\n")  # the task's first attempt dies after its first clear
    try:
        started = client.request("POST", f"/falkirk/api/v1/dags/{C}/recoveries", json={
            "bad_epochs": [{"task_id": "model", "epoch": 5}], "ledger_version": Ledger(drill.store).dag_version(C)})
        assert started["status"] == "queued" and started["recovery"]["dag_id"] == RECOVERY_DAG
        run, plan_id = started["recovery"]["run_id"], started["plan_id"]

        def attempt() -> tuple[str | None, int]:
            ti = client.task_instances(RECOVERY_DAG, run)["replay"]
            return ti.get("state"), ti.get("try_number") or 0

        # Airflow retries the killed attempt; while the retry waits for the re-runs, the API
        # server goes down and comes back.
        wait_until("the recovery task's second attempt to run", lambda: attempt() == ("running", 2), timeout=600)
        drill.stack.kill("api-server")
        time.sleep(5)
        drill.stack.restart("api-server")
        assert client.wait_for_run(RECOVERY_DAG, run, timeout=900) == "success"
    finally:
        faults.write_text("")
    first = client.task_log(RECOVERY_DAG, run, "replay", 1)
    assert "injected crash: replay epoch 5 at after-clear" in first, first[-3000:]
    last = client.task_instances(RECOVERY_DAG, run)["replay"]["try_number"]
    assert last >= 2  # Airflow's retry (another, if the API server was down when one started)
    resumed = client.task_log(RECOVERY_DAG, run, "replay", last)
    assert f"plan {plan_id}: resuming" in resumed and f"plan {plan_id}: done, 4 task instances re-ran" in resumed, \
        resumed[-3000:]
    wait_states(client, C, {e: SUCCESS for e in EPOCHS})
    after = tries(client, C)
    rerun = {(5, "model"), (5, "sink"), (6, "model"), (6, "sink")}
    assert {k: after[k][1] - before[k][1] for k in after} == {k: int(k in rerun) for k in after}
    assert_equals_reference(drill.store, C)
    # the retry took over the lease its killed attempt held (or found it expired), resumed, finished
    events = [r["event"] for r in RecoveryLog(drill.store).events(C) if r["plan_id"] == plan_id
              and r["event"] != "heartbeat"]
    assert events[:2] == ["planned", "started"] and events[-2:] == ["resumed", "finished"], events
    assert events[2:-2] and set(events[2:-2]) <= {"released", "expired", "failed", "resumed"}, events
    assert {client.dag_run(C, run_id_of(e))["state"] for e in EPOCHS} == {"success"}
