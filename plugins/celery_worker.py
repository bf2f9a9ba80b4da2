"""The Celery configuration for Airflow workers that run Falkirk tasks.

A Celery worker's pool processes fork one task process per task instance, and each task process
loads Airflow's plugins before it parses its DAG file: the Falkirk plugin, through it the operator
and the Spark provider (which imports the Kubernetes clients), OpenLineage's listener. On a
LocalExecutor the task processes fork from the scheduler, which has them loaded already; on
Celery each task instance paid about half a second for them (1.5 s on a loaded machine) before its
job started. With this configuration the worker loads them once, when it starts, before it forks
its pool, and every task process inherits them::

    [celery]
    celery_config_options = falkirk.plugins.celery_worker.CELERY_CONFIG

It is Airflow's default Celery configuration (``DEFAULT_CELERY_CONFIG``), unchanged; only the
worker's start-up differs. A deployment with a Celery configuration of its own keeps it and
imports this module from it (the import connects the start-up hook).
"""

from __future__ import annotations

from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
from celery.signals import import_modules

CELERY_CONFIG: dict[str, Any] = DEFAULT_CELERY_CONFIG


@import_modules.connect
def load_plugins_before_the_pool_forks(*args: Any, **kwargs: Any) -> None:
    """Load Airflow's plugins (and the task runner's DAG-file reader) in the worker's main process.

    Celery sends ``import_modules`` once, in the worker's main process, before it starts its pool;
    Airflow's own handler preloads the operators it ships the same way.
    """
    from airflow.dag_processing.dagbag import BundleDagBag  # noqa: F401
    from airflow.sdk.listener import get_listener_manager

    get_listener_manager()  # loads every plugin: what the task runner does first in each task process
