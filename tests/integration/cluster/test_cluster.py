"""The distributed shape for real (``make cluster-demo``, run once here): Airflow on PostgreSQL
with the CeleryExecutor on Redis and two Celery workers, each with its own scratch disk; a
Spark standalone master with two workers that cannot see those disks, behind a Spark Connect
server; the durable store on ``moto_server``; the query statistics in PostgreSQL.

The reference application runs 8 epochs as ``falkirk_figure1`` (asking for worker-a) beside a
failure-free copy on worker-b. From epoch 2 it asks for worker-b too, and placement keeps it
where its scratch state is; before epoch 6 worker-a is killed and its disk deleted; the
``--lost-worker`` plan is replayed through Airflow. Every table but the scratch tier is written
by the executors (``FALKIRK_DRIVER_WRITE_MAX_ROWS=0``): a scratch table written there would
land on a disk no reader looks at, and the table checks would fail.

The tests check, each on its own evidence: the plan against the re-run set derived by hand;
which worker ran what, before and after the loss; the tables against the copy's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.cluster import ClusterServers
from devstack.cluster_demo import DAG_ID, REFERENCE, TASKS, ClusterOutcome, run_cluster_demo
from falkirk.spark_jobs.figure1.data import QUERIES_PER_EPOCH

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory, cluster_servers: ClusterServers) -> ClusterOutcome:
    return run_cluster_demo(tmp_path_factory.mktemp("cluster") / "run", epochs=8, move_at=2, lose_at=6,
                            records=5_000, extra_env={"FALKIRK_DRIVER_WRITE_MAX_ROWS": "0"}, servers=cluster_servers)


def test_the_lost_worker_plan_reruns_the_set_derived_by_hand_and_less_than_clear_downstream(outcome) -> None:
    plan = outcome.plan
    # By hand: worker-a held every scratch table of falkirk_figure1: events' and answers' outputs
    # (ephemeral), rank's outputs, and rank's state except epoch 3's durable copy. rank restores
    # epoch 3 and redoes 4-8, which reads events 4-8 again: events re-sends them, so popularity
    # (which logged what it made of events 1-5) rolls back to 3 as well, and its epoch 4 reads
    # events 2-4 (a window of three), whose outputs 2 and 3 were on worker-a's disk: events, which
    # keeps no state, redoes 2 and 3 too. answers and stats follow rank. Epochs 6-8 had runs
    # waiting on worker-a's queue, so the plan goes up to 8.
    expected = {(t, e) for t in TASKS for e in range(4, 9)} | {("events", 2), ("events", 3)}
    assert plan.rerun_set() == expected
    assert {t.task_id: t.kept_through for t in plan.tasks} == dict.fromkeys(TASKS, 3)
    assert plan.task("rank").restore_from.epoch == 3 and plan.task("rank").restore_from.tier == "durable"
    assert all(not t.rereads for t in plan.tasks)  # nothing is read back from the lost disk
    # Airflow's clear with downstream and future, from the first epoch worker-a held (events 1): all 40
    assert len(plan.clear_downstream_set()) == 40 > len(plan.rerun_set()) == 27
    assert plan.table() in outcome.planned and "lost worker worker-a" in outcome.planned


def test_each_copy_ran_on_one_worker_and_placement_held_the_scratch_state_when_asked_to_move(outcome) -> None:
    before = range(1, outcome.lose_at)
    # which worker ran what (Airflow's hostname): every task instance of each copy on its worker,
    # falkirk_figure1's epochs 2-5 on worker-a although the DAG then asked for worker-b
    assert outcome.placed[DAG_ID] == {(t, e): "worker-a" for t in TASKS for e in before}
    assert outcome.placed[REFERENCE] == {(t, e): "worker-b" for t in TASKS for e in before}
    scratch_a = outcome.store.worker_scratch("worker-a")
    assert (f"rank epoch 5: restoring the state of epoch 4 from scratch "
            f"({scratch_a}/{DAG_ID}/rank/state on worker-a)") in outcome.logs["rank", 5, 1]


def test_with_placement_held_every_table_equalled_the_copys_before_the_loss(outcome) -> None:
    # read where the ledger put them: falkirk_figure1's scratch tables on worker-a's disk,
    # the copy's on worker-b's, the durable ones on S3
    assert [(name, ok) for name, ok, _ in outcome.held_checks] == [(name, True) for name, _, _ in outcome.held_checks]
    assert len(outcome.held_checks) == 8
    assert sum("(scratch)" in name for name, _, _ in outcome.held_checks) == 4  # 3 outputs and rank's state
    assert all(outcome.store.worker_scratch("worker-a") in detail for name, _, detail in outcome.held_checks
               if "(scratch)" in name)


def test_the_lost_workers_runs_waited_on_its_queue_and_the_reruns_restored_durable_state_on_the_other(outcome) -> None:
    stuck = outcome.stuck["events"]
    assert stuck["queue"] == "worker-a" and stuck["state"] in ("scheduled", "queued")
    assert outcome.reran_on == {k: "worker-b" for k in outcome.plan.rerun_set()}
    assert (f"rank epoch 4: restoring the state of epoch 3 from durable "
            f"({outcome.store.durable_uri}/{DAG_ID}/rank/state)") in outcome.logs["rank", 4, 2]
    rows = {(e.task_id, e.epoch): e for e in outcome.ledger}
    assert sorted(rows) == sorted((t, e) for t in TASKS for e in range(1, 9))
    assert {rows[k].worker for k in outcome.plan.rerun_set()} == {"worker-b"}
    assert {rows[t, e].worker for t in TASKS for e in range(1, 4) if (t, e) not in outcome.plan.rerun_set()} == {
        "worker-a"}


def test_every_table_and_the_postgres_query_table_equal_the_failure_free_copys(outcome) -> None:
    assert outcome.checks and all(ok for _, ok, _ in outcome.checks), [c for c in outcome.checks if not c[1]]
    assert len([c for c in outcome.checks if c[0].startswith("table ")]) == 8  # 5 outputs, rank's state x2, stats'
    assert outcome.query_db.startswith("postgresql://") and outcome.query_rows == 8 * QUERIES_PER_EPOCH
    # stats re-delivered epochs 4 and 5 once each, as incarnation 1 (the replay rolled them back);
    # epochs 1-3 stand as first delivered, and 6-8, which waited on worker-a's queue, were
    # delivered for the first time by the replay, as incarnation 0: each as its ledger row says
    assert outcome.query_deliveries == [(e, 1 if e in (4, 5) else 0, QUERIES_PER_EPOCH) for e in range(1, 9)]
    stats = {e.epoch: e.incarnation for e in outcome.ledger if e.task_id == "stats"}
    assert [(e, stats[e], QUERIES_PER_EPOCH) for e in range(1, 9)] == outcome.query_deliveries


def test_the_jobs_ran_on_the_standalone_cluster_blind_to_the_scratch_disks(outcome) -> None:
    assert [a["name"] for a in outcome.spark["activeapps"]] == ["falkirk-connect"]
    assert [w["coresused"] for w in outcome.spark["workers"]] == [1, 1]  # executors on both Spark workers
    if not outcome.spark_blind_to_scratch:
        pytest.skip("mount namespaces are not allowed here: the Spark workers could see the scratch disks")
    assert outcome.spark_blind_to_scratch
