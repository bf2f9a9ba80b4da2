"""What the ``falkirk-airflow`` distribution registers with Airflow's providers manager
(the ``apache_airflow_provider`` entry point): the store's connection type, the hook, the
operator, the ``@task.falkirk`` decorator, and the plugin (the API at ``/falkirk`` and the
Falkirk view).

Imports nothing: Airflow calls it while it reads its own configuration.

>>> info = get_provider_info()
>>> info["package-name"], [c["connection-type"] for c in info["connection-types"]]
('falkirk-airflow', ['falkirk_store'])
"""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "falkirk-airflow",
        "name": "Falkirk",
        "description": "Falkirk Wheel rollback recovery for Airflow pipelines of Spark jobs, with checkpoints in "
                       "Delta tables.",
        "integrations": [{"integration-name": "Falkirk", "tags": ["software"]}],
        "operators": [{"integration-name": "Falkirk", "python-modules": ["falkirk.plugins.operators"]}],
        "hooks": [{"integration-name": "Falkirk", "python-modules": ["falkirk.plugins.store_hook"]}],
        "connection-types": [{
            "connection-type": "falkirk_store",
            "hook-class-name": "falkirk.plugins.store_hook.FalkirkStoreHook",
            "hook-name": "Falkirk store",
            "ui-field-behaviour": {"hidden-fields": ["host", "port", "schema"],
                                   "relabeling": {"login": "Access key id", "password": "Secret access key"}},
            "conn-fields": {
                "store_uri": {"label": "Durable store", "description": "a local path or s3://bucket/prefix",
                              "schema": {"type": ["string", "null"]}},
                "scratch_uri": {"label": "Scratch root", "description": "a directory on each worker's local disk",
                                "schema": {"type": ["string", "null"]}},
                "endpoint_url": {"label": "S3 endpoint", "description": "for MinIO or another S3-compatible server",
                                 "schema": {"type": ["string", "null"]}},
                "region_name": {"label": "Region", "schema": {"type": ["string", "null"]}},
            },
        }],
        "plugins": [{"name": "falkirk", "plugin-class": "falkirk.plugins.falkirk_plugin.FalkirkPlugin"}],
        "task-decorators": [{"name": "falkirk", "class-name": "falkirk.plugins.taskflow.falkirk_task"}],
    }
