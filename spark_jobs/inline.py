"""The Spark driver of a job written inline in a DAG file (the TaskFlow form,
:mod:`falkirk.plugins.taskflow`).

``python inline.py --dag-file FILE --job NAME <job arguments>`` (or the same through
``spark-submit``) loads the DAG file, takes the function the decorator kept as
``NAME.function``, and runs it with :func:`~falkirk.spark_jobs.runtime.run_job`: the same
commits, ledger row and recovery as a job in a file of its own. The DAG file is loaded
under a name of its own and its functions are shipped to executors by value, since
executors cannot import a DAG file.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job


class InlineJobError(RuntimeError):
    """The DAG file or the job in it cannot be found; the message names which."""


def load_job(dag_file: str, name: str) -> Callable[[EpochContext], EpochResult]:
    """The function of inline job ``name`` in ``dag_file``."""
    path = Path(dag_file)
    if not path.is_file():
        raise InlineJobError(f"--dag-file {dag_file!r} does not exist on this machine; the DAG file must be "
                             f"readable where the task runs")
    module_name = f"falkirk_inline_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise InlineJobError(f"--dag-file {dag_file!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)  # executors cannot import the DAG file
    job = getattr(getattr(module, name, None), "function", None)
    if not callable(job):
        raise InlineJobError(f"{dag_file} has no inline job {name!r}: decorate a function of an EpochContext "
                             f"with @falkirk_task (or @task.falkirk) at the module's top level")
    return job


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one epoch of a job written inline in a DAG file.")
    parser.add_argument("--dag-file", required=True)
    parser.add_argument("--job", required=True, help="the decorated function's name in the DAG file")
    ns, rest = parser.parse_known_args(argv)
    try:
        job = load_job(ns.dag_file, ns.job)
    except InlineJobError as exc:
        print(f"[falkirk] {exc}", file=sys.stderr, flush=True)
        return 2
    return run_job(job, rest)


if __name__ == "__main__":
    raise SystemExit(main())
