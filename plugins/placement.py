"""Airflow's side of placement: a cluster policy that routes a task instance to its scratch group's home.

Airflow calls ``task_instance_mutation_hook`` when it creates a task instance (a new DAG
run) and when it clears one (a recovery's replay, or the Clear button). For a Falkirk task
in a scratch group (:mod:`falkirk.policies.placement`) the hook sets the instance's queue
to its group's home worker, whose Celery worker consumes a queue of its own name
(``airflow celery worker --queues default,worker-a``). Tasks outside any group keep the
queue the DAG gives them.

Under the KubernetesExecutor there are no queues: the workers are the nodes (``FALKIRK_WORKERS``
names them), a node's scratch tier is a directory on its own disk, and ``pod_mutation_hook``
merges :func:`pod_placement` into each Falkirk task instance's pod as the executor creates it:
the node affinity that pins it to its group's home, the node's scratch directory mounted where
``FALKIRK_SCRATCH_URI`` says, and ``FALKIRK_WORKER`` set to the node the pod runs on, so the
ledger names the node that holds each scratch table.

Installed by the package's ``airflow.policy`` entry point: nothing to add to
``airflow_local_settings.py``. It acts only where ``FALKIRK_WORKERS`` names the workers (in
the scheduler's and the API server's environment; a single machine has none to choose). A
store that stops answering is placed by the facts read last (left on the DAG's queue, an
instance would run on any worker, away from its group's data); one it has never read leaves
the queue as it is and logs why, so a placement problem never stops scheduling.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from falkirk.plugins import hookimpl
from falkirk.policies.ids import ReplicaId
from falkirk.policies.workers import configured_workers

# Airflow loads this module while it initializes, in every process: the store's modules
# (delta-rs, pyarrow) are imported only when a Falkirk task instance is placed.

log = logging.getLogger(__name__)


def _enable_on_run_creation() -> None:
    # Airflow creates a new run's task instances without calling the hook when it believes the
    # hook is a no-op, and it only looks for implementations in airflow_local_settings.py.
    from airflow import settings

    settings.task_instance_mutation_hook.is_noop = False  # type: ignore[attr-defined]


@hookimpl
def task_instance_mutation_hook(task_instance: Any, dag_run: Any = None) -> None:
    """Route a Falkirk task instance to the worker holding its scratch group's data."""
    task = getattr(task_instance, "task", None)
    if task is None or not is_falkirk_task(task):
        return
    if not configured_workers(os.environ):  # one machine: nothing to choose, nothing to import or read
        return
    if runs_on_kubernetes(task_instance):  # no queues: its pod is placed when launched (pod_mutation_hook)
        return
    try:
        # The DAG's queue, not the instance's: Airflow calls the hook again on an instance it has
        # already placed (TaskInstance() calls it, then DagRun creating the run's instances does).
        home = placement_of(task, getattr(task, "queue", None) or task_instance.queue,
                            getattr(task_instance, "map_index", -1))
    except Exception as exc:  # noqa: BLE001 - scheduling goes on; the task's runtime check names the problem
        log.warning("Falkirk placement of %s.%s skipped: %s", task.dag_id, task.task_id, exc)
        return
    if home is not None and task_instance.queue != home:
        log.info("Falkirk placement: %s.%s runs on %s (its scratch group's worker), not queue %s",
                 task.dag_id, task.task_id, home, task_instance.queue)
        task_instance.queue = home


def placement_of(task: Any, queue: str | None = None, map_index: int | None = -1) -> str | None:
    """The worker ``task``'s instances (partition ``map_index`` of a partitioned task) must run
    on, or ``None`` when any worker will do."""
    from falkirk.plugins.operators import concurrent_inputs_of, partitions_of, regime_of
    from falkirk.policies.placement import group_of, home_worker, partitioned_group, scratch_groups
    from falkirk.policies.store import StoreConfig

    dag = task.dag
    tasks = {t.task_id: (regime_of(t), tuple(t.upstream_task_ids)) for t in dag.tasks}
    workers = configured_workers(os.environ)
    regime = tasks[task.task_id][0]
    if regime is not None and regime.replicas > 1 and workers and map_index is not None and map_index >= 0:
        return replica_worker(StoreConfig.from_env(), dag.dag_id, task.task_id, partitions_of(task), map_index,
                              workers)
    concurrent = {t.task_id: concurrent_inputs_of(t) for t in dag.tasks}
    group = group_of(task.task_id, scratch_groups(tasks, concurrent))
    if group is None or not workers:
        return None
    partition = None
    if map_index is not None and map_index >= 0 and partitioned_group(
            group, {t.task_id: partitions_of(t) for t in dag.tasks}):
        partition = map_index
    entries, lost = _placement_facts(StoreConfig.from_env(), dag.dag_id)
    channels = {up for t in group for up in concurrent[t]} & group  # their channel is on their worker's disk
    return home_worker(dag.dag_id, group, entries, workers, lost=lost, preferred=queue, partition=partition,
                       channels=channels)


# dag_id (and store) -> the facts placement reads, kept for the life of the process
_FACTS: dict[tuple[str, str], _PlacementFacts] = {}
_FACTS_LOCK = threading.Lock()
# dag_id (and store) -> the layout table's version and the DAG's process-pair layout at it
_LAYOUTS: dict[tuple[str, str], tuple[Any, Any]] = {}


class _PlacementFacts:
    """One DAG's ledger rows, rollbacks and recovery-log rows, read whole once and then brought
    forward by reading only the commits made since; the answer is computed again only when one
    of the three moved."""

    def __init__(self, store: Any, dag_id: str) -> None:
        from falkirk.policies.planning.recovery_log import SCHEMA, RecoveryLog
        from falkirk.policies.store.ledger import Ledger, LedgerSnapshot, PinnedRows

        log_uri = RecoveryLog(store).uri
        self.snapshot = LedgerSnapshot(Ledger(store), dag_id)
        self.events = PinnedRows(log_uri, store.options_for(log_uri), dag_id, SCHEMA)
        self.events.refresh()
        self.made = time.monotonic()
        self.lock = threading.Lock()
        self.versions: tuple[Any, ...] | None = None
        self.answer: tuple[list[Any], dict[str, Any]] = ([], {})

    def current(self) -> tuple[list[Any], dict[str, Any]]:
        from falkirk.policies.placement import lost_workers

        with self.lock:
            if self.versions is not None:  # the first look is the constructor's read
                try:
                    self.snapshot.refresh()
                    self.events.refresh()
                except Exception as exc:  # noqa: BLE001 - the store blinked: place by what was read last
                    log.warning("Falkirk placement of %s: the store did not answer (%s); placing by the facts read "
                                "last", self.snapshot.dag_id, exc)
                    return self.answer
            versions = (self.snapshot.version, self.snapshot.rollbacks_version, self.events.version)
            if versions != self.versions:
                events = sorted(self.events.rows.to_pylist(), key=lambda e: e["recorded_at"])
                plans = {e["plan_id"]: json.loads(e["detail"]) for e in events if e["event"] == "planned"}
                self.answer, self.versions = (self.snapshot.entries(), lost_workers(events, plans)), versions
            return self.answer


def _placement_facts(store: Any, dag_id: str) -> tuple[list[Any], dict[str, Any]]:
    """The DAG's current ledger rows and its lost workers. Airflow calls the hook several times
    per task instance it creates or clears, holding the metadata database's transaction: each
    call reads only the commits made since the last one (one listing of each table's log when
    nothing moved), never the whole ledger again."""
    from falkirk.policies.store.commits import REOPEN_SECONDS

    key = (store.durable_uri, dag_id)
    with _FACTS_LOCK:
        held = _FACTS.get(key)
        # read whole again now and then, as latest_version reopens its handles: a table deleted
        # and made again is seen
        if held is None or time.monotonic() - held.made > REOPEN_SECONDS:
            try:
                held = _FACTS[key] = _PlacementFacts(store, dag_id)
            except Exception:
                if held is None:
                    raise
                # The store does not answer: an instance left on the DAG's queue would run on
                # any worker, away from its group's data, and split the group for good. The facts
                # read last place it where its group is (or was, a moment ago).
                log.warning("Falkirk placement of %s: the store did not answer; placing by the facts read last",
                            dag_id)
    return held.current()


def replica_worker(store: Any, dag_id: str, task_id: str, partitions: int | None, map_index: int,
                   workers: tuple[str, ...]) -> str:
    """The worker of a paired task's replica, as the layout places it (chained over ``workers``
    before its first epoch records it); a replica declared dead runs on its twin's worker, where
    it ends skipped at once."""
    from falkirk.policies.pairs import Status, with_task
    from falkirk.policies.store.commits import latest_version
    from falkirk.policies.store.control import PairLayouts

    layouts = PairLayouts(store)
    version = latest_version(layouts.uri, store.options_for(layouts.uri))
    key = (store.durable_uri, dag_id)
    with _FACTS_LOCK:  # read again only when the layout table has a new version
        held = _LAYOUTS.get(key)
    if held is None or held[0] != version:
        held = (version, layouts.load(dag_id))
        with _FACTS_LOCK:
            _LAYOUTS[key] = held
    layout = with_task(held[1], task_id, partitions or 1, workers)
    rid = ReplicaId.of(task=task_id, map_index=map_index)
    partition, name = rid.partition, rid.replica
    replica = layout.replica(task_id, partition, name)
    if replica.status is Status.DEAD:
        return next(r.worker for r in layout.pair(task_id, partition) if r.replica != name)
    return replica.worker


SCRATCH_VOLUME = "falkirk-scratch"


def pod_placement(home: str | None, scratch_root: str) -> Any:
    """The part of a Falkirk task's pod that keeps it with its scratch data, as a ``V1Pod`` for
    the KubernetesExecutor's ``pod_override``: pinned to node ``home`` (by node name, the name
    ``FALKIRK_WORKER`` takes from the pod's ``spec.nodeName``; anywhere when ``home`` is None),
    with the node's directory ``scratch_root`` mounted at the same path in the ``base``
    container (none when the scratch tier is in the durable store).

    >>> pod = pod_placement("node-a", "/var/lib/falkirk/scratch")
    >>> pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms[0].match_fields[0].values
    ['node-a']
    >>> pod.spec.containers[0].name, pod.spec.containers[0].volume_mounts[0].mount_path
    ('base', '/var/lib/falkirk/scratch')
    >>> pod.spec.containers[0].env[0].value_from.field_ref.field_path
    'spec.nodeName'
    >>> pod_placement(None, "s3://bucket/scratch").spec.affinity is None
    True
    """
    from kubernetes.client import models as k8s

    from falkirk.policies.workers import WORKER_ENV

    node = k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path="spec.nodeName"))
    base = k8s.V1Container(name="base", env=[k8s.V1EnvVar(name=WORKER_ENV, value_from=node)])
    spec = k8s.V1PodSpec(containers=[base])
    if not scratch_root.startswith("s3://"):  # StoreConfig's scratch_uri: a local path or s3://
        base.volume_mounts = [k8s.V1VolumeMount(name=SCRATCH_VOLUME, mount_path=scratch_root)]
        spec.volumes = [k8s.V1Volume(name=SCRATCH_VOLUME, host_path=k8s.V1HostPathVolumeSource(
            path=scratch_root, type="DirectoryOrCreate"))]
    if home is not None:
        on_home = k8s.V1NodeSelectorRequirement(key="metadata.name", operator="In", values=[home])
        spec.affinity = k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(
                node_selector_terms=[k8s.V1NodeSelectorTerm(match_fields=[on_home])])))
    return k8s.V1Pod(spec=spec)


@hookimpl
def pod_mutation_hook(pod: Any) -> None:
    """Pin a KubernetesExecutor pod of a Falkirk task instance to its scratch group's home node,
    with that node's scratch directory and name (:func:`pod_placement`). The executor calls this
    on every pod it is about to create, as ``airflow kubernetes generate-dag-yaml`` does on the
    pods it renders: placed at launch, a pod follows the latest commit of its group."""
    labels = (pod.metadata and pod.metadata.labels) or {}
    if labels.get("kubernetes_executor") != "True":  # a KubernetesPodOperator's pod, say: not a task instance
        return
    if not configured_workers(os.environ):
        return
    annotations = pod.metadata.annotations or {}
    dag_id, task_id = annotations.get("dag_id"), annotations.get("task_id")
    try:
        task = _scheduled_task(dag_id, task_id)
        if task is None or not is_falkirk_task(task):
            return
        from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

        from falkirk.policies.store import StoreConfig

        home = placement_of(task, getattr(task, "queue", None), int(annotations.get("map_index", -1)))
        placed = PodGenerator.reconcile_pods(pod, pod_placement(home, StoreConfig.from_env().scratch_uri))
    except Exception as exc:  # noqa: BLE001 - the pod starts unplaced; the task's runtime check names the problem
        log.warning("Falkirk placement of the pod of %s.%s skipped: %s", dag_id, task_id, exc)
        return
    if home is not None:
        log.info("Falkirk placement: %s.%s runs on node %s (its scratch group's)", dag_id, task_id, home)
    pod.spec = placed.spec


def runs_on_kubernetes(task_instance: Any) -> bool:
    """Whether the executor that runs ``task_instance`` (its own, else Airflow's default) is
    the KubernetesExecutor."""
    from airflow.executors.executor_loader import ExecutorLoader

    name = getattr(task_instance, "executor", None)
    executor = (ExecutorLoader.lookup_executor_name_by_str(name) if name
                else ExecutorLoader.get_default_executor_name())
    return executor.module_path.endswith(".KubernetesExecutor")


def _scheduled_task(dag_id: str | None, task_id: str | None) -> Any:
    """Task ``task_id`` of DAG ``dag_id`` as the scheduler holds it (the latest serialized
    version), or None when there is none."""
    from airflow.models.serialized_dag import SerializedDagModel

    if not dag_id or not task_id:
        return None
    dag = SerializedDagModel.get_dag(dag_id)
    return dag.task_dict.get(task_id) if dag is not None else None


def is_falkirk_task(task: Any) -> bool:
    """Whether ``task`` (as the scheduler holds it) is a Falkirk task, partitioned or not."""
    return bool(getattr(task, "falkirk_regime", None)) or _is_partitioned_falkirk(task)


def _is_partitioned_falkirk(task: Any) -> bool:
    """Whether ``task`` is a partitioned (mapped) Falkirk task: its regime is among its arguments."""
    kwargs = getattr(task, "partial_kwargs", None)
    return isinstance(kwargs, dict) and bool(kwargs.get("regime")) and "partitions" in kwargs


# Last: imported before Airflow, this loads Airflow, which loads its policy entry points (this
# module among them) and finds every hook above already made.
_enable_on_run_creation()
