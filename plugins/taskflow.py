"""The TaskFlow form: a job written inline in a DAG file, as a function of an ``EpochContext``.

Example (a DAG file)::

    from falkirk.plugins.taskflow import falkirk_task      # or @task.falkirk(...)
    from falkirk.policies import Batch
    from falkirk.spark_jobs.runtime import EpochResult

    @falkirk_task(regime=Batch(log_outputs=True))
    def top_customers(ctx):
        totals = ctx.read_input("aggregate")
        return EpochResult(outputs={"output": totals.orderBy("customer").limit(3)})

    with DAG(..., default_args={"epoch_clock": EPOCHS}):
        aggregate >> top_customers()

Calling the decorated function inside a DAG adds one task (its id is the function's name,
or ``task_id=``): a :class:`~falkirk.plugins.operators.RegimeSparkSubmitOperator` whose
job is :mod:`falkirk.spark_jobs.inline` running this function. It therefore has exactly
the runtime's guarantees (idempotent commits, a ledger row, recovery) and runs wherever
the operator runs its jobs (``spark-submit`` on the Spark connection, or a Spark Connect
client). The function's module is the DAG file, read where the task runs; the function
must be defined at the module's top level.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from falkirk.plugins.operators import PartitionedPartial, RegimeSparkSubmitOperator
from falkirk.policies.job_spec import JobSpec

INLINE_JOB = "falkirk.spark_jobs.inline"
DB_URL_VARIABLES = ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__SQL_ALCHEMY_CONN")


class InlineJobOperator(RegimeSparkSubmitOperator):
    """Runs the inline job ``job`` of its own DAG file for the DAG run's epoch."""

    # The DAG file imports Airflow and this package (about 3 s): a job host that has imported
    # them serves the inline jobs, so that a job pays only the DAG file's own execution.
    job_host_preload = ("airflow.sdk", "falkirk.plugins.taskflow")

    def __init__(self, *, job: str, **kwargs: Any) -> None:
        super().__init__(application=INLINE_JOB, **kwargs)
        self.inline_job = job

    def job_argv(self, spec: JobSpec) -> list[str]:
        return ["--dag-file", str(self.dag.fileloc), "--job", self.inline_job, *spec.argv()]

    def job_env(self) -> dict[str, str]:
        # The driver loads the DAG file, so it imports Airflow, which refuses to start on the
        # URL a task's process is given to block the metadata database. The driver never uses
        # a database: an in-memory one lets it load.
        return {**super().job_env(), **{k: "sqlite://" for k in DB_URL_VARIABLES}}


class FalkirkJob:
    """A decorated job function: call it inside a DAG to add its task (keyword arguments
    override the decorator's, e.g. ``task_id``); ``function`` is the job itself."""

    def __init__(self, function: Callable[..., Any], operator_kwargs: dict[str, Any]) -> None:
        if function.__qualname__ != function.__name__ or function.__name__ == "<lambda>":
            raise TypeError(f"@falkirk_task: {function.__qualname__!r} must be a function defined at the top level "
                            f"of the DAG file, so that the task can find it where it runs")
        self.function = function
        self.operator_kwargs = operator_kwargs
        functools.update_wrapper(self, function)

    def partial(self, **overrides: Any) -> PartitionedPartial:
        """The task's arguments, to be partitioned with ``.expand(partition=range(N))``."""
        kwargs = {"task_id": self.function.__name__, **self.operator_kwargs, **overrides}
        return InlineJobOperator.partial(job=self.function.__name__, **kwargs)

    def expand(self, **mapped: Any) -> Any:
        """The task partitioned: ``.expand(partition=range(N))`` adds N task instances."""
        return self.partial().expand(**mapped)

    def __call__(self, **overrides: Any) -> InlineJobOperator:
        kwargs = {"task_id": self.function.__name__, **self.operator_kwargs, **overrides}
        return InlineJobOperator(job=self.function.__name__, **kwargs)


def falkirk_task(python_callable: Callable[..., Any] | None = None, **operator_kwargs: Any):
    """Turn a function of an ``EpochContext`` into a regime-tagged task (``regime=`` is
    required; any other argument of :class:`RegimeSparkSubmitOperator` may follow).

    >>> from falkirk.policies import EagerCheckpoint
    >>> @falkirk_task(regime=EagerCheckpoint())
    ... def totals(ctx):
    ...     return None
    >>> totals.function.__name__, totals.operator_kwargs["regime"].spec()
    ('totals', 'eager_checkpoint')
    """
    if "regime" not in operator_kwargs:
        raise TypeError("@falkirk_task needs regime=, e.g. @falkirk_task(regime=EagerCheckpoint())")

    def wrap(function: Callable[..., Any]) -> FalkirkJob:
        return FalkirkJob(function, operator_kwargs)

    return wrap if python_callable is None else wrap(python_callable)
