"""(d) The Spark jobs run on a real standalone cluster (master and worker started here with
``spark-class`` on 127.0.0.1), chosen through the ``spark_default`` connection."""

from __future__ import annotations

from pathlib import Path

from devstack.airflow import AirflowStack
from devstack.demo import DAG_ID, dag_epoch_clock
from devstack.spark import StandaloneSpark
from falkirk.policies.store import StoreConfig
from tests.oracle import canonical, expected_tables
from tests.tables import TABLES, table_rows


def test_jobs_run_on_a_standalone_cluster(tmp_path: Path) -> None:
    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    with StandaloneSpark(tmp_path / "spark") as cluster:
        # The executors write every epoch's files (not the driver, as it does for small epochs).
        stack = AirflowStack(home=tmp_path / "airflow", store=store, spark_master=cluster.master_url,
                             extra_env={"FALKIRK_DRIVER_WRITE_MAX_ROWS": "0", "FALKIRK_DAGS_TEST_STORE": "real"})
        stack.init()
        stack.airflow("dags", "test", DAG_ID, dag_epoch_clock().logical_date(1).isoformat())
        apps = cluster.completed_apps()

    assert sorted(apps) == sorted(f"falkirk:{DAG_ID}.{t}:epoch-1" for t in ("ingest", "aggregate", "publish"))
    expected = expected_tables([1])
    for name in TABLES:
        assert canonical(table_rows(store, name)) == canonical(expected[name]), name
