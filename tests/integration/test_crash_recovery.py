"""A job killed mid-commit leaves nothing visible that it should not, and running it again
commits each table exactly once: nothing lost, nothing doubled. The durable tier is a
local path and an S3-compatible server (``moto_server``).

Real Spark (each job a client of the session's Spark Connect server, as the operator runs
it on a ``spark_connect`` connection) and real Delta tables; the kill is injected with
``FALKIRK_CRASH_AT`` and is a SIGKILL of the job's process, which makes the commits, as a
lost worker would be.
"""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from devstack.airflow import PROJECT_ROOT
from devstack.spark import SparkConnectServer
from falkirk.policies import EagerCheckpoint, Ephemeral, Ledger, StoreConfig, Tier
from falkirk.policies.job_spec import JobSpec
from falkirk.policies.store.commits import open_table
from tests.oracle import canonical, expected_tables
from tests.tables import DAG_ID, table_rows

JOBS = PROJECT_ROOT / "spark_jobs" / "pipeline"


def data_files(store: StoreConfig, uri: str, s3) -> set[str]:
    """Every Parquet file under a table's directory, referenced by the Delta log or not."""
    if not uri.startswith("s3://"):
        return {str(p) for p in Path(uri).rglob("*.parquet")}
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return {f"s3://{bucket}/{o['Key']}" for page in pages for o in page.get("Contents", [])
            if o["Key"].endswith(".parquet")}


def committed_files(store: StoreConfig, uri: str) -> set[str]:
    return set(DeltaTable(uri, storage_options=store.options_for(uri)).file_uris())


def test_killed_attempts_leave_no_partial_data_and_a_rerun_commits_once(store: StoreConfig, request,
                                                                         spark_connect: SparkConnectServer) -> None:
    s3 = request.getfixturevalue("s3") if store.durable_uri.startswith("s3://") else None
    spark_submit = spark_connect.submit
    ingest = JobSpec(dag_id=DAG_ID, task_id="ingest", epoch=1, regime=Ephemeral(), run_id="epoch-1")
    aggregate = JobSpec(dag_id=DAG_ID, task_id="aggregate", epoch=1, regime=EagerCheckpoint(), run_id="epoch-1", inputs=("ingest",))
    output_uri = store.table_uri(Tier.DURABLE, DAG_ID, "aggregate", "output")
    state_uri = store.table_uri(Tier.DURABLE, DAG_ID, "aggregate", "state")
    options = store.options_for(output_uri)

    first = spark_submit(JOBS / "ingest.py", ingest.argv(), store.env())
    assert first.returncode == 0, first.stdout[-3000:]

    # 1. Killed after the executors wrote the data files, before the Delta commits.
    killed = spark_submit(JOBS / "aggregate.py", aggregate.argv(),
                          {**store.env(), "FALKIRK_CRASH_AT": "aggregate:1:after-files"})
    assert killed.returncode != 0, killed.stdout[-3000:]  # the job died
    assert "injected crash: aggregate epoch 1 at after-files" in killed.stdout
    orphans = data_files(store, output_uri, s3)
    assert orphans and data_files(store, state_uri, s3), "the executors should have written files before the kill"
    assert open_table(output_uri, options) is None  # ... and none of them is visible: no table, no rows
    assert open_table(state_uri, options) is None
    assert Ledger(store).find(DAG_ID, "aggregate", 1) is None

    # 2. Killed after the output's commit, before the state's.
    killed = spark_submit(JOBS / "aggregate.py", aggregate.argv(),
                          {**store.env(), "FALKIRK_CRASH_AT": "aggregate:1:after-outputs"})
    assert killed.returncode != 0 and "injected crash: aggregate epoch 1 at after-outputs" in killed.stdout
    assert DeltaTable(output_uri, storage_options=options).version() == 0  # the output commit landed ...
    assert open_table(state_uri, options) is None  # ... the state commit did not ...
    assert Ledger(store).find(DAG_ID, "aggregate", 1) is None  # ... so the epoch is not checkpointed
    visible = committed_files(store, output_uri)
    assert visible and not visible & orphans  # orphans stay orphans

    # 3. A clean run completes the epoch without repeating the output commit.
    rerun = spark_submit(JOBS / "aggregate.py", aggregate.argv(), store.env())
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert "already there" in rerun.stdout  # the output commit was recognised, not repeated
    assert DeltaTable(output_uri, storage_options=options).version() == 0
    assert DeltaTable(state_uri, storage_options=options).version() == 0
    assert committed_files(store, output_uri) == visible
    entry = Ledger(store).find(DAG_ID, "aggregate", 1)
    assert entry is not None and entry.state_rows == 5 and entry.try_number == 1
    expected = expected_tables([1])
    for name in ("ingest/output", "aggregate/output", "aggregate/state"):
        assert canonical(table_rows(store, name)) == canonical(expected[name]), name
