"""(c) The same pipeline with its durable Delta tables on an S3-compatible server
(``moto_server`` as a subprocess), run by Airflow (``airflow dags test``) and real Spark."""

from __future__ import annotations

from pathlib import Path

from devstack.airflow import AirflowStack
from devstack.demo import DAG_ID, dag_epoch_clock
from devstack.s3 import MotoS3
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger
from tests.oracle import canonical, expected_tables
from tests.tables import TABLES, table_rows

EPOCHS = [1, 2, 3]


def test_pipeline_on_s3_produces_the_same_tables(s3: MotoS3, tmp_path: Path) -> None:
    s3.create_bucket("falkirk")
    store = StoreConfig("s3://falkirk/store", str(tmp_path / "scratch"), s3.storage_options())
    # The executors write every epoch's files (not the driver, as it does for small epochs).
    stack = AirflowStack(home=tmp_path / "airflow", store=store,
                         extra_env={"FALKIRK_DRIVER_WRITE_MAX_ROWS": "0"})
    stack.init()
    clock = dag_epoch_clock()
    for epoch in EPOCHS:
        stack.airflow("dags", "test", DAG_ID, clock.logical_date(epoch).isoformat())

    expected = expected_tables(EPOCHS)
    for name in TABLES:
        assert canonical(table_rows(store, name)) == canonical(expected[name]), name
    keys = s3.client().list_objects_v2(Bucket="falkirk", Prefix="store/")["Contents"]
    assert any(k["Key"].startswith("store/falkirk_orders/aggregate/state/_delta_log/") for k in keys)
    assert len(Ledger(store).entries(DAG_ID)) == 9
