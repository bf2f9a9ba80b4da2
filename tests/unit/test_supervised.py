"""The provider's ``falkirk_recovery`` DAG: it parses, and its one task retries a killed attempt."""

from __future__ import annotations

from falkirk.plugins.supervised import BUNDLE, RECOVERY_DAG, bundle_config


def test_the_recovery_dag_parses_with_a_retried_replay_task() -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(BUNDLE))
    assert bag.import_errors == {}
    dag = bag.dags[RECOVERY_DAG]
    assert [t.task_id for t in dag.tasks] == ["replay"] and dag.tasks[0].retries == 5
    assert set(dag.params) == {"plan_id", "then", "holder"} and type(dag.timetable).__name__ == "NullTimetable"


def test_the_bundle_config_adds_the_provider_dags_beside_the_dags_folder() -> None:
    bundles = {b["name"]: b["kwargs"] for b in bundle_config()}
    assert bundles == {"dags-folder": {}, "falkirk": {"path": str(BUNDLE)}}
    assert (BUNDLE / "falkirk_recovery.py").is_file()
