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


def test_a_retried_replay_finds_that_its_plan_made_its_invalidations_even_when_there_were_none(tmp_path) -> None:
    """A plan whose rows had not committed yet rolls nothing back; its retry, finding no rollback
    row, rolled back what the plan's own re-runs had committed meanwhile. The log now says the
    invalidations were made."""
    from falkirk.policies.planning.recovery import FailedTask, RecoveryPlan, TaskPlan
    from falkirk.policies.planning.recovery_log import RecoveryLog, invalidations_made
    from falkirk.policies.store import StoreConfig

    store = StoreConfig(durable_uri=str(tmp_path / "store"), scratch_uri=str(tmp_path / "scratch"))
    plan = RecoveryPlan("d", (FailedTask("clean", 3),), 3, 0, (TaskPlan("clean", "batch", 2, 2, (3,), None, (), (3,)),))
    log = RecoveryLog(store)
    log.record(plan)
    lease = log.begin(plan, "attempt-1")
    assert not invalidations_made(log.events("d"), plan.plan_id)
    log.rolled_back(lease, 0)
    assert invalidations_made(log.events("d"), plan.plan_id)
