"""Recovery through real Airflow, Spark (Connect) and Delta: plan, replay, and compare with a
failure-free run of the same six epochs (the drill DAGs are described in ``conftest.py``).

Each plan's re-run set is checked against the brute force of ``tests/unit/test_recovery.py``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter

import pytest

from devstack.demo import run_id_of
from falkirk.plugins.recovery import plan, replay
from falkirk.policies.planning.recovery import PlanError
from falkirk.policies.regimes import Tier
from falkirk.policies.store.ledger import Ledger
from falkirk.policies.planning.recovery_log import LeaseHeld, RecoveryLog
from falkirk.spark_jobs.clicks.feed import clicks_for_epoch, deliver
from tests.integration.recovery.drill import (A, B, C, DUPLICATED, EPOCHS, REF, SUCCESS, TASKS, Drill,
                                              assert_equals_reference, check_minimal, rows, snapshot, tries,
                                              wait_states)

pytestmark = pytest.mark.integration


def test_a_failed_task_instance_read_from_airflow(drill: Drill, monkeypatch, capsys) -> None:
    from falkirk.plugins.cli import main

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
    # the smallest plan that fixes it: model's own scratch directory, not the worker (which is alive)
    assert f"Recover with: falkirk plan --dag {B} --lost-scratch {drill.store.scratch_uri}/{B}/model" in model5

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
    events = Counter(r["event"] for r in RecoveryLog(drill.store).events(B) if r["plan_id"] == p.plan_id
                     and r["event"] != "heartbeat")  # lease renewals: as many as the replay took time
    assert events == {"planned": 1, "started": 1, "finished": 1}
    assert_equals_reference(drill.store, B, lost_scratch=True)

    before = (snapshot(drill.store, B), tries(drill.client, B), len(Ledger(drill.store).invalidations.keys(B)))
    again = replay(p.plan_id, drill.store, drill.stack.client(), progress=print)
    assert again.already_done and not again.cleared
    assert (snapshot(drill.store, B), tries(drill.client, B), len(Ledger(drill.store).invalidations.keys(B))) == before


def test_c_bad_epoch_and_the_naive_clear_downstream_it_replaces(drill: Drill) -> None:
    deliver(drill.inbox, C, 4, clicks_for_epoch(4))  # the corrected batch
    p = plan(C, drill.store, drill.client, bad_epochs=[("source", 4)])
    check_minimal(p, drill.store, C, bad=("source", 4))
    assert {t.task_id: t.rerun for t in p.tasks if t.rerun} == {
        "source": (4,), "clean": (4,), "model": (4, 5, 6), "sink": (4, 5, 6)}

    # Airflow's clear with downstream and future from source's epoch 4, for real. Re-running a
    # completed epoch would find it committed and keep it (the duplicated events would stay
    # counted twice behind green task instances), so each re-run of source is refused, naming
    # the plan, and what is downstream of it does not run: visibly not done, nothing changed.
    for e in (4, 5, 6):
        drill.client.clear(C, run_id_of(e), list(TASKS))
    refused = {"source": {"failed"}, "clean": {"upstream_failed"}, "model": {"upstream_failed"},
               "sink": {"upstream_failed"}}
    wait_states(drill.client, C, {e: refused for e in (4, 5, 6)})
    assert all(tr == 2 for (e, t), (_, tr) in tries(drill.client, C).items() if e >= 4 and t == "source")
    log = drill.client.task_log(C, run_id_of(4), "source", 2)
    assert f"falkirk plan --dag {C} --bad-epoch source:4" in log and "falkirk replay PLAN_ID" in log, log[-3000:]
    ref = {dict(r)["item"]: dict(r) for r in rows(drill.store, REF, "model", "state", Tier.DURABLE)
           if dict(r)["epoch"] == 6}
    stale = {dict(r)["item"]: dict(r) for r in rows(drill.store, C, "model", "state", Tier.DURABLE)
             if dict(r)["epoch"] == 6}
    extra = Counter()
    for r in DUPLICATED:
        if r["qty"] >= 1:
            extra[r["item"]] += r["qty"]
    # The duplicated events are still counted twice, and nothing in Airflow says otherwise is done.
    assert {i: stale[i]["total_qty"] - ref[i]["total_qty"] for i in ref} == {i: extra.get(i, 0) for i in ref}
    assert sum(extra.values()) > 0

    assert Ledger(drill.store).dag_version(C) == p.ledger_version  # the refused re-runs committed nothing
    # The replay marks the kept epochs' refused instances (source, clean at 5 and 6) success, and
    # Airflow clears what failed downstream of them: model and sink at 5 and 6, the plan's re-runs.
    before = tries(drill.client, C)
    report = replay(p.plan_id, drill.store, drill.stack.client(), progress=print)
    assert report.cleared == {"epoch-4": ("clean", "model", "sink", "source")}
    wait_states(drill.client, C, {e: SUCCESS for e in EPOCHS})
    ran = {(t, e) for (e, t), (_, tr) in tries(drill.client, C).items() if tr > before[e, t][1]}
    assert ran == set(p.rerun_set())  # exactly the plan's re-runs ran again
    assert_equals_reference(drill.store, C)
    # Airflow's runs list agrees: every epoch the replay settled is a successful DAG run
    assert {e: drill.client.dag_run(C, run_id_of(e))["state"] for e in EPOCHS} == {e: "success" for e in EPOCHS}


def test_bad_requests_change_nothing(drill: Drill) -> None:
    log, ledger = RecoveryLog(drill.store), Ledger(drill.store)
    before = (len(log.events()), len(ledger.invalidations.keys()), ledger.version(), tries(drill.client, A))
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
    assert (len(log.events()), len(ledger.invalidations.keys()), ledger.version(), tries(drill.client, A)) == before


def test_a_pass_reads_every_watched_run_with_its_instances_in_one_listing_of_each(drill: Drill, monkeypatch) -> None:
    """The replay's observer reads the watched runs and their task instances through two
    listings (task instances by run, runs from the earliest one on), page by page: the same as
    reading each run and its task instances one at a time, and a run Airflow does not hold is
    left out. Both are reads that write nothing: Airflow's audit log gains no row (its POST
    listing writes one per call, which on SQLite once held the API server and the scheduler for
    the database's whole busy timeout)."""
    import sqlalchemy

    import falkirk.plugins.airflow_rest as rest

    def audited() -> int:  # Airflow's audit log, read in its database: its API hides the rows of DAG "~"
        assert drill.stack.database_url is not None
        engine = sqlalchemy.create_engine(drill.stack.database_url)
        try:
            with engine.connect() as db:
                return db.execute(sqlalchemy.text("SELECT count(*) FROM log")).scalar_one()
        finally:
            engine.dispose()

    monkeypatch.setattr(rest, "PAGE", 5)  # several pages: the drill's DAG has 4 tasks a run
    run_ids = [run_id_of(e) for e in (2, 4, 5, 6)]
    logged = audited()
    batched = drill.client.runs_with_instances(A, [*run_ids, "epoch-99"])
    assert drill.client.runs_with_instances(A, run_ids).keys() == batched.keys()  # the run_after kept, read again
    assert audited() == logged
    # Only the wanted runs' span is listed: one run's 4 task instances fit one page of 5, and the
    # runs listing holds that run alone (its run_after already read above).
    sent: list[str] = []
    drill.client.http.event_hooks["request"].append(lambda request: sent.append(request.url.path))
    try:
        assert list(drill.client.runs_with_instances(A, [run_ids[0]])) == [run_ids[0]]
    finally:
        drill.client.http.event_hooks["request"].pop()
    assert sent == [f"/api/v2/dags/{A}/dagRuns/~/taskInstances", f"/api/v2/dags/{A}/dagRuns"]
    assert sorted(batched) == sorted(run_ids)
    for run_id in run_ids:
        run, tis = batched[run_id]
        assert run["state"] == drill.client.dag_run(A, run_id)["state"]
        assert {p: ti["state"] for p, ti in tis.items()} == {
            p: ti["state"] for p, ti in drill.client.task_instances(A, run_id).items()}
        assert sorted(str(p) for p in tis) == sorted(TASKS)
    assert drill.client.runs_with_instances(A, ["epoch-99"]) == {}


def test_two_recoveries_of_different_plans_on_one_dag(drill: Drill) -> None:
    """Two plans for clicks_a, computed from the same ledger (sink's epoch 6 declared bad; model's
    epoch 5 declared bad), replayed at once: one takes the lease, the other is refused with
    LeaseHeld and changes nothing. Once the first finished, the second plan is stale: it is
    refused naming the way out, planned again, and replayed. Each instance re-ran once per
    plan that re-ran it, and every table equals the failure-free run."""
    base = tries(drill.client, A)
    plans = {"sink": plan(A, drill.store, drill.client, bad_epochs=[("sink", 6)]),
             "model": plan(A, drill.store, drill.client, bad_epochs=[("model", 5)])}
    assert plans["sink"].ledger_version == plans["model"].ledger_version
    outcomes: dict[str, object] = {}
    started = threading.Barrier(2)

    def run(name: str) -> None:
        client = drill.stack.client()
        started.wait()
        try:
            outcomes[name] = replay(plans[name].plan_id, drill.store, client, holder=name, progress=print)
        except (LeaseHeld, PlanError) as exc:  # PlanError if it looked only after the invalidations
            outcomes[name] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (loser,) = [n for n, o in outcomes.items() if isinstance(o, (LeaseHeld, PlanError))]
    (winner,) = set(plans) - {loser}
    print(f"{winner} replayed; {loser} refused: {outcomes[loser]}")
    log = RecoveryLog(drill.store)
    assert [r["event"] for r in log.events(A) if r["plan_id"] == plans[loser].plan_id] == ["planned"]
    with pytest.raises(PlanError, match=f"plan {plans[loser].plan_id}: the ledger changed since the plan was "
                                        f"computed"):
        replay(plans[loser].plan_id, drill.store, drill.client)
    failure = [("sink", 6)] if loser == "sink" else [("model", 5)]
    again = plan(A, drill.store, drill.client, bad_epochs=failure)
    assert again.rerun_set() == plans[loser].rerun_set()  # the same work, now from the current ledger
    replay(again.plan_id, drill.store, drill.stack.client(), progress=print)
    assert_equals_reference(drill.store, A)
    after = tries(drill.client, A)
    ran = Counter([*plans[winner].rerun_set(), *again.rerun_set()])
    assert {k: after[k[1], k[0]][1] - base[k[1], k[0]][1] for k in ran} == dict(ran)
    assert all(after[k] == base[k] for k in base if (k[1], k[0]) not in ran)


def test_a_re_run_killed_after_its_commit_is_settled_without_running_it_again(drill: Drill) -> None:
    """model's redo of epoch 6 commits and records its epoch completed, and its process is
    SIGKILLed before Airflow hears of it (as when the scheduler running it is killed): Airflow
    shows it failed. Running it again would be refused (the epoch is completed), so the replay
    marks it success instead, naming why.

    The replay is held, once it sees model failed, until Airflow has failed epoch 6's run too
    (sink upstream_failed); then the scheduler is frozen (SIGSTOP). Marking model success makes
    Airflow clear sink and queue the run; a scheduler that decided the run failed just before
    that writes its decision after it (injected here by writing it to Airflow's database while
    the scheduler is frozen, so that it cannot start sink first), and is thawed. Airflow never
    starts an instance of a failed run, so the replay queues the run again. sink's epoch 6 then
    runs, the replay finishes, and model's epoch 6 ran exactly once."""
    faults = drill.inbox.parent / "faults"
    base = tries(drill.client, A)
    p = plan(A, drill.store, drill.client, bad_epochs=[("model", 6)])
    assert sorted(p.rerun_set()) == [("model", 6), ("sink", 6)]
    faults.write_text(f"{A}/model:6:after-completion:once\n")
    said: list[str] = []

    def progress(message: str) -> None:
        said.append(message)
        print(message)
        if re.search(r"epoch 6\s+model\s+failed$", message):
            deadline = time.monotonic() + 300
            while drill.client.dag_run(A, run_id_of(6)).get("state") != "failed":
                assert time.monotonic() < deadline, "Airflow did not fail epoch 6's run"
                time.sleep(1)
            _freeze_scheduler_between_transactions(drill)
        if message.startswith(f"plan {p.plan_id}: model of epoch 6 failed after the redo had committed"):
            _scheduler_writes_run_state(drill, A, run_id_of(6), "failed")
            drill.stack.thaw("scheduler")

    try:
        replay(p.plan_id, drill.store, drill.client, progress=progress, timeout=600)
    finally:
        drill.stack.thaw("scheduler")
        faults.write_text("")
    assert any(f"plan {p.plan_id}: model of epoch 6 failed after the redo had committed" in m and
               m.endswith("marked success") for m in said), said
    assert f"plan {p.plan_id}: {run_id_of(6)} was failed with instances this plan re-runs not started; " \
           f"queued it again" in said, said
    log = drill.client.task_log(A, run_id_of(6), "model", base[6, "model"][1] + 1)
    assert "injected crash: model epoch 6 at after-completion" in log, log[-3000:]
    after = tries(drill.client, A)
    assert {k: (after[k][0], after[k][1] - base[k][1]) for k in [(6, "model"), (6, "sink")]} == {
        (6, "model"): ("success", 1), (6, "sink"): ("success", 1)}
    assert {k: v for k, v in after.items() if k not in [(6, "model"), (6, "sink")]} == {
        k: v for k, v in base.items() if k not in [(6, "model"), (6, "sink")]}
    assert [e.incarnation for e in Ledger(drill.store).entries(A, "model") if e.epoch == 6] == [
        max(e.incarnation for e in Ledger(drill.store).entries(A, "model", include_invalidated=True) if e.epoch == 6)]
    assert_equals_reference(drill.store, A)


def _freeze_scheduler_between_transactions(drill: Drill, timeout: float = 60) -> None:
    """SIGSTOP the scheduler at a moment none of the database's sessions is inside a
    transaction: frozen inside one, it would hold its row locks, and the API server's writes
    would wait for its thaw."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(drill.stack.database_url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            drill.stack.freeze("scheduler")
            with engine.connect() as conn:
                busy = conn.execute(sqlalchemy.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                    "pid <> pg_backend_pid() AND state IN ('active', 'idle in transaction')")).scalar_one()
            if not busy:
                return
            drill.stack.thaw("scheduler")
            assert time.monotonic() < deadline, "no moment without an open transaction to freeze the scheduler at"
            time.sleep(0.05)
    finally:
        engine.dispose()


def _scheduler_writes_run_state(drill: Drill, dag_id: str, run_id: str, state: str) -> None:
    """A scheduler's decision on a DAG run landing after a change it did not see: written to
    Airflow's database directly, as the scheduler writes it."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(drill.stack.database_url)
    try:
        with engine.begin() as conn:
            changed = conn.execute(sqlalchemy.text("UPDATE dag_run SET state = :state WHERE dag_id = :dag AND "
                                                   "run_id = :run"), {"state": state, "dag": dag_id, "run": run_id})
            assert changed.rowcount == 1
    finally:
        engine.dispose()
