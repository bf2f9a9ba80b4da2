"""Airflow DAG file for the distributed shape's demo and benchmark (devstack/cluster_demo.py,
benchmarks/recovery_bench.py): copies of the reference application (dags/falkirk_figure1.py),
one per entry of the JSON file named by ``FALKIRK_DEMO_QUEUES``, ``{dag_id: queue}`` (the demo
rewrites it to move a copy); without it, ``falkirk_figure1`` and its failure-free copy
``falkirk_figure1_reference`` on the default queue. Each copy is one scratch group, so placement
keeps all its tasks on one worker."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "falkirk_figure1_dag", Path(__file__).resolve().parents[2] / "dags" / "falkirk_figure1.py")
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

_file = Path(os.environ.get("FALKIRK_DEMO_QUEUES", "/nonexistent"))
QUEUES: dict[str, str] = (json.loads(_file.read_text()) if _file.is_file()
                          else {"falkirk_figure1": "default", "falkirk_figure1_reference": "default"})

for _dag_id, _queue in QUEUES.items():
    globals()[_dag_id] = _module.build_dag(_dag_id, queue=_queue)
