"""Faults of the recovery itself, injected for real through Airflow, Spark (Connect) and Delta.

Three copies of ``falkirk_clicks`` run six epochs in one Airflow:

* ``clicks_ref`` without failure: the reference;
* ``clicks_k``: after epoch 4 the DAG's scratch directory is lost; the replay is killed
  (SIGKILL) half-way through its clears, a second replay and a garbage collection are refused
  while the dead executor's lease is live, and once it expires ``falkirk replay`` resumes it;
* ``clicks_g``: an epoch is declared bad, and a garbage collection runs between the plan and the
  replay, deleting checkpoints and logged inputs the plan relies on: the replay refuses, and the
  recovery completes by planning again.

Marked ``faults``: run with ``make test-faults`` (about 15 minutes).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from devstack.airflow import AirflowStack
from devstack.demo import run_id_of
from devstack.processes import VENV_BIN
from devstack.spark import SparkConnectServer
from plugins.airflow_rest import AirflowClient
from plugins.recovery import plan, replay
from plugins.view import recovery_history
from policies.ledger import Ledger
from policies.recovery import PlanError
from policies.recovery_log import RecoveryLog
from policies.store import StoreConfig
from spark_jobs.clicks.feed import clicks_for_epoch, deliver
from tests.integration.test_recovery_replay import EPOCHS, SUCCESS, _clock, assert_equals_reference, tries, wait_states

pytestmark = [pytest.mark.integration, pytest.mark.faults]

DAGS = Path(__file__).resolve().parents[1] / "integration" / "recovery_dags"
REF, K, G = "clicks_ref", "clicks_k", "clicks_g"


@dataclass
class Drill:
    stack: AirflowStack
    store: StoreConfig
    client: AirflowClient


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("faults")
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    inbox = root / "inbox"
    for dag in (REF, K, G):
        for e in EPOCHS:
            deliver(inbox, dag, e, clicks_for_epoch(e))
    with SparkConnectServer(root) as connect:
        stack = AirflowStack(home=root / "airflow", store=store, dags_folder=DAGS, extra_env={
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1",
                                                      "port": connect.port}),
            "FALKIRK_INBOX": str(inbox)})
        stack.init()
        stack.start()
        try:
            client = stack.client()
            clock = _clock()
            for dag in (REF, K, G):
                client.wait_for_dag(dag)
                client.set_paused(dag, False)
            for dag, epochs in ((K, EPOCHS[:4]), (REF, EPOCHS), (G, EPOCHS)):
                for e in epochs:
                    client.trigger(dag, run_id_of(e), clock.logical_date(e))
            wait_states(client, K, {e: SUCCESS for e in EPOCHS[:4]}, timeout=1800)
            shutil.rmtree(root / "scratch" / K)  # the worker's directory for clicks_k is gone
            for e in (5, 6):
                client.trigger(K, run_id_of(e), clock.logical_date(e))
            wait_states(client, REF, {e: SUCCESS for e in EPOCHS})
            wait_states(client, G, {e: SUCCESS for e in EPOCHS})
            blocked = {"source": {"success"}, "clean": {"success"}, "model": {None}, "sink": {None}}
            wait_states(client, K, {5: {"source": {"success"}, "clean": {"success"}, "model": {"failed"},
                                        "sink": {"upstream_failed"}}, 6: blocked})
            yield Drill(stack, store, client)
        finally:
            stack.stop()
def falkirk(drill: Drill, *args: str, crash: str = "", lease_seconds: int = 30,
            timeout: float = 900) -> subprocess.CompletedProcess:
    """The ``falkirk`` command as a user runs it, in its own process (so that it can be killed)."""
    env = {**os.environ, **drill.store.env(), "FALKIRK_AIRFLOW_URL": drill.stack.base_url,
           "FALKIRK_AIRFLOW_USER": "admin", "FALKIRK_AIRFLOW_PASSWORD": "admin",
           "FALKIRK_LEASE_SECONDS": str(lease_seconds), "FALKIRK_CRASH_AT": crash}
    proc = subprocess.run([str(VENV_BIN / "falkirk"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    print(f"$ falkirk {' '.join(args)} -> {proc.returncode}\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
    return proc


def test_a_replay_killed_half_way_resumes_and_clears_only_what_did_not_run(drill: Drill) -> None:
    p = plan(K, drill.store, drill.client, lost_scratch=[f"{drill.store.scratch_uri}/{K}"])
    assert {t.task_id: t.rerun for t in p.tasks if t.rerun} == {"model": (4, 5, 6), "sink": (4, 5, 6)}
    before = tries(drill.client, K)

    killed = falkirk(drill, "replay", p.plan_id, crash=f"{K}/replay:4:after-clear")
    assert killed.returncode == -signal.SIGKILL
    assert f"plan {p.plan_id}: cleared epoch 4" in killed.stdout and "cleared epoch 5" not in killed.stdout
    log = RecoveryLog(drill.store)
    assert [r["event"] for r in log.events(K) if r["plan_id"] == p.plan_id and r["event"] != "heartbeat"] == \
        ["planned", "started"]  # no executor will ever end it

    # While the dead executor's lease is live, a second replay and a collection are refused.
    again = falkirk(drill, "replay", p.plan_id)
    assert again.returncode == 2 and f"is being recovered by plan {p.plan_id}" in again.stderr
    assert "falkirk release --dag clicks_k" in again.stderr
    gc = falkirk(drill, "gc", "--dag", K)
    assert gc.returncode == 2 and f"is being recovered by plan {p.plan_id}" in gc.stderr

    lease = log.running(K)
    wait_seconds = (lease.expires_at(30) - datetime.now(timezone.utc)).total_seconds() + 1
    time.sleep(max(wait_seconds, 0))
    resumed = falkirk(drill, "replay", p.plan_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout and f"plan {p.plan_id}: done, 6 task instances re-ran" in resumed.stdout
    assert "invalidated 0 ledger rows" in resumed.stdout  # made by the first executor, not again

    lifecycle = [r["event"] for r in log.events(K) if r["plan_id"] == p.plan_id and r["event"] != "heartbeat"]
    assert lifecycle == ["planned", "started", "expired", "resumed", "finished"]
    history = [h for h in recovery_history(log.events(K)) if h["plan_id"] == p.plan_id]
    assert len(history) == 1 and history[0]["resumptions"] == 1 and history[0]["outcome"] == "finished"
    after = tries(drill.client, K)
    rerun = {(e, t) for t, e in p.rerun_set()}
    # Every re-run instance was cleared exactly once (the resumption did not clear epoch 4 again).
    assert {k: after[k][1] - before[k][1] for k in rerun} == {k: 1 for k in rerun}
    assert {k: v for k, v in after.items() if k not in rerun} == {k: v for k, v in before.items() if k not in rerun}
    assert_equals_reference(drill.store, K, lost_scratch=True)


def test_a_collection_between_plan_and_replay_is_refused_and_planning_again_recovers(drill: Drill) -> None:
    p = plan(G, drill.store, drill.client, bad_epochs=[("clean", 2)])
    assert {t.task_id: t.rerun for t in p.tasks if t.rerun} == {"clean": (2,), "model": (2, 3, 4, 5, 6),
                                                                 "sink": (2, 3, 4, 5, 6)}
    assert (p.task("model").restore_from.epoch, p.task("sink").restore_from.epoch) == (1, 1)
    gc = falkirk(drill, "gc", "--dag", G, "--retain-hours", "0")
    assert gc.returncode == 0 and "deleted epochs" in gc.stdout
    before = (tries(drill.client, G), len(Ledger(drill.store).invalidated(G)))

    with pytest.raises(PlanError, match=rf"plan {p.plan_id} can no longer run: it restores or re-reads "
                                        rf".*model's state of epoch 1 .*which the store no longer holds"):
        replay(p.plan_id, drill.store, drill.stack.client(), progress=print)
    assert (tries(drill.client, G), len(Ledger(drill.store).invalidated(G))) == before  # nothing changed

    again = plan(G, drill.store, drill.client, bad_epochs=[("clean", 2)])
    assert again.plan_id != p.plan_id and again.task("model").restore_from is None  # from the start now
    report = replay(again.plan_id, drill.store, drill.stack.client(), progress=print)
    assert len(report.cleared) == 6
    assert_equals_reference(drill.store, G)
