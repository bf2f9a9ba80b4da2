"""The reference application's pods under the KubernetesExecutor, as the provider renders them.

``airflow kubernetes generate-dag-yaml`` builds each task's pod as the executor does (the pod
template, the executor's own part, the task's ``pod_override``, then the cluster policy's
``pod_mutation_hook``) and writes it as YAML. The pod template is the one in the Helm values
that ``docs/howto/scaling-out.md`` shows. No Kubernetes cluster runs here: the pods are checked
against the ``kubernetes`` client's object models and Kubernetes' naming rules, and their
placement against the store the scheduler reads.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from devstack.airflow import PROJECT_ROOT, AirflowStack
from falkirk.plugins.placement import SCRATCH_VOLUME
from falkirk.policies.planning.recovery import LostWorker, plan_recovery
from falkirk.policies.planning.recovery_log import RecoveryLog
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger, LedgerEntry
from falkirk.spark_jobs.figure1 import GRAPH, REGIMES

pytestmark = pytest.mark.integration

DAG_ID = "falkirk_figure1"
NODES = ("node-a", "node-b")
SCRATCH_ROOT = "/var/lib/falkirk/scratch"
HOWTO = PROJECT_ROOT / "docs" / "howto" / "scaling-out.md"
# Kubernetes' rules for the names a pod carries (apimachinery's validation).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


def helm_values() -> dict:
    """The Helm values of the how-to's Kubernetes section."""
    section = HOWTO.read_text().split("## On Kubernetes", 1)[1]
    return yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])


def pod_template(values: dict) -> dict:
    """``podTemplate`` as the chart renders it (``tpl``: the release is named ``falkirk``)."""
    return yaml.safe_load(values["podTemplate"].replace("{{ .Release.Name }}", "falkirk"))


class _Response:
    """What ``ApiClient.deserialize`` reads: a Kubernetes API server's JSON answer."""

    def __init__(self, body: dict) -> None:
        self.data = json.dumps(body)


def validated(body: dict):  # noqa: ANN201 - a kubernetes.client V1Pod
    """``body`` as the client's ``V1Pod`` (its required fields checked), with nothing the models
    do not know and every name by Kubernetes' rules."""
    from kubernetes.client import ApiClient

    api = ApiClient()
    pod = api.deserialize(_Response(body), "V1Pod")
    assert api.sanitize_for_serialization(pod) == body, "fields the V1Pod model does not know"
    meta, spec = pod.metadata, pod.spec
    assert len(meta.name) <= 63 and DNS_SUBDOMAIN.fullmatch(meta.name), meta.name
    for key, value in meta.labels.items():
        assert len(value) <= 63 and LABEL_VALUE.fullmatch(value), (key, value)
    volumes = {v.name for v in spec.volumes or []}
    assert all(DNS_LABEL.fullmatch(v) for v in volumes)
    for container in spec.containers:
        assert DNS_LABEL.fullmatch(container.name)
        assert {m.name for m in container.volume_mounts or []} <= volumes, "a mount of no volume"
        names = [e.name for e in container.env or []]
        assert len(names) == len(set(names)) and all(ENV_NAME.fullmatch(n) for n in names)
    return pod


@pytest.fixture(scope="module")
def rendering(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A scheduler's home under the KubernetesExecutor, with the DAG and the how-to's pod template;
    returns the store and a function rendering the DAG's pods (task id -> V1Pod)."""
    root = tmp_path_factory.mktemp("kubernetes")
    (root / "dags").mkdir()
    shutil.copyfile(PROJECT_ROOT / "dags" / f"{DAG_ID}.py", root / "dags" / f"{DAG_ID}.py")
    template = root / "pod_template.yaml"
    template.write_text(yaml.safe_dump(pod_template(helm_values())))
    store = StoreConfig(durable_uri=str(root / "store"), scratch_uri=SCRATCH_ROOT)
    stack = AirflowStack(home=root / "airflow", store=store, dags_folder=root / "dags")
    stack.init()
    env = {"AIRFLOW__CORE__EXECUTOR": "KubernetesExecutor",
           "AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE": str(template),
           "FALKIRK_WORKERS": ",".join(NODES)}
    renders = iter(range(100))

    def render() -> dict:
        out = root / f"pods-{next(renders)}"
        stack.airflow("kubernetes", "generate-dag-yaml", "--logical-date", "2026-01-04", "--output-path",
                      str(out), DAG_ID, env=env)
        pods = [validated(yaml.safe_load(f.read_text())) for f in sorted(out.glob("airflow_yaml_output/*.yml"))]
        return {p.metadata.annotations["task_id"]: p for p in pods}

    return store, render


def node_of(pod) -> str:  # noqa: ANN001
    """The node a pod is pinned to, checking that the placement is the whole of its affinity."""
    terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert len(terms) == 1 and not terms[0].match_expressions
    (field,) = terms[0].match_fields
    assert (field.key, field.operator, len(field.values)) == ("metadata.name", "In", 1)
    return field.values[0]


def assert_keeps_its_scratch(pod, template: dict) -> None:  # noqa: ANN001
    """The pod's ``base`` container comes first, keeps the template's own mounts and
    environment, and has the node's scratch directory and the node's name."""
    base = pod.spec.containers[0]
    assert base.name == template["spec"]["containers"][0]["name"] == "base"
    assert base.image == template["spec"]["containers"][0]["image"]
    mounts = {m.name: m.mount_path for m in base.volume_mounts}
    assert mounts == {"config": "/opt/airflow/airflow.cfg", SCRATCH_VOLUME: SCRATCH_ROOT}
    assert [e.secret_ref.name for e in base.env_from] == ["falkirk-store"]
    (worker,) = [e for e in base.env if e.name == "FALKIRK_WORKER"]
    assert worker.value is None and worker.value_from.field_ref.field_path == "spec.nodeName"
    volumes = {v.name: v for v in pod.spec.volumes}
    assert volumes["config"].config_map.name == "falkirk-config"
    assert (volumes[SCRATCH_VOLUME].host_path.path, volumes[SCRATCH_VOLUME].host_path.type) == (
        SCRATCH_ROOT, "DirectoryOrCreate")
    assert pod.spec.service_account_name == "falkirk-airflow-worker" and pod.spec.restart_policy == "Never"


def test_the_reference_applications_pods_follow_their_scratch_group_to_its_node(rendering) -> None:  # noqa: ANN001
    """falkirk_figure1 is one scratch group (events' and rank's outputs, and rank's state, are kept
    in scratch): every pod goes to one node, by hashing before any commit, then to the node of
    rank's latest scratch checkpoint, then, once a recovery of that node has started, away
    from it."""
    store, render = rendering
    template = pod_template(helm_values())
    assert template["spec"]["containers"][0]["name"] == "base"  # the executor's rule for the template

    fresh = render()
    assert sorted(fresh) == sorted(REGIMES)
    first = {task: node_of(pod) for task, pod in fresh.items()}
    (hashed,) = set(first.values())
    for pod in fresh.values():
        assert_keeps_its_scratch(pod, template)
        assert pod.metadata.labels["dag_id"] == DAG_ID and pod.metadata.labels["kubernetes_executor"] == "True"

    other = next(n for n in NODES if n != hashed)
    Ledger(store).append(LedgerEntry(
        dag_id=DAG_ID, task_id="rank", epoch=3, regime=REGIMES["rank"].spec(), run_id="scheduled__2026-01-03",
        try_number=1, worker=other, state_uri=f"{SCRATCH_ROOT}/{other}/{DAG_ID}/rank/state", state_tier="scratch"))
    followed = render()
    assert {task: node_of(pod) for task, pod in followed.items()} == dict.fromkeys(REGIMES, other)

    plan = plan_recovery(DAG_ID, GRAPH, Ledger(store).entries(DAG_ID), [LostWorker(other)], 3,
                         lambda uri, key: not uri.startswith(f"{SCRATCH_ROOT}/{other}/"), REGIMES)
    log = RecoveryLog(store)
    log.record(plan)
    log.begin(plan, "test")
    moved = render()
    assert {task: node_of(pod) for task, pod in moved.items()} == dict.fromkeys(REGIMES, hashed)
    for pod in moved.values():
        assert_keeps_its_scratch(pod, template)


def test_pods_that_are_not_falkirk_task_instances_are_left_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook acts on the executor's pods only: a KubernetesPodOperator's pod (no
    ``kubernetes_executor`` label) keeps its spec, whatever its annotations say."""
    from kubernetes.client import models as k8s

    from falkirk.plugins.placement import pod_mutation_hook

    pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="spark-job", labels={"dag_id": DAG_ID},
                                              annotations={"dag_id": DAG_ID, "task_id": "rank"}),
                    spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="spark", image="spark:4.2.0")]))
    before = pod.to_dict()
    monkeypatch.setenv("FALKIRK_WORKERS", ",".join(NODES))
    pod_mutation_hook(pod)
    assert pod.to_dict() == before
