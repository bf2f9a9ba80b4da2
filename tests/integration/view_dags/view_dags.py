"""Airflow DAG file for the Falkirk view's tests.

* ``clicks_ui``: a copy of dags/falkirk_clicks.py, run for a few epochs with one failure, plus
  ``notify``, a plain Airflow task Falkirk does not manage;
* ``falkirk_wide``: 50 tasks in 10 layers of 5, every regime, never run: its ledger
  history (500 epochs) is written directly by the test, to time the view on a long history.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, LazyCheckpoint

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("falkirk_clicks_dag", ROOT / "dags" / "falkirk_clicks.py")
_clicks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_clicks)

clicks_ui = _clicks.build_dag("clicks_ui")
with clicks_ui:
    EmptyOperator(task_id="notify")  # no regime: shown as not managed, never planned

LAYERS, WIDTH = 10, 5
REGIMES = [Ephemeral(), Batch(log_outputs=True), LazyCheckpoint(every=3), EagerCheckpoint()]


def wide_graph() -> dict[str, tuple[object, tuple[str, ...]]]:
    """task id -> (regime, upstream task ids): layer 0 are sources; every other task reads the
    task above it and the one above-left of it."""
    graph = {}
    for layer in range(LAYERS):
        for col in range(WIDTH):
            up = () if layer == 0 else tuple(sorted({f"t{layer - 1}_{col}", f"t{layer - 1}_{max(col - 1, 0)}"}))
            regime = REGIMES[0] if layer == 0 else REGIMES[1 + (layer + col) % 3]
            graph[f"t{layer}_{col}"] = (regime, up)
    return graph


with DAG(dag_id="falkirk_wide", schedule=EpochTimetable(_clicks.EPOCHS), start_date=_clicks.EPOCHS.first,
         catchup=False,
         tags=["falkirk"]) as falkirk_wide:
    _ops = {t: RegimeSparkSubmitOperator(task_id=t, application=str(ROOT / "spark_jobs" / "clicks" / "source.py"),
                                         regime=regime) for t, (regime, _) in wide_graph().items()}
    for _t, (_, _ups) in wide_graph().items():
        for _u in _ups:
            _ops[_u] >> _ops[_t]
