"""The regime tag survives Airflow's DAG serialization, so the API server can read it
without importing DAG files; a wrong regime is refused when the DAG is defined."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def airflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


def test_regimes_round_trip_through_the_serialized_dag() -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    from plugins.operators import regime_of
    from policies import Batch, EagerCheckpoint, Ephemeral

    bag = DagBag(str(ROOT / "dags"))
    assert bag.import_errors == {}
    back = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["falkirk_orders"]))
    assert type(back.get_task("aggregate")).__name__ == "SerializedBaseOperator"  # no DAG code behind it
    assert {t.task_id: regime_of(t) for t in back.tasks} == {
        "ingest": Ephemeral(), "aggregate": EagerCheckpoint(), "publish": Batch(log_outputs=True)}


def test_operator_refuses_a_regime_that_is_not_one() -> None:
    from datetime import datetime, timedelta, timezone

    from plugins.operators import RegimeSparkSubmitOperator
    from policies import EpochClock, RegimeError

    clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
    with pytest.raises(RegimeError, match="task 'x': regime='eager' is not a Regime"):
        RegimeSparkSubmitOperator(task_id="x", application=str(ROOT / "spark_jobs/pipeline/ingest.py"),
                                  regime="eager", epoch_clock=clock)
