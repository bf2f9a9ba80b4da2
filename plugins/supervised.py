"""Replays supervised by Airflow: a recovery plan carried out by a task of the ``falkirk_recovery``
DAG the provider ships (``falkirk/plugins/dags/falkirk_recovery.py``).

:func:`trigger_recovery` starts a run of that DAG for a plan (what the view and the API do, with
the caller's token, once they have checked that the caller may clear the plan's task instances);
:func:`replay_in_task` is the task's body. The task reaches Airflow's REST API through the
connection ``falkirk_airflow`` (its host, login and password: a user that may clear the DAGs it
recovers). Its log is the replay's progress; a killed attempt is retried by Airflow, and the retry
takes over the lease its own earlier attempt held (Airflow starts a retry only once that attempt
ended) and resumes the plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from falkirk.plugins.airflow_rest import AirflowClient
from falkirk.policies.planning.recovery_log import RecoveryLog, open_lease
from falkirk.policies.store import StoreConfig

RECOVERY_DAG = "falkirk_recovery"
CONNECTION = "falkirk_airflow"
REFUSED_SECONDS = 300.0
BUNDLE = Path(__file__).parent / "dags"
"""The folder of the provider's DAGs: add it to Airflow as a DAG bundle (``dag_bundle_config_list``)."""


def bundle_config(dags_folder_bundle: bool = True) -> list[dict[str, Any]]:
    """The ``[dag_processor] dag_bundle_config_list`` that adds the provider's DAGs to Airflow's
    own DAGs folder.

    >>> [b["name"] for b in bundle_config()]
    ['dags-folder', 'falkirk']
    """
    local = "airflow.dag_processing.bundles.local.LocalDagBundle"
    bundles = [{"name": "dags-folder", "classpath": local, "kwargs": {}}] if dags_folder_bundle else []
    return [*bundles, {"name": "falkirk", "classpath": local, "kwargs": {"path": str(BUNDLE)}}]


def trigger_recovery(client: AirflowClient, plan_id: str, then: Sequence[str] = (), holder: str = "") -> str:
    """Start a ``falkirk_recovery`` run carrying out ``plan_id`` (then ``then``); returns its run id."""
    now = datetime.now(UTC)
    run_id = f"replay-{plan_id}-{now:%Y%m%dT%H%M%S%f}"
    client.trigger(RECOVERY_DAG, run_id, now, conf={"plan_id": plan_id, "then": list(then), "holder": holder})
    return run_id


def service_client() -> AirflowClient:
    """A client of Airflow's REST API as the ``falkirk_airflow`` connection names it."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(CONNECTION)
    scheme = conn.schema or "http"
    url = f"{scheme}://{conn.host}" + (f":{conn.port}" if conn.port else "")
    # A replay outlives an API-server restart: its calls wait for the server to come back.
    return AirflowClient(url, conn.login or "", conn.password or "", refused_seconds=REFUSED_SECONDS)


def replay_in_task(context: Mapping[str, Any]) -> dict[str, Any]:
    """The ``replay`` task of ``falkirk_recovery``: carry the run's plan out, printing progress."""
    from falkirk.plugins.asset_recovery import replay_across
    from falkirk.plugins.store_hook import FalkirkStoreHook

    params, ti = context["params"], context["ti"]
    plan_id, then = str(params.get("plan_id") or ""), [str(p) for p in params.get("then") or []]
    if not plan_id:
        raise ValueError("params.plan_id: give the plan to carry out (falkirk plan prints its id)")
    store = FalkirkStoreHook().get_store()
    holder = f"{params.get('holder') or 'airflow'} via {RECOVERY_DAG}/{context['run_id']}"
    if ti.try_number > 1:
        _take_over_from_earlier_attempt(store, plan_id, holder, ti.try_number)
    reports = replay_across([plan_id, *then], store, service_client(), holder=holder, progress=print)
    return {r.plan_id: {run: list(tasks) for run, tasks in r.cleared.items()} for r in reports}


def _take_over_from_earlier_attempt(store: StoreConfig, plan_id: str, holder: str, try_number: int) -> None:
    """Release the lease this task's earlier attempt held (killed before it gave it back): Airflow
    starts attempt ``try_number`` only once the one before ended."""
    log = RecoveryLog(store)
    dag_id = log.plan(plan_id).dag_id
    held = open_lease(log.events(dag_id), dag_id)
    if held is not None and held.holder == holder and not held.expired():
        log.release(dag_id, by=holder, reason=f"attempt {try_number - 1} of this task ended without giving the "
                                              f"lease back; attempt {try_number} resumes the plan")
