"""Every docstring example in the package runs, on the modules as they are imported: under
``falkirk`` (``falkirk.policies``, ``falkirk.plugins``, ``falkirk.spark_jobs``)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("falkirk.policies", "falkirk.plugins", "falkirk.spark_jobs")
MODULES = sorted({*PACKAGES, *(m.name for p in PACKAGES
                               for m in pkgutil.walk_packages(importlib.import_module(p).__path__, f"{p}."))})


def test_every_subpackage_is_walked() -> None:  # guards against a walk that finds nothing
    assert {"falkirk.policies.rollback.solver", "falkirk.plugins.operators", "falkirk.spark_jobs.runtime"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(module, name):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
