"""The Airflow plugin object, registered through the ``airflow.plugins`` entry point.

It mounts the API (:mod:`falkirk.plugins.api`) at ``/falkirk`` and adds the Falkirk view to the
Airflow UI twice: as a tab of every DAG (``/dags/{dag_id}/plugin/falkirk``) and of every
task instance (``.../tasks/{task_id}/plugin/falkirk-task``, with that instance preselected
as the failure). The two entries load the bundle under different URLs because the UI
evaluates each bundle URL once. It also registers :class:`~falkirk.plugins.timetable.EpochTimetable`,
which Airflow's scheduler and API server need to read a DAG scheduled on epochs.
"""

from __future__ import annotations

import sys
from typing import Any

from airflow.plugins_manager import AirflowPlugin

# Every process imports the operator (and the Spark provider) here, when it loads the plugin:
# imported later, inside a database transaction that creates a run's task instances, a cold
# import held SQLite's write lock for a minute.
import falkirk.plugins.operators  # noqa: F401
from falkirk.plugins.task_exit import watch_task_exits
from falkirk.plugins.timetable import EpochTimetable


def _celery_worker(argv: list[str]) -> bool:
    """Whether this process is a Celery worker or one of its task processes (they share its argv).

    >>> _celery_worker(["airflow", "celery", "worker", "--queues", "default"]), _celery_worker(["airflow", "scheduler"])
    (True, False)
    """
    return "celery" in argv[1:3]


# The scheduler, the API server, the DAG processor and the triggerer import the API's modules
# (delta-rs, pyarrow, the planner) as they load the plugin, not later: imported for the first
# time inside a metadata-database transaction (a trigger), they held SQLite's write lock for
# 60 s in a test drill, and which late import did it is not pinned down. A LocalExecutor's task processes are forked from the scheduler with
# these already imported. A Celery worker's task processes skip them: they never serve the API,
# and the import added 3.5 s to each task instance's start.
if not _celery_worker(sys.argv):
    import falkirk.plugins.api  # noqa: F401,E402

# The executors' task supervisors in this process and those it forks (a LocalExecutor's workers,
# a Celery worker's pool, the DAG processor's parsers) free their slot when their process exits,
# not up to a heartbeat interval later (falkirk.plugins.task_exit).
watch_task_exits()

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
        """The API, read by the API server when it starts (a Celery worker's task processes,
        which load the plugins too, never import it)."""
        from falkirk.plugins.api import app

        return [{"app": app, "url_prefix": "/falkirk", "name": "Falkirk"}]
