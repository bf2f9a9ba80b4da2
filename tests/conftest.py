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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)
