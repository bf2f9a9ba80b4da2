"""One real Airflow deployment (api-server, scheduler, dag-processor, triggerer) for the session,
with the demo pipeline run for epochs 1..3 through its scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.airflow import AirflowStack
from devstack.demo import DAG_ID, dag_epoch_clock, run_epochs
from policies.store import StoreConfig

EPOCHS = [1, 2, 3]


@pytest.fixture(scope="session")
def local_store(tmp_path_factory: pytest.TempPathFactory) -> StoreConfig:
    root = tmp_path_factory.mktemp("store")
    return StoreConfig(durable_uri=str(root / "durable"), scratch_uri=str(root / "scratch"))


@pytest.fixture(scope="session")
def airflow_stack(tmp_path_factory: pytest.TempPathFactory, local_store: StoreConfig):
    stack = AirflowStack(home=tmp_path_factory.mktemp("airflow"), store=local_store)
    stack.init()
    stack.start()
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def three_epochs(airflow_stack: AirflowStack) -> dict[int, str]:
    """Epochs 1, 2, 3 of falkirk_orders, each one DAG run through the real scheduler."""
    states = run_epochs(airflow_stack.client(), dag_epoch_clock(), EPOCHS, progress=print)
    logs = Path(airflow_stack.home) / "logs" / f"dag_id={DAG_ID}"
    assert states == {1: "success", 2: "success", 3: "success"}, f"runs {states}; task logs in {logs}"
    return states
