"""One Airflow (LocalExecutor, PostgreSQL), its tasks clients of the session's Spark Connect server,
for every recovery drill.

PostgreSQL rather than SQLite: the drills trigger and clear while tasks report their state, and
on SQLite a trigger (Airflow logs the action and commits in the API server's event loop) can
wait a minute for the write lock held by a request that needs that same loop to finish, stalling
every component's heartbeat.

Six copies of ``falkirk_clicks`` (source Ephemeral -> clean Batch(log) -> model
LazyCheckpoint(every=3) -> sink EagerCheckpoint) run side by side:

* ``clicks_ref`` runs epochs 1-6 without failure: the reference;
* ``clicks_a``: clean's epoch 4 is killed (a failed task instance, read from Airflow);
* ``clicks_b``: after epoch 4 the DAG's scratch directory is deleted (lost scratch); model's
  epoch 5 then fails with "state lost";
* ``clicks_c``: epoch 4's batch was delivered with eight events twice; it is corrected
  afterwards and the epoch declared bad;
* ``clicks_k``: as ``clicks_b``, but only epoch 5 follows the loss: epoch 6 arrives during
  its recovery, whose executor is killed again and again (``test_replay_faults.py``);
* ``clicks_g``: runs epochs 1-6 cleanly; a collection races its recovery.

A seventh, ``clicks_s``, whose jobs' clock runs a minute ahead, stays paused until its own
drill runs it (``test_replay_faults.py``).

The fixture is package-scoped: the drills share the roughly 140 task instances it runs.
"""

from __future__ import annotations

import shutil

import pytest

from devstack.airflow import AirflowStack, migrated_database
from devstack.demo import run_id_of
from devstack.servers import PostgresServer
from devstack.spark import SparkConnectServer
from falkirk.policies.store import StoreConfig
from falkirk.spark_jobs.clicks.feed import clicks_for_epoch, deliver
from tests.integration.recovery.drill import (A, B, C, DAGS, DUPLICATED, EPOCHS, REF, SUCCESS, Drill, G, K, clock,
                                              wait_states)

BLOCKED = {"source": {"success"}, "clean": {"success"}, "model": {None}, "sink": {None}}
STATE_LOST = {"source": {"success"}, "clean": {"success"}, "model": {"failed"}, "sink": {"upstream_failed"}}


@pytest.fixture(scope="package")
def drill(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer, postgres: PostgresServer):
    root = tmp_path_factory.mktemp("drill")
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    inbox, faults = root / "inbox", root / "faults"
    for dag in (REF, A, B, C, K, G):
        for e in EPOCHS:
            deliver(inbox, dag, e, clicks_for_epoch(e))
    deliver(inbox, C, 4, clicks_for_epoch(4) + DUPLICATED)
    faults.write_text(f"{A}/clean:4:before-commit\n")
    stack = AirflowStack(home=root / "airflow", store=store, dags_folder=DAGS, database_url=migrated_database(postgres, "drill"),
                         extra_env={
                             **spark_connect.airflow_env(),
                             "FALKIRK_INBOX": str(inbox), "FALKIRK_CRASH_AT": f"@{faults}",
                             # Short enough for the fault drills: a replay thread's lease, the time
                             # the scheduler gives a killed task instance before it fails it, and how
                             # often a new scheduler resets the task instances a dead one had queued
                             # or was running.
                             "FALKIRK_LEASE_SECONDS": "30",
                             "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
                             "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15"})
    stack.init()
    stack.start()
    try:
        client = stack.client()
        epochs_clock = clock()
        for dag in (REF, A, B, C, K, G):
            client.wait_for_dag(dag)
            client.set_paused(dag, False)
        # clicks_b and clicks_k first: their scratch is deleted once their first four epochs
        # are done, while the other DAGs' runs (already queued) keep the executor busy. On
        # two cores the whole setup is about 140 task instances, hence the generous waits.
        for dag, epochs in ((B, EPOCHS[:4]), (K, EPOCHS[:4]), (REF, EPOCHS), (A, EPOCHS), (C, EPOCHS),
                            (G, EPOCHS)):
            for e in epochs:
                client.trigger(dag, run_id_of(e), epochs_clock.logical_date(e))
        for dag, later in ((B, (5, 6)), (K, (5,))):
            wait_states(client, dag, {e: SUCCESS for e in EPOCHS[:4]}, timeout=2400)
            shutil.rmtree(root / "scratch" / dag)  # the worker's directory for the DAG is gone
            for e in later:
                client.trigger(dag, run_id_of(e), epochs_clock.logical_date(e))
        for dag in (REF, C, G):
            wait_states(client, dag, {e: SUCCESS for e in EPOCHS}, timeout=1800)
        wait_states(client, A, {**{e: SUCCESS for e in (1, 2, 3)}, 4: {
            "source": {"success"}, "clean": {"failed"}, "model": {"upstream_failed"},
            "sink": {"upstream_failed"}}, 5: BLOCKED, 6: BLOCKED})
        wait_states(client, B, {5: STATE_LOST, 6: BLOCKED})
        wait_states(client, K, {5: STATE_LOST})
        faults.write_text("")  # the fault is fixed
        yield Drill(stack, store, client, inbox)
    finally:
        stack.stop()
