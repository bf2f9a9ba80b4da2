"""``airflow dags test`` of a Falkirk DAG, kept apart from the DAG's real epochs.

``airflow dags test DAG DATE`` creates a DAG run in the real metadata database and runs its
task instances in its own process. Left alone, that run would mix with the DAG's epochs:

* with the DAG unpaused, the scheduler queues the test run's task instances too, so each runs
  twice, and the second finds its epoch committed and is refused;
* its tasks would commit to the DAG's store, whose ledger drives recoveries;
* a failed test run would stay among the DAG's failed task instances, and ``falkirk plan
  --failed-task`` would plan to redo an epoch the real store never ran.

So, for a Falkirk DAG:

* the cluster policy below gives each task instance of a test run the pool
  ``falkirk_dags_test``, which does not exist: the scheduler never queues them ("Tasks using
  non-existent pool ... will not be scheduled"), and ``dags test`` runs them itself;
* the operator writes a test run's commits to a store of its own (:func:`dags_test_store`):
  a fresh directory per test, unless ``FALKIRK_DAGS_TEST_STORE`` names one to keep (or says
  ``real``);
* the planner and the Falkirk view leave out test runs and their task instances
  (:func:`is_test_instance`).

A test run keeps its logical date in Airflow's database, so neither the real run of that epoch
nor another test of it can be created until it is deleted: ``falkirk discard --dag DAG --epochs N --yes`` deletes it (it
has no ledger row to roll back), as does Airflow's own delete in the runs list.

Installed by the package's ``airflow.policy`` entry point, beside placement's.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from falkirk.plugins import hookimpl
from falkirk.policies.store import StoreConfig, StoreError

DAGS_TEST_POOL = "falkirk_dags_test"
"""The pool of a test run's Falkirk task instances: none by that name exists, so the scheduler
leaves them to ``airflow dags test``."""

DAGS_TEST_STORE_ENV = "FALKIRK_DAGS_TEST_STORE"
DAGS_TEST_USER = "dag_test"  # the triggering user Airflow's DAG.test gives its run


def is_test_run(dag_run: Any) -> bool:
    """Whether a DAG run (a model, the task context's, or the REST API's dict) was made by
    ``airflow dags test``.

    >>> is_test_run({"triggered_by": "test"}), is_test_run({"triggering_user_name": "admin"})
    (True, False)
    """
    get = dag_run.get if isinstance(dag_run, Mapping) else (lambda k: getattr(dag_run, k, None))
    by = get("triggered_by")
    return str(getattr(by, "value", by)).lower() == "test" or get("triggering_user_name") == DAGS_TEST_USER


def is_test_instance(task_instance: Mapping[str, Any]) -> bool:
    """Whether a task instance, as the REST API lists it, belongs to a test run.

    >>> is_test_instance({"pool": "falkirk_dags_test"}), is_test_instance({"pool": "default_pool"})
    (True, False)
    """
    return task_instance.get("pool") == DAGS_TEST_POOL


def is_dags_test(context: Mapping[str, Any]) -> bool:
    """Whether the task instance of ``context`` belongs to an ``airflow dags test`` run."""
    return is_test_run(context.get("dag_run"))


def dags_test_store(store: StoreConfig, dag_id: str, run_key: str = "",
                    environ: Mapping[str, str] | None = None) -> StoreConfig:
    """The store a test run writes to: not the DAG's own, whose ledger drives recoveries.

    By default a fresh directory per test (``run_key``: the run and how often it was cleared)
    under ``falkirk-dags-test`` in the system's temporary directory; ``FALKIRK_DAGS_TEST_STORE=DIR``
    keeps the DAG's test store in ``DIR`` from one test to the next (to test epoch 8 on epoch 7);
    ``FALKIRK_DAGS_TEST_STORE=real`` uses ``store`` itself.

    >>> dags_test_store(StoreConfig("s3://b/store", "/tmp/s"), "orders", "r1-0", {"FALKIRK_DAGS_TEST_STORE": "/tmp/t"})
    StoreConfig(durable_uri='/tmp/t/orders/durable', scratch_uri='/tmp/t/orders/scratch', storage_options={}, worker=None, spark_reads=False)
    >>> dags_test_store(StoreConfig("/s", "/sc"), "orders", "r1-0", {}).durable_uri.endswith("/orders/r1-0/durable")
    True
    """
    env = os.environ if environ is None else environ
    chosen = env.get(DAGS_TEST_STORE_ENV, "").strip()
    if chosen == "real":
        return store
    if "://" in chosen:
        raise StoreError(f"{DAGS_TEST_STORE_ENV}={chosen!r}: give a local directory for `airflow dags test` runs "
                         f"(or real, to use the DAG's own store)")
    if chosen:
        root = Path(chosen) / dag_id
    else:
        root = Path(tempfile.gettempdir()) / "falkirk-dags-test" / dag_id / _safe(run_key or "run")
    return StoreConfig(durable_uri=str(root / "durable"), scratch_uri=str(root / "scratch"), worker=store.worker)


def run_key(dag_run: Any) -> str:
    """A test's key: the run (its id carries the moment the test started) and how often it was
    cleared, so that each test starts from an empty store.

    >>> run_key({"run_id": "manual__2026-01-08T00:00:00+00:00", "clear_number": 2})
    'manual__2026-01-08T00:00:00+00:00-2'
    """
    get = dag_run.get if isinstance(dag_run, Mapping) else (lambda k: getattr(dag_run, k, None))
    return f"{get('run_id')}-{get('clear_number') or 0}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@hookimpl
def task_instance_mutation_hook(task_instance: Any, dag_run: Any = None) -> None:
    """Keep the scheduler off the task instances of a Falkirk DAG's test run."""
    if dag_run is None or not is_test_run(dag_run):
        return
    task = getattr(task_instance, "task", None)
    dag = getattr(task, "dag", None)
    from falkirk.plugins.placement import is_falkirk_task  # placement loads Airflow: not before this module is made

    if dag is not None and any(is_falkirk_task(t) for t in dag.tasks):
        task_instance.pool = DAGS_TEST_POOL


__all__ = ["DAGS_TEST_POOL", "DAGS_TEST_STORE_ENV", "dags_test_store", "is_dags_test", "is_test_instance",
           "is_test_run", "run_key"]
