"""The import arrows: dags -> plugins -> policies <- spark_jobs, all under the one import name
``falkirk`` (``falkirk.policies`` is the folder ``policies/``); nothing imports a bare
``policies``, ``plugins`` or ``spark_jobs``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_roots(folder: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                parts = name.split(".")
                root = parts[1] if parts[0] == "falkirk" and len(parts) > 1 else parts[0]
                found.setdefault(root, set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("folder, forbidden", [
    ("policies", {"airflow", "pyspark", "plugins", "spark_jobs", "dags", "devstack"}),
    ("spark_jobs", {"plugins", "airflow", "dags", "devstack"}),
    ("plugins", {"spark_jobs", "pyspark", "dags", "devstack"}),
    # DAG files are thin: the operator and the application's constants, never Spark or the dev stack.
    ("dags", {"pyspark", "devstack", "deltalake", "pyarrow"}),
])
def test_layers_do_not_import_across(folder: str, forbidden: set[str]) -> None:
    roots = imported_roots(folder)
    assert not {k: v for k, v in roots.items() if k in forbidden}


@pytest.mark.parametrize("folder", ["policies", "plugins", "spark_jobs", "dags", "devstack", "tests", "benchmarks"])
def test_the_package_is_imported_only_under_its_namespace(folder: str) -> None:
    bare = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            bare.update({f"{path.relative_to(ROOT)}:{node.lineno}": n for n in names
                         if n.split(".")[0] in ("policies", "plugins", "spark_jobs")})
    assert not bare


def test_the_checker_sees_imports() -> None:  # guards against a checker that finds nothing
    assert "pyspark" in imported_roots("spark_jobs") and "airflow" in imported_roots("plugins")


def test_every_subpackage_is_in_the_wheel() -> None:
    """pyproject.toml lists the packages by hand: a new subpackage left out would import here
    (the checkout is on the path) and be missing from a team's install."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"falkirk." + ".".join(init.parent.relative_to(ROOT).parts)
             for folder in ("policies", "plugins", "spark_jobs") for init in (ROOT / folder).rglob("__init__.py")}
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
