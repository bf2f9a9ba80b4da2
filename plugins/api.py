"""The Falkirk plugin's HTTP API, mounted in the Airflow API server under ``/falkirk``.

Airflow does not authenticate plugin apps by itself, so every route here declares the
same auth dependencies as Airflow's own REST API: a caller needs a valid token (bearer
header or the UI's session cookie) and read access to the DAG it asks about.

Example::

    curl -H "Authorization: Bearer $TOKEN" http://127.0.0.1:8080/falkirk/api/v1/dags/orders/ledger
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import Depends, FastAPI, HTTPException

from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.models.serialized_dag import SerializedDagModel
from policies.ledger import Ledger, LedgerEntry
from policies.store import StoreConfig, StoreError

app = FastAPI(
    title="Falkirk",
    description="Checkpoints, rollback frontiers and replay for Airflow pipelines of Spark jobs.",
)


def _ledger() -> Ledger:
    try:
        return Ledger(StoreConfig.from_env())
    except StoreError as exc:
        raise HTTPException(status_code=503, detail=f"the Falkirk store is not configured: {exc}") from exc


@app.get("/api/v1/health")
def health(user: GetUserDep) -> dict[str, Any]:
    """Whether the plugin is loaded and can see its store."""
    ledger = _ledger()
    return {"status": "ok", "ledger": ledger.uri}


@app.get("/api/v1/dags/{dag_id}/ledger", dependencies=[Depends(requires_access_dag("GET"))])
def dag_ledger(dag_id: str) -> dict[str, Any]:
    """Every checkpoint recorded for ``dag_id``, ordered by epoch and task."""
    entries = _ledger().entries(dag_id)
    return {"dag_id": dag_id, "total_entries": len(entries), "entries": [_entry_json(e) for e in entries]}


@app.get("/api/v1/dags/{dag_id}/regimes", dependencies=[Depends(requires_access_dag("GET"))])
def dag_regimes(dag_id: str, session: SessionDep) -> dict[str, Any]:
    """Each task's fault-tolerance regime, read from the serialized DAG (no DAG file is imported)."""
    dag = SerializedDagModel.get_dag(dag_id, session=session)
    if dag is None:
        raise HTTPException(status_code=404, detail=f"DAG {dag_id!r} is not in the metadata database")
    tasks = [{"task_id": t.task_id, "regime": getattr(t, "falkirk_regime", None)} for t in dag.tasks]
    return {"dag_id": dag_id, "tasks": sorted(tasks, key=lambda t: t["task_id"])}


def _entry_json(entry: LedgerEntry) -> dict[str, Any]:
    data = asdict(entry)
    data["committed_at"] = entry.committed_at.isoformat()
    data["frontier"] = entry.frontier
    data["output_rows"] = entry.output_rows
    return data
