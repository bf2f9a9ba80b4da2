"""A worker is lost on the distributed shape and nobody acts (``devstack.cluster``).

Two copies of ``dags/falkirk_pairs.py`` with 2 partitions per paired task run on Airflow with the
CeleryExecutor and three workers: replicas chained over worker-a and worker-b (partition 0:
A on worker-a, B on worker-b; partition 1: A on worker-b, B on worker-a), worker-c a spare.

* ``pairs_c``: ``sessions`` and ``stats`` are process pairs (Flux's S1 at epoch granularity);
* ``mixed_c``: ``sessions`` is a process pair between ``ingress`` under
  ``LazyCheckpoint(every=2, log_outputs=True)`` (its scratch state on worker-b, its queue) and
  ``stats`` under ``EagerCheckpoint()``; it opts in to replays without a person
  (``falkirk:auto_recover``).

After epoch 2, worker-b is killed (SIGKILL) with its disk, and epoch 3 is triggered. Only
``falkirk watch`` runs: it notices worker-b's silence within its timeout, takes over the replicas
there (in both DAGs: nothing of the pairs re-runs), and for ``mixed_c`` records and replays the
plan for the lost worker, which re-runs ``ingress`` alone from its durable state. Epoch 4 then
runs; ``falkirk pairs --catch-up`` recreates the lost replicas of ``pairs_c`` on worker-c, which
epoch 5 folds in. Every table equals a failure-free run's; the sink holds Flux's five rows.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devstack.airflow import USERS
from devstack.cluster import Cluster, ClusterServers
from devstack.demo import run_id_of
from devstack.inprocess import run_reference_process
from falkirk.policies.ids import ReplicaId
from falkirk.plugins.pairs import catch_up
from falkirk.policies import EagerCheckpoint, LazyCheckpoint
from falkirk.policies.partitions import processors
from falkirk.policies.planning.recovery_log import RecoveryLog
from falkirk.policies.regimes import Tier
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.control import PairLayouts
from falkirk.policies.store.ledger import Ledger
from falkirk.spark_jobs.pairs import sink_uri
from tests.integration.test_pairs import PAIRS  # dags/falkirk_pairs.py, loaded once
from tests.oracle import canonical

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
P, M = "pairs_c", "mixed_c"
WORKERS = ("worker-a", "worker-b", "worker-c")
TIMEOUT, POLL = 15, 3  # falkirk watch: a worker silent for 15 s is lost; pinged every 3 s
MIXED = {"ingress": LazyCheckpoint(every=2, log_outputs=True), "stats": EagerCheckpoint()}
COUNTS = {"sessions": 2, "stats": 2}
DAG_FILE = '''"""Airflow DAG file: copies of dags/falkirk_pairs.py (a DAG factory) on the distributed shape."""
import importlib.util

from falkirk.policies import EagerCheckpoint, LazyCheckpoint

_spec = importlib.util.spec_from_file_location("falkirk_pairs_dag", {path!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
pairs_c = _module.build_dag("pairs_c", partitions=2)
mixed_c = _module.build_dag("mixed_c", partitions=2, regimes={{"ingress": LazyCheckpoint(every=2, log_outputs=True),
                                                              "stats": EagerCheckpoint()}},
                            queues={{"ingress": "worker-b"}}, tags=["falkirk:auto_recover"])
'''
SINK = [(3, "http", "a", 5, 5.0), (5, "ftp", "b", 8, 8.0), (6, "http", "a", 5, 4.0), (9, "http", "c", 4, 4.0),
        (10, "http", "a", 7, 5.0)]
ON_B = {"sessions[0].B", "sessions[1].A", "stats[0].B", "stats[1].A"}




def regimes(dag: str) -> dict:
    return {**PAIRS.REGIMES, **(MIXED if dag == M else {})}


@pytest.fixture(scope="module")
def lost(tmp_path_factory: pytest.TempPathFactory, cluster_servers: ClusterServers):
    root = tmp_path_factory.mktemp("cluster-pairs")
    dags = root / "dags"
    dags.mkdir()
    (dags / "pairs.py").write_text(DAG_FILE.format(path=str(ROOT / "dags" / "falkirk_pairs.py")))
    with Cluster(root / "shape", dags_folder=dags, workers=WORKERS, spark_connect=True,
                 servers=cluster_servers) as cluster:
        client, store, clock = cluster.airflow.client(), cluster.store, PAIRS.EPOCHS
        for dag in (P, M):
            client.wait_for_dag(dag)
            client.set_paused(dag, False)
        for e in (1, 2):
            for dag in (P, M):
                client.trigger(dag, run_id_of(e), clock.logical_date(e))
        for dag, ref in ((P, "pairs_ref"), (M, "mixed_ref")):
            run_reference_process(str(ROOT / "dags" / "falkirk_pairs.py"), ref, "falkirk.spark_jobs.sessions", 5,
                                  {**store.env(), "SPARK_REMOTE": cluster.connect.url}, partitions=COUNTS,
                                  regimes=MIXED if dag == M else None)
        for e in (1, 2):
            for dag in (P, M):
                assert client.wait_for_run(dag, run_id_of(e), timeout=900) == "success"
        placed = {(dag, p): ti["hostname"] for dag in (P, M) for p, ti in client.task_instances(dag, run_id_of(2)).items()}
        env = {**cluster.airflow.env(), "FALKIRK_AIRFLOW_URL": cluster.airflow.base_url,
               "FALKIRK_AIRFLOW_USER": "admin", "FALKIRK_AIRFLOW_PASSWORD": USERS["admin"][1]}
        log = root / "watch.log"
        with open(log, "wb") as out:
            watcher = subprocess.Popen([sys.executable, "-m", "falkirk.plugins.cli", "watch", "--dag", P, "--dag", M,
                                        "--timeout", str(TIMEOUT), "--poll", str(POLL)], env=env, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        try:
            time.sleep(2 * POLL)  # the watch has heard every worker once
            cluster.airflow.worker("worker-b").kill()
            killed = time.monotonic()
            shutil.rmtree(cluster.scratch_root("worker-b"), ignore_errors=True)
            for dag in (P, M):
                client.trigger(dag, run_id_of(3), clock.logical_date(3))
            noticed = _wait_for_line(log, "worker worker-b has not answered", timeout=120) - killed
            for dag in (P, M):
                assert client.wait_for_run(dag, run_id_of(3), timeout=1200) == "success", log.read_text()[-3000:]
            for dag in (P, M):
                client.trigger(dag, run_id_of(4), clock.logical_date(4))
                assert client.wait_for_run(dag, run_id_of(4), timeout=900) == "success"
        finally:
            watcher.kill()
            watcher.wait()
        caught = catch_up(P, store, client, spare="worker-c")
        client.trigger(P, run_id_of(5), clock.logical_date(5))
        client.trigger(M, run_id_of(5), clock.logical_date(5))
        for dag in (P, M):
            assert client.wait_for_run(dag, run_id_of(5), timeout=900) == "success"
        after = {(dag, e): client.task_instances(dag, run_id_of(e)) for dag in (P, M) for e in range(1, 6)}
        yield cluster, store, placed, after, noticed, log.read_text(), caught


def _wait_for_line(path: Path, text: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return time.monotonic()
        time.sleep(0.5)
    raise AssertionError(f"falkirk watch did not say {text!r} in {timeout:.0f} s:\n{path.read_text()[-3000:]}")


def test_chained_placement_puts_each_replica_on_its_worker(lost) -> None:
    _, _, placed, _, _, _, _ = lost
    for dag in (P, M):
        for task in ("sessions", "stats") if dag == P else ("sessions",):
            for p in range(2):
                for r in "AB":
                    want = "worker-b" if f"{task}[{p}].{r}" in ON_B else "worker-a"
                    assert placed[dag, str(ReplicaId(task=task, partition=p, replica=r).processor)] == want


def test_the_watch_notices_the_lost_worker_in_time_and_the_pairs_take_over(lost) -> None:
    _, store, _, after, noticed, said, _ = lost
    assert noticed <= TIMEOUT + 2 * POLL + 10, f"noticed after {noticed:.0f}s"
    for dag in (P, M):
        layout = PairLayouts(store).load(dag)
        dead = {r.name for r in layout.replicas if r.generation >= 1}
        assert dead == {n for n in ON_B if dag == P or n.startswith("sessions")}
    # nothing of the pairs re-ran: every paired instance ran at most once, every ledger row of them is the first
    for (dag, e), tis in after.items():
        for p, ti in tis.items():
            if p.startswith(("sessions", "stats")) and (dag == P or p.startswith("sessions")):
                assert ti["try_number"] <= 1, (dag, e, p, ti["try_number"])
    for dag in (P, M):
        paired = [r for r in Ledger(store).entries(dag) if r.task_id == "sessions" or (dag == P and r.task_id == "stats")]
        assert {r.incarnation for r in paired} == {0}
    # Flux's survival cases: a reader whose own-id producer replica died reads its twin
    rows = Ledger(store).entries(P)
    read = {(r.map_index, r.epoch): sorted(i.map_index for i in r.inputs if i.task_id == "sessions" and
                                           i.through == r.epoch) for r in rows if r.task_id == "stats"}
    assert read[0, 2] == [0, 2] and read[3, 2] == [1, 3]  # own replica id before the loss
    assert read[0, 3] == [0, 3], "stats[0].A reads partition 1 from sessions[1].B (sessions[1].A died)"
    assert read[3, 3] == [0, 3], "stats[1].B reads partition 0 from sessions[0].A (sessions[0].B died)"
    # epoch 3's replicas on worker-b were skipped, with the twin named
    for p in ("sessions[1]", "sessions[2]", "stats[1]", "stats[2]"):
        assert after[P, 3][p]["state"] == "skipped"
    assert f"{P}: " in said and "declared dead (no heartbeat from worker-b)" in said


def test_the_opted_in_dag_replays_the_lost_worker_plan_by_itself(lost) -> None:
    _, store, _, after, _, said, _ = lost
    events = RecoveryLog(store).events(M)
    planned = [json.loads(e["detail"]) for e in events if e["event"] == "planned"]
    finished = {e["plan_id"] for e in events if e["event"] == "finished"}
    [plan] = [p for p in planned if p.get("failures") and "worker-b" in json.dumps(p["failures"])]
    assert plan["plan_id"] in finished
    rerun = {t["task_id"]: t["rerun"] for t in plan["tasks"] if t["rerun"]}
    # ingress re-runs epoch 3 (it waited on worker-b's queue) from its durable state of epoch 2;
    # the pair re-runs nothing it had run: its epoch 3 had waited for ingress
    assert rerun.get("ingress") == [3]
    assert all(epochs == [3] for t, epochs in rerun.items() if t.startswith(("sessions", "stats")))
    assert after[M, 3]["ingress"]["hostname"] != "worker-b"
    assert re.search(rf"{M}: replaying plan \S+ for the lost worker worker-b", said)
    # and no task of pairs_c needed a plan at all: nothing of it was on worker-b's disk
    assert f"{P}: plan" not in said


def test_catch_up_recreates_the_lost_replicas_on_the_spare(lost) -> None:
    _, store, _, after, _, _, caught = lost
    assert sorted(r["replica"] for r in caught.replicas) == sorted(ON_B)
    layout = PairLayouts(store).load(P)
    for name in ON_B:
        task, rest = name.split("[")
        p, r = int(rest[0]), rest[-1]
        replica = layout.replica(task, p, r)
        assert (replica.worker, replica.status.value, replica.generation) == ("worker-c", "ACTIVE", 2)
        assert after[P, 5][str(ReplicaId(task=task, partition=p, replica=r).processor)]["hostname"] == "worker-c"


def test_every_table_equals_the_failure_free_run(lost) -> None:
    _, store, _, _, _, _, caught = lost
    assert {r["replica"]: r["epochs"] for r in caught.replicas} == {n: [3, 4] for n in ON_B}
    for dag, ref in ((P, "pairs_ref"), (M, "mixed_ref")):
        for task, (regime, n) in PAIRS.TASKS.items():
            regime = regimes(dag)[task]
            for proc in processors(task, COUNTS.get(task) if n else None, regime.replicas):
                index = int(proc[proc.index("[") + 1:-1]) if "[" in proc else -1
                for table in ("output", "state") if regime.keeps_state else ("output",):
                    # durable tables (ingress's scratch state went with worker-b's disk; its durable copies stay)
                    want, got = (_rows(store, d, task, table, index) for d in (ref, dag))
                    name = f"{task}[{index // 2}].{'AB'[index % 2]}" if regime.replicas > 1 else proc
                    # pairs_c's lost replicas hold copies of the epochs they missed (3, 4), then epoch 5;
                    # mixed_c's stay dead after epoch 2
                    if dag == M and name in ON_B:
                        want = [row for row in want if dict(row)["epoch"] in (1, 2)]
                    assert got == want, f"{dag}: {proc} {table} differs from the failure-free run"
    sinks = [sink_uri(store, P, "stats", p) for p in range(2)]
    rows = [r for uri in sinks for r in scan(open_table(uri, store.options_for(uri))).to_pylist()]
    assert sorted((r["sn"], r["app"], r["src"], r["longest"], r["avg"]) for r in rows) == SINK


def _rows(store, dag: str, task: str, table: str, index: int) -> list[tuple]:  # noqa: ANN001
    uri = store.table_uri(Tier.DURABLE, dag, task, table, index)
    t = open_table(uri, store.options_for(uri))
    return canonical(scan(t).to_pylist()) if t is not None else []
