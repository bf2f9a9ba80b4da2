"""Faults of the recovery itself, injected for real through Airflow, Spark (Connect) and Delta
(the drill DAGs are described in ``conftest.py``), each ending by the documented path with every
table equal to the failure-free run. Marked ``faults``: ``make test-faults`` runs only these.
"""

from __future__ import annotations

import os
import random
import signal
import time
from datetime import datetime, timezone

import pytest

from devstack.demo import run_id_of
from falkirk.plugins.recovery import plan, replay
from falkirk.plugins.view import recovery_history
from falkirk.policies.planning.recovery import PlanError
from falkirk.policies.store.ledger import Ledger
from falkirk.policies.planning.recovery_log import RecoveryLog, open_lease
from falkirk.spark_jobs.clicks.feed import clicks_for_epoch, deliver
from tests.integration.recovery.drill import (EPOCHS, REF, TABLES, G, K, SUCCESS, Drill, assert_equals_reference,
                                              clock, falkirk, rows, tries, wait_states)

pytestmark = pytest.mark.faults


def _wait_for_expiry(drill: Drill, dag: str) -> None:
    lease = open_lease(RecoveryLog(drill.store).events(dag), dag)
    time.sleep(max((lease.expires_at(30) - datetime.now(timezone.utc)).total_seconds() + 1, 0))


def test_a_replay_killed_at_each_step_resumes_while_new_runs_arrive(drill: Drill) -> None:
    """clicks_k lost its scratch after epoch 4; epoch 5's model failed. The replay is killed
    (SIGKILL) after taking its lease, after its invalidations, and after its first clear; in
    between, epoch 6 is triggered as the schedule would. Each time the recovery goes on by the
    documented path (``falkirk release``, or the lease's expiry, then ``falkirk replay`` again)."""
    p = plan(K, drill.store, drill.client, lost_scratch=[f"{drill.store.scratch_uri}/{K}"])
    assert {t.task_id: t.rerun for t in p.tasks if t.rerun} == {"model": (4, 5), "sink": (4, 5)}
    rerun = {(e, t) for t, e in p.rerun_set()}
    doomed = [e for e in Ledger(drill.store).entries(K) if (e.epoch, e.task_id) in rerun]
    before = tries(drill.client, K, EPOCHS[:5])
    log = RecoveryLog(drill.store)

    def lifecycle() -> list[str]:
        return [r["event"] for r in log.events(K) if r["plan_id"] == p.plan_id and r["event"] != "heartbeat"]

    # 1. Killed just after taking the lease: nothing invalidated, nothing cleared.
    killed = falkirk(drill, "replay", p.plan_id, crash=f"{K}/replay:0:after-lease")
    assert killed.returncode == -signal.SIGKILL and "invalidated" not in killed.stdout
    assert lifecycle() == ["planned", "started"] and not Ledger(drill.store).invalidations.keys(K)
    # While the dead executor's lease is live, a second replay and a collection are refused.
    again = falkirk(drill, "replay", p.plan_id)
    assert again.returncode == 2 and f"is being recovered by plan {p.plan_id}" in again.stderr
    assert f"falkirk release --dag {K}" in again.stderr
    gc = falkirk(drill, "gc", "--dag", K)
    assert gc.returncode == 2 and f"is being recovered by plan {p.plan_id}" in gc.stderr
    released = falkirk(drill, "release", "--dag", K, "--reason", "its executor was killed")
    assert released.returncode == 0 and p.plan_id in released.stdout
    assert tries(drill.client, K, EPOCHS[:5]) == before

    # The schedule goes on: epoch 6 arrives; its model waits for epoch 5's (depends_on_past).
    drill.client.trigger(K, run_id_of(6), clock().logical_date(6))
    wait_states(drill.client, K, {6: {"source": {"success"}, "clean": {"success"}, "model": {None}}})

    # 2. Killed after the invalidations, before any clear.
    killed = falkirk(drill, "replay", p.plan_id, crash=f"{K}/replay:0:after-invalidations")
    assert killed.returncode == -signal.SIGKILL and "resuming" in killed.stdout
    assert f"invalidated {len(doomed)} ledger rows" in killed.stdout and "cleared epoch" not in killed.stdout
    assert tries(drill.client, K, EPOCHS[:5]) == before

    # 3. Killed half-way through the clears, after epoch 4's.
    _wait_for_expiry(drill, K)
    killed = falkirk(drill, "replay", p.plan_id, crash=f"{K}/replay:4:after-clear")
    assert killed.returncode == -signal.SIGKILL and "invalidated 0 ledger rows" in killed.stdout
    assert f"plan {p.plan_id}: cleared epoch 4" in killed.stdout and "cleared epoch 5" not in killed.stdout

    # 4. Resumed to the end: only epoch 5 is left to clear; epoch 6 follows on its own.
    _wait_for_expiry(drill, K)
    resumed = falkirk(drill, "replay", p.plan_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout and "invalidated 0 ledger rows" in resumed.stdout
    assert "cleared epoch 4" not in resumed.stdout and f"plan {p.plan_id}: cleared epoch 5" in resumed.stdout
    assert f"plan {p.plan_id}: done, 4 task instances re-ran" in resumed.stdout
    wait_states(drill.client, K, {e: SUCCESS for e in EPOCHS})

    assert lifecycle() == ["planned", "started", "released", "resumed", "expired", "resumed", "expired", "resumed",
                           "finished"]
    history = [h for h in recovery_history(log.events(K)) if h["plan_id"] == p.plan_id]
    assert len(history) == 1 and history[0]["resumptions"] == 3 and history[0]["outcome"] == "finished"
    after = tries(drill.client, K)
    # Every re-run instance was cleared exactly once; the rest of epochs 1-5 kept their tries;
    # epoch 6 ran once, after the recovery.
    assert {k: after[k][1] - before[k][1] for k in rerun} == {k: 1 for k in rerun}
    assert {k: v for k, v in after.items() if k not in rerun and k[0] < 6} == \
        {k: v for k, v in before.items() if k not in rerun}
    assert {k: v for k, v in after.items() if k[0] == 6} == {(6, t): ("success", 1) for t in SUCCESS}
    assert_equals_reference(drill.store, K, lost_scratch=True)


def test_a_collection_between_plan_and_replay_is_refused_and_planning_again_recovers(drill: Drill) -> None:
    p = plan(G, drill.store, drill.client, bad_epochs=[("clean", 2)])
    assert {t.task_id: t.rerun for t in p.tasks if t.rerun} == {"clean": (2,), "model": (2, 3, 4, 5, 6),
                                                                 "sink": (2, 3, 4, 5, 6)}
    assert (p.task("model").restore_from.epoch, p.task("sink").restore_from.epoch) == (1, 1)
    gc = falkirk(drill, "gc", "--dag", G, "--retain-hours", "0")
    assert gc.returncode == 0 and "deleted epochs" in gc.stdout
    before = (tries(drill.client, G), len(Ledger(drill.store).invalidations.keys(G)))

    with pytest.raises(PlanError, match=rf"plan {p.plan_id} can no longer run: it restores or re-reads "
                                        rf".*model's state of epoch 1 .*which the store no longer holds"):
        replay(p.plan_id, drill.store, drill.stack.client(), progress=print)
    assert (tries(drill.client, G), len(Ledger(drill.store).invalidations.keys(G))) == before  # nothing changed

    again = plan(G, drill.store, drill.client, bad_epochs=[("clean", 2)])
    assert again.plan_id != p.plan_id and again.task("model").restore_from is None  # from the start now
    report = replay(again.plan_id, drill.store, drill.stack.client(), progress=print)
    assert len(report.cleared) == 6
    assert_equals_reference(drill.store, G)


def test_the_scheduler_and_the_api_server_killed_during_a_replay_from_the_view(drill: Drill) -> None:
    """A replay started through the plugin API (as the view starts it) is carried out by a task
    of ``falkirk_recovery``. The scheduler is SIGKILLed with the task instances it runs (the
    replay's among them), then the API server; both are restarted. Airflow fails the orphaned
    attempt and retries it, and the retry resumes the plan to its end, with nobody's help: it
    waits for (and clears again only what failed of) the re-runs."""
    import httpx

    from falkirk.plugins.supervised import RECOVERY_DAG

    auth = {"Authorization": f"Bearer {drill.client.token}"}
    base = f"{drill.stack.base_url}/falkirk/api/v1/dags/{G}"
    failure = {"bad_epochs": [{"task_id": "clean", "epoch": 5}]}
    preview = httpx.post(f"{base}/preview", headers=auth, json=failure, timeout=120).json()
    # At least these; more when the collection above marked model's and sink's checkpoints
    # collected (a mark covers an epoch's later incarnations too: they re-run from the start).
    assert {("clean", 5), ("model", 5), ("model", 6), ("sink", 5), ("sink", 6)} <= \
        {(t, e) for t, e in preview["rerun"]}
    before = tries(drill.client, G)
    started = httpx.post(f"{base}/recoveries", headers=auth, json={**failure, "ledger_version":
                                                                   preview["ledger_version"]}, timeout=300)
    assert started.status_code == 202, started.text
    plan_id, run = started.json()["plan_id"], started.json()["recovery"]["run_id"]

    deadline = time.monotonic() + 300
    while drill.client.task_instances(G, run_id_of(5))["clean"]["state"] not in ("queued", "running"):
        assert time.monotonic() < deadline, "clean's epoch 5 never started again"
        time.sleep(0.2)
    drill.stack.kill("scheduler")  # with the task processes it runs: the replay's and clean's
    drill.stack.kill("api-server")
    drill.stack.restart("api-server", "scheduler")

    assert drill.client.wait_for_run(RECOVERY_DAG, run, timeout=900) == "success"
    replay_ti = drill.client.task_instances(RECOVERY_DAG, run)["replay"]
    assert replay_ti["try_number"] >= 2  # the killed attempt, then Airflow's retry
    wait_states(drill.client, G, {e: SUCCESS for e in EPOCHS})
    log = RecoveryLog(drill.store)
    lifecycle = [r["event"] for r in log.events(G) if r["plan_id"] == plan_id and r["event"] != "heartbeat"]
    # the retry takes over the lease of the attempt Airflow failed (or finds it expired)
    assert lifecycle[:2] == ["planned", "started"] and lifecycle[-2:] == ["resumed", "finished"], lifecycle
    assert set(lifecycle[2:-2]) <= {"released", "expired", "failed"} and lifecycle[2:-2], lifecycle
    after = tries(drill.client, G)
    rerun = {(e, t) for t, e in preview["rerun"]}
    assert all(after[k][1] > before[k][1] for k in rerun) and all(after[k][0] == "success" for k in after)
    assert {k: v for k, v in after.items() if k not in rerun} == {k: v for k, v in before.items() if k not in rerun}
    assert_equals_reference(drill.store, G)


def test_random_interleavings_of_killed_replays_collections_and_new_runs(drill: Drill) -> None:
    """A seeded loop (``FALKIRK_DRILL_SEED``, printed; two rounds on clicks_k): each round declares
    an epoch of sink or model bad (its input unchanged, so the failure-free result still holds),
    and draws whether a collection runs between plan and replay, where the replay is SIGKILLed
    (not at all, after its lease, after its invalidations, after its first clear), whether a new
    DAG run arrives then, and whether the dead executor's lease is released or left to expire.
    Each round ends by the documented path: release or wait, ``falkirk replay`` again, or, for
    a plan a collection made stale, ``falkirk plan`` and ``falkirk replay`` anew. After every
    round each table equals the failure-free run and each epoch is published once."""
    seed = int(os.environ.get("FALKIRK_DRILL_SEED", "20261123"))
    rng = random.Random(seed)
    # Two rounds, drawn so that they differ: two failures, two kill points, one collection.
    failures = rng.sample([("sink", 4), ("sink", 5), ("sink", 6), ("model", 5), ("model", 6)], 2)
    kills = rng.sample([None, "after-lease", "after-invalidations", "after-clear"], 2)
    collecting = rng.randrange(2)
    rounds = [{"failure": failures[i], "gc": i == collecting, "kill": kills[i],
               "new_run": i == 0 and rng.random() < 0.5, "end": rng.choice(["release", "expiry"])} for i in range(2)]
    print(f"FALKIRK_DRILL_SEED={seed}: {rounds}")
    epochs = list(EPOCHS)
    settle_k(drill)
    if any(r["new_run"] for r in rounds):  # the failure-free copy runs the new epoch too
        deliver(drill.inbox, REF, 7, clicks_for_epoch(7))
        deliver(drill.inbox, K, 7, clicks_for_epoch(7))
        drill.client.trigger(REF, run_id_of(7), clock().logical_date(7))
        wait_states(drill.client, REF, {7: SUCCESS})
    log = RecoveryLog(drill.store)
    for n, r in enumerate(rounds, 1):
        print(f"round {n}: {r}")
        p = plan(K, drill.store, drill.client, bad_epochs=[r["failure"]])
        if r["gc"]:
            gc = falkirk(drill, "gc", "--dag", K, "--retain-hours", "0")
            assert gc.returncode == 0, gc.stderr
        crash = ""
        if r["kill"] == "after-clear":
            crash = f"{K}/replay:{min(e for _, e in p.rerun_set())}:after-clear"
        elif r["kill"]:
            crash = f"{K}/replay:0:{r['kill']}"
        first = falkirk(drill, "replay", p.plan_id, crash=crash)
        stale = first.returncode == 2 and ("can no longer run" in first.stderr
                                           or "the ledger changed since the plan was computed" in first.stderr)
        if stale:
            assert r["gc"], first.stderr  # only a collection makes a fresh plan stale
            p = plan(K, drill.store, drill.client, bad_epochs=[r["failure"]])
            first = falkirk(drill, "replay", p.plan_id, crash=crash)
        if r["new_run"]:
            drill.client.trigger(K, run_id_of(7), clock().logical_date(7))
            epochs = [*EPOCHS, 7]
        if crash and first.returncode == -signal.SIGKILL:
            refused = falkirk(drill, "gc", "--dag", K)
            assert refused.returncode == 2 and f"is being recovered by plan {p.plan_id}" in refused.stderr
            if r["end"] == "release":
                released = falkirk(drill, "release", "--dag", K, "--reason", f"random round {n}: executor killed")
                assert released.returncode == 0, released.stderr
            else:
                _wait_for_expiry(drill, K)
            resumed = falkirk(drill, "replay", p.plan_id)
            assert resumed.returncode == 0, resumed.stderr
            assert "resuming" in resumed.stdout
        else:
            assert first.returncode == 0, first.stderr  # a clear-point past the plan's epochs never fires
        wait_states(drill.client, K, {e: SUCCESS for e in epochs})
        events = [e["event"] for e in log.events(K) if e["plan_id"] == p.plan_id and e["event"] != "heartbeat"]
        assert events[0] == "planned" and events[-1] == "finished" and events.count("finished") == 1, events
        assert_equals_reference(drill.store, K, lost_scratch=True)


def settle_k(drill: Drill) -> None:
    """clicks_k as its drill leaves it (every epoch recovered), also when this test runs alone."""
    if Ledger(drill.store).find(K, "sink", 6) is None:
        p = plan(K, drill.store, drill.client, lost_scratch=[f"{drill.store.scratch_uri}/{K}"])
        drill.client.trigger(K, run_id_of(6), clock().logical_date(6))
        replay(p.plan_id, drill.store, drill.stack.client(), progress=print)
        wait_states(drill.client, K, {e: SUCCESS for e in EPOCHS})
    assert_equals_reference(drill.store, K, lost_scratch=True)


def test_a_later_epoch_stamped_by_a_clock_ahead_is_swept_by_the_order_of_the_stores_commits(drill: Drill) -> None:
    """clicks_s's jobs run on a worker whose clock is a minute ahead (``clock_ahead/``). Its epoch
    1 was delivered with eight events twice, and is corrected; the replay of the plan that redoes
    it is killed just after taking its lease, and epoch 3 commits meanwhile, built on epoch 2's
    state, which the plan rolls back. Resumed, the replay sweeps epoch 3 too: a row's place is
    the rollbacks its job checked, not its stamp, which says epoch 3 was computed a minute after
    the rollback (a sweep by stamps, even allowing seconds of skew, kept it: running totals and a
    published top 3 built on the duplicated events). Every table then equals the failure-free
    run's through epoch 3."""
    s = "clicks_s"
    client = drill.client
    client.wait_for_dag(s)
    client.set_paused(s, False)
    deliver(drill.inbox, s, 1, clicks_for_epoch(1) + clicks_for_epoch(1)[:8])
    deliver(drill.inbox, s, 2, clicks_for_epoch(2))
    for e in (1, 2):
        client.trigger(s, run_id_of(e), clock().logical_date(e))
    wait_states(client, s, {e: SUCCESS for e in (1, 2)})
    deliver(drill.inbox, s, 1, clicks_for_epoch(1))  # the corrected batch
    p = plan(s, drill.store, client, bad_epochs=[("source", 1)])
    assert {t.task_id: t.rerun for t in p.tasks if t.rerun} == {
        "source": (1,), "clean": (1,), "model": (1, 2), "sink": (1, 2)}
    killed = falkirk(drill, "replay", p.plan_id, crash=f"{s}/replay:0:after-lease")
    assert killed.returncode == -signal.SIGKILL and "invalidated" not in killed.stdout

    deliver(drill.inbox, s, 3, clicks_for_epoch(3))
    client.trigger(s, run_id_of(3), clock().logical_date(3))
    wait_states(client, s, {3: SUCCESS})
    model_3 = Ledger(drill.store).find(s, "model", 3)
    assert model_3.committed_at > datetime.now(timezone.utc)  # stamped by the clock a minute ahead
    before = tries(client, s, [1, 2, 3])
    released = falkirk(drill, "release", "--dag", s, "--reason", "its executor was killed")
    assert released.returncode == 0, released.stderr
    resumed = falkirk(drill, "replay", p.plan_id)
    assert resumed.returncode == 0, resumed.stderr
    # Epoch 3 of every task downstream of one the plan redoes, or stateful and redone: model and
    # sink; and clean, downstream of source (its epoch 3 needed no redo, and is redone once).
    assert f"plan {p.plan_id}: invalidated 3 rows of later DAG runs computed from rolled-back epochs" in resumed.stdout
    wait_states(client, s, {e: SUCCESS for e in (1, 2, 3)})
    after = tries(client, s, [1, 2, 3])
    assert {(t, e) for (e, t), (_, n) in after.items() if n > before[e, t][1]} == {
        *p.rerun_set(), ("clean", 3), ("model", 3), ("sink", 3)}
    for task, table, tier in TABLES:
        ref = [r for r in rows(drill.store, REF, task, table, tier) if dict(r)["epoch"] <= 3]
        assert rows(drill.store, s, task, table, tier) == ref, f"{s}: {task}/{table} ({tier.value})"
