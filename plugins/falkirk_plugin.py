"""The Airflow plugin object, registered through the ``airflow.plugins`` entry point."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from plugins.api import app


class FalkirkPlugin(AirflowPlugin):
    """Mounts the Falkirk API at ``/falkirk`` in the Airflow API server."""

    name = "falkirk"
    fastapi_apps = [{"app": app, "url_prefix": "/falkirk", "name": "Falkirk"}]
