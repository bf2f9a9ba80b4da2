"""Shared fixtures. Everything under tests/integration starts real components."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # The suite's Airflow deployments start no triggerer: no Falkirk task defers, and each
    # deployment would spend the triggerer's start-up (about 12 s of CPU) for nothing.
    from devstack.airflow import TRIGGERER_ENV

    os.environ.setdefault(TRIGGERER_ENV, "0")


# `make test` runs the tests that start a whole distributed shape (the cluster modules, marked
# `alone` here) first, in one process: beside another test's load the shape once lost a Spark
# executor. It runs the rest on two pytest-xdist workers (see the Makefile). Tests that share a
# started component stay on one worker, as one group: a module with its module-scoped
# deployment, the recovery drills with their package's Airflow. Groups are handed out in this
# order, the rest after them in collection order: the long groups first, short groups last.
ALONE = ("cluster",)
GROUP_ORDER = ("recovery", "test_sender_logs", "test_steps", "test_collector", "test_assets_airflow",
               "test_getting_started", "test_pairs", "test_falkirk_view", "test_partitions", "test_pipeline_airflow",
               "test_figure1", "test_s3_store", "test_packaging", "test_s3_outage", "test_standalone_spark",
               "test_sampled", "test_loop_rollback")


def worker_group(path: Path) -> str:
    """The group of a test module: what it shares a started component with. A unit module starts
    none and is a group of its own: handed out last, they let both workers finish together.

    >>> worker_group(Path("tests/integration/recovery/test_staleness.py")), worker_group(Path("tests/unit/test_view.py"))
    ('recovery', 'unit/test_view')
    """
    if "integration" not in path.parts:
        return f"unit/{path.stem}"
    if "recovery" in path.parts:
        return "recovery"
    if "cluster" in path.parts:
        return "cluster"
    return path.stem


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201 (xdist's own types)
    """With ``--dist loadgroup``, xdist's scope-by-scope scheduler with :func:`worker_group` as the
    scope (xdist's own ``xdist_group`` marks do not reach its scheduler under this pytest)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(Path(nodeid.split("::")[0]))

    return ByGroup(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)
        if worker_group(Path(str(item.fspath))) in ALONE:
            item.add_marker(pytest.mark.alone)
    groups = [worker_group(Path(str(item.fspath))) for item in items]
    first_seen = {group: i for i, group in reversed(list(enumerate(groups)))}
    rank = {id(item): (GROUP_ORDER.index(g), 0) if g in GROUP_ORDER else (len(GROUP_ORDER), first_seen[g])
            for item, g in zip(items, groups)}
    items.sort(key=lambda item: rank[id(item)])  # stable: a group's tests keep their order
