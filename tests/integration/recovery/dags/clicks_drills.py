"""Airflow DAG file for the recovery drills: six copies of dags/falkirk_clicks.py, each
with its own tables (clicks_ref runs failure-free; clicks_a, _b, _c, _k and _g each get one failure)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "falkirk_clicks_dag", Path(__file__).resolve().parents[4] / "dags" / "falkirk_clicks.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

for _name in ("clicks_ref", "clicks_a", "clicks_b", "clicks_c", "clicks_k", "clicks_g"):
    globals()[_name] = _module.build_dag(_name)  # airflow DAG objects, found by the dag-processor
