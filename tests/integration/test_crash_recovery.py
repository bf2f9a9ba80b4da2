"""A job that dies between its commits is repaired by running it again: nothing lost, nothing doubled.

Real Spark (``spark-submit``, local) and real Delta tables; the crash is injected with
``FALKIRK_CRASH_AT`` and ends the driver at once, as a lost worker would.
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


def test_crash_after_outputs_then_rerun_commits_each_table_once(tmp_path: Path) -> None:
    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    ingest = JobSpec(DAG_ID, "ingest", epoch=1, regime=Ephemeral(), run_id="epoch-1")
    aggregate = JobSpec(DAG_ID, "aggregate", epoch=1, regime=EagerCheckpoint(), run_id="epoch-1", inputs=("ingest",))

    first = spark_submit(JOBS / "ingest.py", ingest.argv(), store.env())
    assert first.returncode == 0, first.stdout[-3000:]

    crashed = spark_submit(JOBS / "aggregate.py", aggregate.argv(),
                           {**store.env(), "FALKIRK_CRASH_AT": "aggregate:1:after-outputs"})
    # spark-submit exits non-zero with its own status when the Python driver dies.
    assert crashed.returncode != 0, crashed.stdout[-3000:]
    assert "injected crash: aggregate epoch 1 at after-outputs" in crashed.stdout
    output_uri = store.table_uri(Tier.DURABLE, DAG_ID, "aggregate", "output")
    state_uri = store.table_uri(Tier.DURABLE, DAG_ID, "aggregate", "state")
    assert DeltaTable(output_uri).version() == 0  # the output commit landed ...
    assert open_table(state_uri) is None  # ... the state commit did not ...
    assert Ledger(store).find(DAG_ID, "aggregate", 1) is None  # ... so the epoch is not checkpointed

    rerun = spark_submit(JOBS / "aggregate.py", aggregate.argv(), store.env())
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert "already there" in rerun.stdout  # the output commit was recognised, not repeated
    assert DeltaTable(output_uri).version() == 0 and DeltaTable(state_uri).version() == 0
    entry = Ledger(store).find(DAG_ID, "aggregate", 1)
    assert entry is not None and entry.state_rows == 5
    expected = expected_tables([1])
    for name in ("ingest/output", "aggregate/output", "aggregate/state"):
        assert canonical(table_rows(store, name)) == canonical(expected[name]), name
