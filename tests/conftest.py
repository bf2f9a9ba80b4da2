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


# `make test` runs the suite on two pytest-xdist workers (`--dist loadgroup`). Tests that share a
# started component stay on one worker, as one group: a module with its module-scoped
# deployment, the recovery drills with their package's Airflow, and the two cluster modules one
# after the other (each starts a whole distributed shape; two at once on two cores only slow
# both). Groups are handed out longest first, so the last to start are short: these are the
# groups of over two minutes, longest first; the rest follow in collection order.
LONGEST_FIRST = ("cluster", "recovery", "test_steps", "test_falkirk_view", "test_collector", "test_packaging",
                 "test_s3_outage", "test_s3_store", "test_figure1", "test_partitions", "test_loop_rollback",
                 "test_pipeline_airflow", "test_standalone_spark")


def worker_group(path: Path) -> str:
    """The xdist group of a test module: what it shares a started component with (the unit tests
    start none, and go as one group)."""
    if "integration" not in path.parts:
        return "unit"
    if "recovery" in path.parts:
        return "recovery"
    if path.stem in ("test_cluster", "test_cluster_partitions"):
        return "cluster"
    return path.stem


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if "integration" in path.parts:
            item.add_marker(pytest.mark.integration)
        item.add_marker(pytest.mark.xdist_group(worker_group(path)))
    first_seen = {group: i for i, group in reversed(list(enumerate(worker_group(Path(str(item.fspath)))
                                                                     for item in items)))}

    def rank(item: pytest.Item) -> tuple[int, int]:
        group = worker_group(Path(str(item.fspath)))
        return (LONGEST_FIRST.index(group), 0) if group in LONGEST_FIRST else (len(LONGEST_FIRST), first_seen[group])

    items.sort(key=rank)  # stable: a group's tests keep their order
