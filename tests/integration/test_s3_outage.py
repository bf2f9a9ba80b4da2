"""The S3-compatible server stops in the middle of a task's commits and in the middle of a
replay's invalidations, then comes back: the commit is retried or fails with an error that
says what to do, never leaving a half-visible epoch, a doubled one, or a torn ledger.

The store is ``moto_server`` behind :class:`devstack.s3_outage.S3Outage`, which closes the
server's port at an exact request (with that request applied or not) and opens it again with
every object in place, as a restarted MinIO would. Jobs run as clients of the session's Spark
Connect server (their executors write through the same endpoint); the replay runs through a
real Airflow (scheduler and API server, LocalExecutor) whose tasks are clients of it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from deltalake import DeltaTable

from devstack.airflow import PROJECT_ROOT, AirflowStack
from devstack.demo import DAG_ID, dag_epoch_clock, run_epochs
from devstack.processes import VENV_BIN
from devstack.s3 import MotoS3
from devstack.s3_outage import S3Outage
from devstack.spark import SparkConnectServer
from falkirk.policies import EagerCheckpoint, Ephemeral, Ledger, StoreConfig, Tier
from falkirk.policies.job_spec import JobSpec
from falkirk.policies.planning.recovery import FailedTask, RecoveryPlan
from falkirk.policies.store.commits import scan
from falkirk.policies.planning.recovery_log import RecoveryLog, open_lease
from tests.oracle import canonical, expected_tables

pytestmark = pytest.mark.integration

JOBS = PROJECT_ROOT / "spark_jobs" / "pipeline"
JOB_DAG = "outage_orders"  # the jobs run by hand; falkirk_orders runs in Airflow


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer):
    work = tmp_path_factory.mktemp("s3-outage")
    with MotoS3(work) as s3, S3Outage(s3.endpoint, work) as front:
        s3.create_bucket("falkirk-outage")
        store = StoreConfig("s3://falkirk-outage/store", str(work / "scratch"), front.storage_options())
        yield front, store, work, spark_connect


def rows(store: StoreConfig, dag: str, task: str, table: str, tier: Tier = Tier.DURABLE) -> tuple[int, list]:
    uri = store.table_uri(tier, dag, task, table)
    dt = DeltaTable(uri, storage_options=store.options_for(uri))
    return dt.version(), canonical(scan(dt).to_pylist())


def expected(epochs: list[int], name: str) -> list:
    return canonical(expected_tables(epochs)[name])


def submit_while(front: S3Outage, spark: SparkConnectServer, job: Path, spec: JobSpec, env: dict[str, str],
                 down_for: float | None):
    """Run ``job``; once the front has tripped, bring it back after ``down_for`` seconds (or, for
    ``None``, only after the job ended). Returns the job's result and the requests dropped."""
    result: list = []
    runner = threading.Thread(target=lambda: result.append(spark.submit(job, spec.argv(), env)))
    runner.start()
    tripped = front.wait_tripped(timeout=300)
    if down_for is None:
        runner.join()
    else:
        time.sleep(down_for)
    front.up()
    runner.join()
    return result[0], tripped["dropped"]


def test_a_lease_the_store_took_without_answering_is_recognised_as_its_holders(outage) -> None:
    """The server applies a replay's ``started`` row and stops before it answers; back 2 s later.
    The executor asks again, finds its own token, and holds the lease: no LeaseHeld, no second row."""
    front, store, _, _ = outage
    log = RecoveryLog(store)
    recovery = RecoveryPlan("lease_dag", (FailedTask("a", 2),), 2, 7, ())
    log.record(recovery)
    front.down_at("PUT", "/_falkirk/recoveries/_delta_log/", applied=True)
    back = threading.Thread(target=lambda: (front.wait_tripped(timeout=60), time.sleep(2), front.up()))
    back.start()
    lease = log.begin(recovery, holder="alice")
    back.join()
    assert front.state()["dropped"] and front.state()["tripped"]
    assert [(r["event"], r["holder"]) for r in log.events("lease_dag")][1:] == [("started", "alice")]
    assert open_lease(log.events("lease_dag"), "lease_dag").token == lease.token
    assert log.end(lease, "finished")


def test_a_commit_the_store_applied_but_never_answered_is_found_and_not_repeated(outage) -> None:
    """The server applies aggregate's state commit and stops before it answers. The job asks
    again with back-off; the server is back 5 s later; the job finds its commit in place and
    finishes: one commit per table, one ledger row, the failure-free rows."""
    front, store, _, spark = outage
    ingest = JobSpec(dag_id=JOB_DAG, task_id="ingest", epoch=1, regime=Ephemeral(), run_id="epoch-1")
    aggregate = JobSpec(dag_id=JOB_DAG, task_id="aggregate", epoch=1, regime=EagerCheckpoint(), run_id="epoch-1",
                        inputs=("ingest",))
    first = spark.submit(JOBS / "ingest.py", ingest.argv(), store.env())
    assert first.returncode == 0, first.stdout[-3000:]

    front.down_at("PUT", f"/{JOB_DAG}/aggregate/state/_delta_log/", applied=True)
    done, dropped = submit_while(front, spark, JOBS / "aggregate.py", aggregate, store.env(), down_for=5)
    assert done.returncode == 0, done.stdout[-4000:]
    assert [m for m, p in dropped] == ["PUT"] and dropped[0][1].endswith("state/_delta_log/00000000000000000000.json")
    assert "did not answer a commit to s3://falkirk-outage/store/outage_orders/aggregate/state" in done.stdout
    assert "already there" in done.stdout  # the retry found the commit the server had applied
    assert rows(store, JOB_DAG, "aggregate", "state") == (0, expected([1], "aggregate/state"))
    assert rows(store, JOB_DAG, "aggregate", "output") == (0, expected([1], "aggregate/output"))
    assert [(e.task_id, e.epoch) for e in Ledger(store).entries(JOB_DAG)] == [("aggregate", 1), ("ingest", 1)]


def test_a_store_down_past_the_retry_budget_fails_the_task_clearly_and_a_rerun_commits_once(outage) -> None:
    """The server stops as aggregate appends its ledger row (the row is not applied) and stays
    down past FALKIRK_STORE_RETRY_SECONDS: the job fails naming the ledger and the way out; its
    tables' commits landed but, without a ledger row, no reader sees epoch 2. Back up, the
    same job (as Airflow's retry would) commits nothing twice and records the epoch."""
    front, store, _, spark = outage
    ingest = JobSpec(dag_id=JOB_DAG, task_id="ingest", epoch=2, regime=Ephemeral(), run_id="epoch-2")
    aggregate = JobSpec(dag_id=JOB_DAG, task_id="aggregate", epoch=2, regime=EagerCheckpoint(), run_id="epoch-2",
                        inputs=("ingest",))
    assert spark.submit(JOBS / "ingest.py", ingest.argv(), store.env()).returncode == 0

    front.down_at("PUT", "/store/_falkirk/ledger/_delta_log/", applied=False)
    failed, dropped = submit_while(front, spark, JOBS / "aggregate.py", aggregate,
                                   {**store.env(), "FALKIRK_STORE_RETRY_SECONDS": "4"}, down_for=None)
    assert failed.returncode != 0
    assert "StoreUnreachable: the store did not answer a commit to s3://falkirk-outage/store/_falkirk/ledger" \
        in failed.stdout
    assert "Run the task (or the command) again once the store is back" in failed.stdout
    assert [m for m, _ in dropped] == ["PUT"]
    assert Ledger(store).find(JOB_DAG, "aggregate", 2) is None  # epoch 2 is not visible to any reader
    state_version, _ = rows(store, JOB_DAG, "aggregate", "state")
    assert state_version == 1  # ... though its state commit landed

    rerun = spark.submit(JOBS / "aggregate.py", aggregate.argv(), store.env())
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert rerun.stdout.count("already there") == 2  # output and state: found, not repeated
    assert rows(store, JOB_DAG, "aggregate", "state") == (1, expected([1, 2], "aggregate/state"))
    assert rows(store, JOB_DAG, "aggregate", "output") == (1, expected([1, 2], "aggregate/output"))
    assert sorted((e.task_id, e.epoch) for e in Ledger(store).entries(JOB_DAG) if e.task_id == "aggregate") == [
        ("aggregate", 1), ("aggregate", 2)]


def test_a_store_that_hangs_fails_the_job_within_its_retry_budget(outage) -> None:
    """The server keeps its port open and stops answering as aggregate appends its ledger row:
    the job fails naming the ledger within FALKIRK_STORE_RETRY_SECONDS and one request's timeout
    (5 s for a budget of 4 s), not after the object store client's default three minutes of
    retries per request. Back up, the same job commits the epoch once."""
    front, store, _, spark = outage
    dag = "hang_orders"
    ingest = JobSpec(dag_id=dag, task_id="ingest", epoch=1, regime=Ephemeral(), run_id="epoch-1")
    aggregate = JobSpec(dag_id=dag, task_id="aggregate", epoch=1, regime=EagerCheckpoint(), run_id="epoch-1", inputs=("ingest",))
    assert spark.submit(JOBS / "ingest.py", ingest.argv(), store.env()).returncode == 0

    front.hang_at("PUT", "/store/_falkirk/ledger/_delta_log/")
    result: list = []
    runner = threading.Thread(target=lambda: result.append(spark.submit(
        JOBS / "aggregate.py", aggregate.argv(), {**store.env(), "FALKIRK_STORE_RETRY_SECONDS": "4"})))
    runner.start()
    tripped = front.wait_tripped(timeout=300)
    hung_at = time.monotonic()
    runner.join(timeout=170)  # the client's defaults alone would retry one request for 180 s
    took = time.monotonic() - hung_at
    front.up()
    runner.join()
    failed = result[0]
    assert failed.returncode != 0 and took < 60, (took, failed.stdout[-3000:])
    assert "StoreUnreachable: the store did not answer a commit to s3://falkirk-outage/store/_falkirk/ledger" \
        in failed.stdout
    assert [m for m, _ in tripped["dropped"]][:1] == ["PUT"]
    assert Ledger(store).find(dag, "aggregate", 1) is None

    rerun = spark.submit(JOBS / "aggregate.py", aggregate.argv(), store.env())
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert sorted((e.task_id, e.epoch) for e in Ledger(store).entries(dag)) == [("aggregate", 1), ("ingest", 1)]


@pytest.fixture(scope="module")
def orders_airflow(outage):
    """``falkirk_orders`` in a real Airflow (scheduler and API server, LocalExecutor) on the
    outage front: its tasks give up on a store that does not answer after 4 s."""
    front, store, work, spark = outage
    stack = AirflowStack(home=work / "airflow", store=store, extra_env={
        "FALKIRK_LEASE_SECONDS": "60", "FALKIRK_STORE_RETRY_SECONDS": "4", **spark.airflow_env()})
    stack.init()
    stack.start()
    yield stack
    stack.stop()


def test_a_replay_whose_invalidations_the_store_never_answered_resumes_to_the_failure_free_tables(
        outage, orders_airflow: AirflowStack) -> None:
    """falkirk_orders runs epochs 1-3 through Airflow; aggregate's epoch 2 is then declared
    failed. The replay takes its lease; the server applies its invalidations and stops before
    answering, and stays down past the retry budget: ``falkirk replay`` exits 3 naming the
    store, having cleared nothing (Airflow still shows every instance successful). Back up,
    the lease is released by the documented command and the replay resumes: it adds no
    invalidation, clears the four instances, and every table equals the failure-free run."""
    front, store, work, spark = outage
    stack = orders_airflow
    client = stack.client()
    assert run_epochs(client, dag_epoch_clock(), [1, 2, 3]) == {1: "success", 2: "success", 3: "success"}
    runs = {e.epoch: e.run_id for e in Ledger(store).entries(DAG_ID)}
    tries = lambda: {(t, e): (ti["state"], ti["try_number"])  # noqa: E731
                     for e in (1, 2, 3) for t, ti in client.task_instances(DAG_ID, runs[e]).items()}
    before = tries()
    assert {s for s, _ in before.values()} == {"success"}
    env = {**os.environ, **store.env(), "FALKIRK_AIRFLOW_URL": stack.base_url, "FALKIRK_AIRFLOW_USER": "admin",
           "FALKIRK_AIRFLOW_PASSWORD": "admin", "FALKIRK_LEASE_SECONDS": "60", "FALKIRK_STORE_RETRY_SECONDS": "4"}
    falkirk = lambda *args: subprocess.run([str(VENV_BIN / "falkirk"), *args], env=env,  # noqa: E731
                                           capture_output=True, text=True, timeout=900)
    planned = falkirk("plan", "--dag", DAG_ID, "--failed-task", "aggregate:2", "--json")
    assert planned.returncode == 0, planned.stderr
    plan_id = json.loads(planned.stdout)["plan_id"]

    front.down_at("PUT", "/store/_falkirk/invalidations/_delta_log/", applied=True)
    cut = falkirk("replay", plan_id)
    assert front.state()["tripped"]
    assert cut.returncode == 3, cut.stdout + cut.stderr
    assert "the store did not answer a commit to s3://falkirk-outage/store/_falkirk/invalidations" in cut.stderr
    assert tries() == before  # nothing cleared
    front.up()
    assert len(Ledger(store).invalidations.keys(DAG_ID)) == 4  # applied before the server stopped

    refused = falkirk("replay", plan_id)
    assert refused.returncode != 0 and "falkirk release --dag falkirk_orders" in refused.stderr
    released = falkirk("release", "--dag", DAG_ID, "--reason", "its replay lost the store")
    assert released.returncode == 0, released.stderr
    resumed = falkirk("replay", plan_id)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming" in resumed.stdout and "invalidated 0 ledger rows" in resumed.stdout
    after = tries()
    rerun = {("aggregate", 2), ("aggregate", 3), ("publish", 2), ("publish", 3)}
    assert {k for k in after if after[k][1] == before[k][1] + 1} == rerun
    assert all(after[k] == before[k] for k in after if k not in rerun)
    assert {s for s, _ in after.values()} == {"success"}
    events = [r["event"] for r in RecoveryLog(store).events(DAG_ID)
              if r["plan_id"] == plan_id and r["event"] != "heartbeat"]
    assert events == ["planned", "started", "released", "resumed", "finished"]
    want = expected_tables([1, 2, 3])
    for name in ("aggregate/output", "aggregate/state", "publish/output"):
        task, table = name.split("/")
        assert rows(store, DAG_ID, task, table)[1] == canonical(want[name]), name


def test_a_store_that_hangs_fails_the_task_instance_within_its_retry_budget_and_a_clear_commits_once(
        outage, orders_airflow: AirflowStack) -> None:
    """Through the scheduler: as epoch 4's first task appends its ledger row, the server keeps
    its port open and stops answering. The task instance fails within its retry budget (4 s) and
    one request's timeout, naming the ledger, instead of waiting on the store for ever; Airflow
    fails the run. The store back, a Clear of the failed instances commits the epoch once."""
    front, store, _, _ = outage
    client = orders_airflow.client()
    tables = {"ingest/output": Tier.SCRATCH, "aggregate/output": Tier.DURABLE, "aggregate/state": Tier.DURABLE,
              "publish/output": Tier.DURABLE}
    versions = lambda: {name: rows(store, DAG_ID, *name.split("/"), tier)[0]  # noqa: E731
                        for name, tier in tables.items()}
    before = versions()
    front.hang_at("PUT", "/store/_falkirk/ledger/_delta_log/")
    run: list = []
    runner = threading.Thread(target=lambda: run.append(run_epochs(client, dag_epoch_clock(), [4])))
    runner.start()
    front.wait_tripped(timeout=300)
    hung_at = datetime.now(timezone.utc)
    runner.join(timeout=600)
    front.up()
    assert run == [{4: "failed"}]
    ingest = client.task_instances(DAG_ID, "epoch-4")["ingest"]
    assert ingest["state"] == "failed" and ingest["try_number"] == 1
    gave_up_after = (datetime.fromisoformat(ingest["end_date"]) - hung_at).total_seconds()
    assert gave_up_after < 30, gave_up_after  # a budget of 4 s, a request timeout of 5 s, then the failure
    logged = client.task_log(DAG_ID, "epoch-4", "ingest", 1)
    assert "the store did not answer a commit to s3://falkirk-outage/store/_falkirk/ledger" in logged
    assert Ledger(store).find(DAG_ID, "ingest", 4) is None  # no reader sees epoch 4

    client.clear(DAG_ID, "epoch-4", ["ingest", "aggregate", "publish"])
    assert client.wait_for_run(DAG_ID, "epoch-4") == "success"
    assert sorted(e.task_id for e in Ledger(store).entries(DAG_ID) if e.epoch == 4) == [
        "aggregate", "ingest", "publish"]
    # one commit per table for epoch 4: ingest's output, which landed before the ledger hung, is
    # found by the re-run and not written again (ingest keeps no state: its output is in scratch)
    assert versions() == {name: v + 1 for name, v in before.items()}
    want = expected_tables([1, 2, 3, 4])
    for name, tier in tables.items():
        assert rows(store, DAG_ID, *name.split("/"), tier)[1] == canonical(want[name]), name
