"""Airflow DAG file for the recovery drills: copies of dags/falkirk_clicks.py, each with its own
tables (clicks_ref runs failure-free; clicks_a, _b, _c, _k and _g each get one failure; clicks_s
runs its jobs on a worker whose clock is a minute ahead)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "falkirk_clicks_dag", Path(__file__).resolve().parents[4] / "dags" / "falkirk_clicks.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

for _name in ("clicks_ref", "clicks_a", "clicks_b", "clicks_c", "clicks_k", "clicks_g"):
    globals()[_name] = _module.build_dag(_name)  # airflow DAG objects, found by the dag-processor

# Each job of clicks_s runs in a fresh interpreter (a warm job host serves the other DAGs too)
# that loads ../clock_ahead/sitecustomize.py: the rows it writes are stamped a minute ahead.
clicks_s = _module.build_dag("clicks_s")
_clock_ahead = {
    "FALKIRK_JOB_HOST": "off",
    "FALKIRK_TEST_CLOCK_AHEAD_SECONDS": "60",
    "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1] / "clock_ahead"),
                                                os.environ.get("PYTHONPATH")])),
}
for _task in clicks_s.tasks:
    _task.env_vars = {**(_task.env_vars or {}), **_clock_ahead}
