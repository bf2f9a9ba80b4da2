"""Airflow's side of sender-side logs: the DAG-parse checks (a cluster policy).

A DAG with a :class:`~falkirk.policies.regimes.SenderLog` task is refused when the dag-processor
parses it (the error shows on Airflow's import-errors page, naming the tasks and the fix) if:

* a SenderLog task's ``release=`` does not name exactly its data inputs (the tasks it reads:
  its upstream Falkirk tasks and its ``concurrent_inputs``);
* a SenderLog task is partitioned (not supported yet: read a partitioned task from one that is not);
* the data graph is not uniform (two walks between the same pair of tasks of different lengths,
  or a cycle): the protocol's slices need it (:func:`~falkirk.policies.sender_logs.graph.check_uniform`).

Example of the error, for ``A >> B >> D`` and ``A >> D``::

    data edges from A to D: walks of lengths [1, 2] (A -> D; A -> B -> D). Sender-side logs need
    every walk between two tasks to have the same length (a uniform graph): drop the edge A >> D, ...
"""

from __future__ import annotations

from typing import Any

from falkirk.plugins import hookimpl
from falkirk.policies.regimes import SenderLog
from falkirk.policies.sender_logs.graph import GraphError, check_uniform


def data_edges(dag: Any) -> list[tuple[str, str]]:
    """The DAG's data edges, (producer, reader), among its Falkirk tasks."""
    from falkirk.plugins.task_metadata import concurrent_inputs_of, regime_of

    falkirk = {t.task_id for t in dag.tasks if regime_of(t) is not None}
    edges = []
    for task in dag.tasks:
        if task.task_id not in falkirk:
            continue
        inputs = set(task.upstream_task_ids) | set(concurrent_inputs_of(task))
        edges += [(u, task.task_id) for u in sorted(inputs & falkirk)]
    return edges


def check_dag(dag: Any) -> None:
    """Refuse ``dag`` (:class:`AirflowClusterPolicyViolation`) if a SenderLog task cannot run as
    declared; see the module docstring."""
    from falkirk.plugins.task_metadata import partitions_of, regime_of

    logged = {t.task_id: r for t in dag.tasks if isinstance(r := regime_of(t), SenderLog)}
    if not logged:
        return
    edges = data_edges(dag)
    problems = []
    for task_id, regime in sorted(logged.items()):
        inputs = sorted(u for u, v in edges if v == task_id)
        declared = sorted(regime.policies())
        if declared != inputs:
            problems.append(f"task {task_id!r}: release= names {declared} but the task reads {inputs}; give one "
                            f"release policy per input, e.g. release={{{', '.join(f'{u!r}: ...' for u in inputs)}}}")
        if partitions_of(dag.get_task(task_id)) is not None:
            problems.append(f"task {task_id!r}: {regime.name} does not run partitioned tasks yet; leave it "
                            f"unpartitioned (it may read a partitioned task)")
    try:
        check_uniform(edges)
    except GraphError as exc:
        problems.append(str(exc))
    if problems:
        from airflow.exceptions import AirflowClusterPolicyViolation

        raise AirflowClusterPolicyViolation(f"DAG {dag.dag_id!r}: " + "; ".join(problems))


@hookimpl
def dag_policy(dag: Any) -> None:
    """The cluster policy Airflow calls on every DAG it parses."""
    check_dag(dag)


__all__ = ["check_dag", "dag_policy", "data_edges"]
