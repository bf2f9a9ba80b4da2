"""A job killed mid-commit leaves nothing visible that it should not, and running it again
commits each table exactly once: nothing lost, nothing doubled.

Real Spark (``spark-submit``, local) and real Delta tables; the kill is injected with
``FALKIRK_CRASH_AT`` and is a SIGKILL of the driver, as a lost worker would be.
"""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from devstack.airflow import PROJECT_ROOT
from devstack.spark import spark_submit
from policies import EagerCheckpoint, Ephemeral, Ledger, StoreConfig, Tier
from policies.epoch_tables import open_table
from policies.job_spec import JobSpec
from tests.oracle import canonical, expected_tables
from tests.tables import DAG_ID, table_rows

JOBS = PROJECT_ROOT / "spark_jobs" / "pipeline"


def test_killed_attempts_leave_no_partial_data_and_a_rerun_commits_once(tmp_path: Path) -> None:
    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    ingest = JobSpec(DAG_ID, "ingest", epoch=1, regime=Ephemeral(), run_id="epoch-1")
    aggregate = JobSpec(DAG_ID, "aggregate", epoch=1, regime=EagerCheckpoint(), run_id="epoch-1", inputs=("ingest",))
    output_uri = store.table_uri(Tier.DURABLE, DAG_ID, "aggregate", "output")
    state_uri = store.table_uri(Tier.DURABLE, DAG_ID, "aggregate", "state")

    first = spark_submit(JOBS / "ingest.py", ingest.argv(), store.env())
    assert first.returncode == 0, first.stdout[-3000:]

    # 1. Killed after the executors wrote the output's data files, before the Delta commit.
    killed = spark_submit(JOBS / "aggregate.py", aggregate.argv(),
                          {**store.env(), "FALKIRK_CRASH_AT": "aggregate:1:after-files"})
    assert killed.returncode != 0, killed.stdout[-3000:]  # spark-submit reports the dead driver
    assert "injected crash: aggregate epoch 1 at after-files" in killed.stdout
    orphans = list(Path(output_uri).rglob("*.parquet"))
    assert orphans, "the executors should have written data files before the kill"
    assert open_table(output_uri) is None  # ... and none of them is visible: no table, no rows
    assert Ledger(store).find(DAG_ID, "aggregate", 1) is None

    # 2. Killed after the output's commit, before the state's.
    killed = spark_submit(JOBS / "aggregate.py", aggregate.argv(),
                          {**store.env(), "FALKIRK_CRASH_AT": "aggregate:1:after-outputs"})
    assert killed.returncode != 0 and "injected crash: aggregate epoch 1 at after-outputs" in killed.stdout
    assert DeltaTable(output_uri).version() == 0  # the output commit landed ...
    assert open_table(state_uri) is None  # ... the state commit did not ...
    assert Ledger(store).find(DAG_ID, "aggregate", 1) is None  # ... so the epoch is not checkpointed
    committed_files = {Path(u.removeprefix("file://")) for u in DeltaTable(output_uri).file_uris()}
    assert committed_files and not committed_files & set(orphans)  # orphans stay orphans

    # 3. A clean run completes the epoch without repeating the output commit.
    rerun = spark_submit(JOBS / "aggregate.py", aggregate.argv(), store.env())
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert "already there" in rerun.stdout  # the output commit was recognised, not repeated
    assert DeltaTable(output_uri).version() == 0 and DeltaTable(state_uri).version() == 0
    assert {Path(u.removeprefix("file://")) for u in DeltaTable(output_uri).file_uris()} == committed_files
    entry = Ledger(store).find(DAG_ID, "aggregate", 1)
    assert entry is not None and entry.state_rows == 5
    expected = expected_tables([1])
    for name in ("ingest/output", "aggregate/output", "aggregate/state"):
        assert canonical(table_rows(store, name)) == canonical(expected[name]), name
