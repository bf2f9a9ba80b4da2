"""A team's own Delta table read as a source: ``spark_jobs/sources/customers.py`` as the operator
runs it (its own process, a client of the session's Spark Connect server, which carries Delta's
jars), epoch after epoch while the team changes the table. Each epoch's ledger row records the
table's URI and the Delta version it read, and its output is computed from that version."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from devstack.airflow import PROJECT_ROOT
from devstack.spark import SparkConnectServer
from falkirk.policies import Batch, Ledger, StoreConfig
from falkirk.policies.job_spec import JobSpec
from falkirk.policies.store.commits import scan
from falkirk.policies.store.ledger import DeltaSource

JOB = PROJECT_ROOT / "spark_jobs" / "sources" / "customers.py"
DAG = "crm"


def run_epoch(server: SparkConnectServer, store: StoreConfig, epoch: int, table: str) -> str:
    spec = JobSpec(dag_id=DAG, task_id="customers", epoch=epoch, regime=Batch(), run_id=f"epoch-{epoch}")
    done = server.submit(JOB, spec.argv(), {**store.env(), "FALKIRK_CUSTOMERS_TABLE": table})
    assert done.returncode == 0, done.stdout[-3000:]
    return done.stdout


def test_each_epoch_records_the_version_of_the_source_it_read(spark_connect: SparkConnectServer,
                                                                tmp_path: Path) -> None:
    store = StoreConfig(str(tmp_path / "store"), str(tmp_path / "scratch"))
    table = str(tmp_path / "team" / "customers")
    write_deltalake(table, pa.table({"id": [1, 2, 3], "country": ["GB", "GB", "FR"]}))
    run_epoch(spark_connect, store, 1, table)
    run_epoch(spark_connect, store, 2, table)  # the table unchanged: the same version
    # The team corrects a customer and adds one: two new versions.
    DeltaTable(table).update(predicate="id = 3", updates={"country": "'DE'"})
    write_deltalake(table, pa.table({"id": [4], "country": ["FR"]}), mode="append")
    run_epoch(spark_connect, store, 3, table)

    rows = {e.epoch: e for e in Ledger(store).entries(DAG)}
    assert {epoch: row.sources for epoch, row in rows.items()} == {
        1: (DeltaSource(uri=table, version=0),), 2: (DeltaSource(uri=table, version=0),),
        3: (DeltaSource(uri=table, version=2),)}
    [uri] = {o.uri for row in rows.values() for o in row.outputs}
    output = scan(DeltaTable(uri)).to_pylist()
    per_epoch = {e: sorted((r["country"], r["customers"]) for r in output if r["epoch"] == e) for e in (1, 2, 3)}
    assert per_epoch == {1: [("FR", 1), ("GB", 2)], 2: [("FR", 1), ("GB", 2)],
                         3: [("DE", 1), ("FR", 1), ("GB", 2)]}


def test_a_source_that_is_not_a_delta_table_fails_the_epoch_naming_it(spark_connect: SparkConnectServer,
                                                                      tmp_path: Path) -> None:
    store = StoreConfig(str(tmp_path / "store"), str(tmp_path / "scratch"))
    missing = str(tmp_path / "team" / "nothing-here")
    spec = JobSpec(dag_id=DAG, task_id="customers", epoch=1, regime=Batch(), run_id="epoch-1")
    done = spark_connect.submit(JOB, spec.argv(), {**store.env(), "FALKIRK_CUSTOMERS_TABLE": missing})
    assert done.returncode != 0
    assert f"cannot read the Delta table at {missing!r}" in done.stdout, done.stdout[-3000:]
    assert Ledger(store).entries(DAG) == []
