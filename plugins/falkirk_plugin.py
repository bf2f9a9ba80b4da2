"""The Airflow plugin object, registered through the ``airflow.plugins`` entry point.

It mounts the API (:mod:`falkirk.plugins.api`) at ``/falkirk`` and adds the Falkirk view to the
Airflow UI twice: as a tab of every DAG (``/dags/{dag_id}/plugin/falkirk``) and of every
task instance (``.../tasks/{task_id}/plugin/falkirk-task``, with that instance preselected
as the failure). The two entries load the bundle under different URLs because the UI
evaluates each bundle URL once. It also registers :class:`~falkirk.plugins.timetable.EpochTimetable`,
which Airflow's scheduler and API server need to read a DAG scheduled on epochs.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

# The scheduler and the API server import the operator (and the Spark provider) here, when they
# start: imported later, inside a database transaction that creates a run's task instances, a
# cold import held SQLite's write lock for a minute.
import falkirk.plugins.operators  # noqa: F401
from falkirk.plugins.timetable import EpochTimetable

BUNDLE = "falkirk/ui/falkirk.js"


class FalkirkPlugin(AirflowPlugin):
    """The Falkirk API and view."""

    name = "falkirk"
    timetables = [EpochTimetable]
    react_apps = [
        {"name": "Falkirk", "bundle_url": f"{BUNDLE}?mount=dag", "destination": "dag", "url_route": "falkirk"},
        {"name": "Falkirk recovery", "bundle_url": f"{BUNDLE}?mount=task_instance",
         "destination": "task_instance", "url_route": "falkirk-task"},
    ]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The API, imported only by the process that serves it: every task process loads the
        plugins too, and the API's modules (FastAPI, Airflow's API app, the planner) would add
        seconds to each task instance."""
        from falkirk.plugins.api import app

        return [{"app": app, "url_prefix": "/falkirk", "name": "Falkirk"}]
