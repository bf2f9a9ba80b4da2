"""Process pairs under faults, job by job (research/flux.md §5.5 S4, S5, S7 and S9), without Airflow.

Each job runs as its task instance would (the runtime, a Spark Connect client, the command
line the operator builds), in a process of its own where a fault kills it (SIGKILL at the crash
point), or in this one where the test changes the layout while the job runs.

* S4: a replica of ``stats`` dies between its sink commit and its ledger row; run again, its
  sink write is skipped as already there, and its twin's is too: SN 10 is in the sink once.
* S5: a replica declared dead while it runs (a zombie) commits nothing: no ledger row, no sink
  write; the layout never sets it back to active.
* S7: both replicas of a partition lost: its readers refuse to run without it, naming the plan.
* S9: the two replicas of a partition, under different shuffle settings, commit identical state
  and outputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.inprocess import _environ, run_reference_process
from devstack.spark import SparkConnectServer
from falkirk.policies.job_spec import TAKEN_OVER_EXIT_CODE, JobSpec
from falkirk.policies.partitions import replica_index
from falkirk.policies.regimes import Tier
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.control import PairLayouts
from falkirk.policies.store.ledger import Ledger
from falkirk.spark_jobs.pairs import sink_uri
from tests.integration.test_pairs import PAIRS  # dags/falkirk_pairs.py, loaded once
from tests.oracle import canonical

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DAG = "pairs_faults"
JOBS = "falkirk.spark_jobs.sessions"




def spec(task: str, epoch: int, index: int = -1) -> JobSpec:
    regime, n = PAIRS.TASKS[task]
    inputs = tuple(u for u, d in PAIRS.EDGES if d == task)
    return JobSpec(DAG, task, epoch, regime, f"epoch-{epoch}", map_index=index, partitions=n, inputs=inputs,
                   input_partitions=tuple((u, PAIRS.PARTITIONS[u]) for u in inputs if u in PAIRS.PARTITIONS),
                   replicas=regime.replicas,
                   paired_inputs=tuple(u for u in inputs if PAIRS.REGIMES[u].replicas > 1))


def run(env: dict[str, str], task: str, epoch: int, index: int = -1, crash: str | None = None,
        spark_conf: str | None = None) -> subprocess.CompletedProcess:
    extra = {"FALKIRK_CRASH_AT": f"{DAG}/{task}[{index}]:{epoch}:{crash}"} if crash else {}
    if spark_conf:
        extra["FALKIRK_SPARK_CONF"] = spark_conf
    return subprocess.run([sys.executable, "-m", f"{JOBS}.{task}", *spec(task, epoch, index).argv()],
                          env={**os.environ, **env, **extra}, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def epoch_one(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer):
    root = tmp_path_factory.mktemp("pairs-faults")
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    env = {**store.env(), "SPARK_REMOTE": spark_connect.url}
    run_reference_process(str(ROOT / "dags" / "falkirk_pairs.py"), DAG, JOBS, 1, env)
    for task, index in [("ingress", -1), *(("sessions", i) for i in range(8))]:
        done = run(env, task, 2, index)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return store, env


def sink(store: StoreConfig, partition: int) -> list[tuple]:
    table = open_table(sink_uri(store, DAG, "stats", partition))
    if table is None:
        return []
    return sorted((r["sn"], r["app"], r["src"], r["longest"], r["avg"]) for r in scan(table).to_pylist())


def state(store: StoreConfig, task: str, index: int, epoch: int) -> list[tuple]:
    table = open_table(store.table_uri(Tier.DURABLE, DAG, task, "state", index))
    return canonical(scan(table, where={"epoch": epoch}).to_pylist())


def test_s4_a_replica_dies_between_its_sink_commit_and_its_ledger_row(epoch_one) -> None:
    store, env = epoch_one
    b = replica_index(1, "B")
    died = run(env, "stats", 2, b, crash="after-sink")
    assert died.returncode == -9, died.stderr[-2000:]
    assert sink(store, 1) == [(3, "http", "a", 5, 5.0), (6, "http", "a", 5, 4.0), (10, "http", "a", 7, 5.0)]
    assert Ledger(store).find(DAG, "stats", 2, b) is None
    again = run(env, "stats", 2, b)
    assert again.returncode == 0 and "already written by the twin" in again.stderr, again.stderr[-2000:]
    twin = run(env, "stats", 2, replica_index(1, "A"))
    assert twin.returncode == 0 and "already written by the twin" in twin.stderr, twin.stderr[-2000:]
    assert sink(store, 1) == [(3, "http", "a", 5, 5.0), (6, "http", "a", 5, 4.0), (10, "http", "a", 7, 5.0)]
    assert [dict(r)["cnt"] for r in state(store, "stats", b, 2)] == [3]
    assert [(dict(r)["total"], dict(r)["longest"]) for r in state(store, "stats", b, 2)] == [(15, 7)]


def test_s5_a_zombie_replica_commits_nothing(epoch_one) -> None:
    from falkirk.spark_jobs.runtime import run_job
    from falkirk.spark_jobs.sessions import stats

    store, env = epoch_one
    zombie = replica_index(3, "A")
    layouts = PairLayouts(store)

    def declared_dead_while_running(ctx):  # noqa: ANN001, ANN202 - the job's compute, with a detector's verdict
        result = stats.compute(ctx)
        before = layouts.load(DAG)
        layouts.save(DAG, before.fail_replica("stats", 3, "A"), before=before)
        return result

    with _environ(env):
        code = run_job(declared_dead_while_running, spec("stats", 2, zombie).argv())
    assert code == TAKEN_OVER_EXIT_CODE
    assert Ledger(store).find(DAG, "stats", 2, zombie) is None
    assert sink(store, 3) == []
    twin = run(env, "stats", 2, replica_index(3, "B"))
    assert twin.returncode == 0, twin.stdout[-2000:]
    assert sink(store, 3) == [(9, "http", "c", 4, 4.0)]
    # the zombie runs again (a late retry): it is dead, so it does nothing at all
    late = run(env, "stats", 2, zombie)
    assert late.returncode == TAKEN_OVER_EXIT_CODE and "was declared dead" in late.stdout, late.stdout[-2000:]
    r = layouts.load(DAG).replica("stats", 3, "A")
    assert (r.status.value, r.generation) == ("DEAD", 1)


def test_s9_replicas_are_identical_across_shuffle_settings(epoch_one) -> None:
    store, env = epoch_one
    a, b = replica_index(2, "A"), replica_index(2, "B")
    for index, conf in ((a, "spark.sql.shuffle.partitions=1"), (b, "spark.sql.shuffle.partitions=7")):
        done = run(env, "stats", 2, index, spark_conf=conf)
        assert done.returncode == 0, done.stdout[-2000:]
    assert state(store, "stats", a, 2) == state(store, "stats", b, 2) != []
    outputs = [canonical(scan(open_table(store.table_uri(Tier.DURABLE, DAG, "stats", "output", i)),
                              where={"epoch": 2}).to_pylist()) for i in (a, b)]
    assert outputs[0] == outputs[1]
    assert sink(store, 2) == [(5, "ftp", "b", 8, 8.0)]


def test_s7_both_replicas_lost_stops_the_readers(epoch_one) -> None:  # last: it leaves partition 2 lost
    store, env = epoch_one
    layouts = PairLayouts(store)
    before = layouts.load(DAG)
    layouts.save(DAG, before.fail_replica("sessions", 2, "A").fail_replica("sessions", 2, "B"), before=before)
    refused = run(env, "stats", 2, replica_index(0, "A"))
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    assert "both replicas of sessions[2]" in said and "--failed-task sessions[4]:2 --failed-task sessions[5]:2" \
        in said, said[-2000:]
    assert Ledger(store).find(DAG, "stats", 2, replica_index(0, "A")) is None
