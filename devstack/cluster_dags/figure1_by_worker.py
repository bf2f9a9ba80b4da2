"""Airflow DAG file for the distributed shape's demo (devstack/cluster_demo.py): the reference
application (dags/falkirk_figure1.py) twice, ``falkirk_figure1`` and its failure-free copy
``falkirk_figure1_reference``. The queue each copy asks for is read from the JSON file named by
``FALKIRK_DEMO_QUEUES`` (the demo rewrites it to move a copy); each copy is one scratch group,
so placement keeps all its tasks on one worker."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "falkirk_figure1_dag", Path(__file__).resolve().parents[2] / "dags" / "falkirk_figure1.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

_file = Path(os.environ.get("FALKIRK_DEMO_QUEUES", "/nonexistent"))
QUEUES = json.loads(_file.read_text()) if _file.is_file() else {}

falkirk_figure1 = _module.build_dag("falkirk_figure1", queue=QUEUES.get("falkirk_figure1", "default"))
falkirk_figure1_reference = _module.build_dag("falkirk_figure1_reference",
                                              queue=QUEUES.get("falkirk_figure1_reference", "default"))
