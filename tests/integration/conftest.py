"""Real components shared by the integration tests, each started once per session when first used:
one local Spark session; one Spark Connect server for every deployment whose tasks run as
its clients; one ``moto_server``; one PostgreSQL server; and a ``store`` fixture that runs a
test with the durable tier on a local path and on the S3-compatible server. Also the demo
pipeline's Airflow deployment with epochs 1..3 run through its scheduler, for the module
that uses it (kept for the session, its idle scheduler would only take CPU from the rest)."""

from __future__ import annotations

import itertools
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.airflow import AirflowStack, migrated_database
from devstack.demo import DAG_ID, dag_epoch_clock, run_epochs
from devstack.spark import SMALL_EPOCHS_SQL_CONF, SparkConnectServer
from falkirk.policies.store import StoreConfig

EPOCHS = [1, 2, 3]


@pytest.fixture(scope="session")
def local_store(tmp_path_factory: pytest.TempPathFactory) -> StoreConfig:
    root = tmp_path_factory.mktemp("store")
    return StoreConfig(durable_uri=str(root / "durable"), scratch_uri=str(root / "scratch"))


@pytest.fixture(scope="module")
def airflow_stack(tmp_path_factory: pytest.TempPathFactory, local_store: StoreConfig,
                  spark_connect: "SparkConnectServer", postgres):  # noqa: ANN001
    """Its tasks run as clients of the session's Spark Connect server, on the job host; its
    metadata is on the session's PostgreSQL server: the module backfills through Airflow's CLI
    while the scheduler runs, which on SQLite can outwait the write lock's timeout."""
    home = tmp_path_factory.mktemp("airflow")  # faults: crash points a test arms while Airflow runs
    stack = AirflowStack(home=home, store=local_store, database_url=migrated_database(postgres, "pipeline"),
                         extra_env={**spark_connect.airflow_env(), "FALKIRK_CRASH_AT": f"@{home / 'faults'}"})
    stack.init()
    stack.start()
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def three_epochs(airflow_stack: AirflowStack) -> dict[int, str]:
    """Epochs 1, 2, 3 of falkirk_orders, each one DAG run through the real scheduler."""
    states = run_epochs(airflow_stack.client(), dag_epoch_clock(), EPOCHS, progress=print)
    logs = Path(airflow_stack.home) / "logs" / f"dag_id={DAG_ID}"
    assert states == {1: "success", 2: "success", 3: "success"}, f"runs {states}; task logs in {logs}"
    return states


@pytest.fixture(scope="session")
def spark_connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkConnectServer]:
    """One Spark Connect server (``local[2]``) shared by the recovery drills, the view's tests and
    the store-outage tests: a deployment points ``spark_default`` at it with ``airflow_env()``."""
    with SparkConnectServer(tmp_path_factory.mktemp("spark-connect")) as server:
        yield server


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory):
    """One PostgreSQL server (Debian's, ``initdb`` here) for every test that wants one: each makes
    its own database with ``create_database``."""
    from devstack.servers import PostgresServer

    with PostgresServer(tmp_path_factory.mktemp("postgres")) as server:
        yield server


@pytest.fixture(scope="session")
def spark():
    """One in-process local Spark session (2 cores): the executors write files, the driver commits."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("falkirk-tests").config("spark.ui.enabled", "false")
    for key, value in {**SMALL_EPOCHS_SQL_CONF, "spark.sql.shuffle.partitions": "2"}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()
    # py4j logs from a finalizer at interpreter exit, after pytest has closed its streams.
    logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """``moto_server`` as a subprocess on 127.0.0.1."""
    from devstack.s3 import MotoS3

    with MotoS3(tmp_path_factory.mktemp("moto")) as server:
        yield server


_buckets = itertools.count()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreConfig:
    """The durable tier on a local path, or on an S3-compatible server; scratch is always local."""
    if request.param == "local":
        return StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    s3 = request.getfixturevalue("s3")
    bucket = f"falkirk-{next(_buckets)}"
    s3.create_bucket(bucket)
    return StoreConfig(f"s3://{bucket}/store", str(tmp_path / "scratch"), s3.storage_options())
