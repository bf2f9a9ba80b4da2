"""Airflow DAG file for the soak (devstack/soak/run.py): the DAGs of ``dags/`` that
``FALKIRK_SOAK_DAGS`` names (comma-separated DAG ids; default ``falkirk_figure1``), each as its
own file builds it; those ``FALKIRK_SOAK_AUTO_RECOVER`` names are opted in to replays without a
person (the tag ``falkirk:auto_recover``, which ``falkirk watch`` reads), as a deployment
would opt them in. The soak's failure-free copies run without Airflow."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

DAGS = Path(__file__).resolve().parents[3] / "dags"
AUTO_RECOVER = set(os.environ.get("FALKIRK_SOAK_AUTO_RECOVER", "").split(","))

for _dag_id in filter(None, os.environ.get("FALKIRK_SOAK_DAGS", "falkirk_figure1").split(",")):
    _spec = importlib.util.spec_from_file_location(f"{_dag_id}_soak", DAGS / f"{_dag_id}.py")
    assert _spec is not None and _spec.loader is not None, _dag_id
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    if _dag_id in AUTO_RECOVER:
        _module.dag.tags.add("falkirk:auto_recover")
    globals()[_dag_id] = _module.dag
