"""Process pairs under faults, job by job (scenarios S4, S5, S7 and S9), without Airflow.

Each job runs as its task instance would (the runtime, a Spark Connect client, the command
line the operator builds), in a process of its own where a fault kills it (SIGKILL at the crash
point), or in this one where the test changes the layout while the job runs.

* S4: a replica of ``stats`` dies between its sink commit and its ledger row; run again, its
  sink write is skipped as already there, and its twin's is too: SN 10 is in the sink once.
* S5: a replica declared dead while it runs (a zombie) commits nothing: no ledger row, no sink
  write; the layout never sets it back to active.
* S7: both replicas of a partition lost: its readers refuse to run without it, naming the plan.
* S9: the two replicas of a partition, one on the Spark Connect server (two cores) with one
  shuffle partition, the other in a local Spark of its own (three cores) with seven, commit
  identical state and outputs.
* S2: one failure per quartet configuration, each in a DAG of its own, declared before epoch 2:
  the sink and the survivors' states are Flux's; readers of a dead producer replica read its
  twin; garbage collection does not wait on a dead consumer replica. In configuration D, the
  dead consumer is recreated as a standby at version 1 before epoch 2 (S8): collection keeps
  the epoch-2 outputs it still has to read until it has committed epoch 2 and folded in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.inprocess import run_reference_process
from devstack.spark import SparkConnectServer
from falkirk.policies.ids import ReplicaId
from falkirk.policies.job_spec import TAKEN_OVER_EXIT_CODE, JobSpec
from falkirk.policies.partitions import processors
from falkirk.policies.planning.collector import collect, live_partitions
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
# Flux's required results: the sink, (sn, app, src, max, avg), each SN once;
# per partition of stats, its state after epoch 2, (app, src, count, sum, max).
SINK = [(3, "http", "a", 5, 5.0), (5, "ftp", "b", 8, 8.0), (6, "http", "a", 5, 4.0), (9, "http", "c", 4, 4.0),
        (10, "http", "a", 7, 5.0)]
STATS_AFTER_2 = {0: [], 1: [("http", "a", 3, 15, 7)], 2: [("ftp", "b", 1, 8, 8)], 3: [("http", "c", 1, 4, 4)]}




def spec(task: str, epoch: int, index: int = -1, dag: str = DAG) -> JobSpec:
    regime, n = PAIRS.TASKS[task]
    inputs = tuple(u for u, d in PAIRS.EDGES if d == task)
    return JobSpec(dag_id=dag, task_id=task, epoch=epoch, regime=regime, run_id=f"epoch-{epoch}", map_index=index, partitions=n, inputs=inputs,
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


def run_epochs(env: dict[str, str], dag: str, first: int, last: int, skip: tuple[str, ...] = ()) -> set[str]:
    """Epochs ``first``..``last`` of ``dag`` (a copy of dags/falkirk_pairs.py), every task instance
    but ``skip`` run as Airflow would run it, in a process of its own; the task instances that
    exited taken over (replicas the layout declared dead)."""
    said = run_reference_process(str(ROOT / "dags" / "falkirk_pairs.py"), dag, JOBS, last, env, first=first, skip=skip)
    return {line.split()[0] for line in said.splitlines() if "taken over by its twin" in line}


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


def sink(store: StoreConfig, partition: int, dag: str = DAG) -> list[tuple]:
    table = open_table(sink_uri(store, dag, "stats", partition))
    if table is None:
        return []
    return sorted((r["sn"], r["app"], r["src"], r["longest"], r["avg"]) for r in scan(table).to_pylist())


def state(store: StoreConfig, task: str, index: int, epoch: int, dag: str = DAG) -> list[tuple]:
    table = open_table(store.table_uri(Tier.DURABLE, dag, task, "state", index))
    return canonical(scan(table, where={"epoch": epoch}).to_pylist())


def test_s4_a_replica_dies_between_its_sink_commit_and_its_ledger_row(epoch_one) -> None:
    store, env = epoch_one
    b = ReplicaId(task="_", partition=1, replica="B").map_index
    died = run(env, "stats", 2, b, crash="after-sink")
    assert died.returncode == -9, died.stderr[-2000:]
    assert sink(store, 1) == [(3, "http", "a", 5, 5.0), (6, "http", "a", 5, 4.0), (10, "http", "a", 7, 5.0)]
    assert Ledger(store).find(DAG, "stats", 2, b) is None
    again = run(env, "stats", 2, b)
    assert again.returncode == 0 and "already written by the twin" in again.stderr, again.stderr[-2000:]
    twin = run(env, "stats", 2, ReplicaId(task="_", partition=1, replica="A").map_index)
    assert twin.returncode == 0 and "already written by the twin" in twin.stderr, twin.stderr[-2000:]
    assert sink(store, 1) == [(3, "http", "a", 5, 5.0), (6, "http", "a", 5, 4.0), (10, "http", "a", 7, 5.0)]
    assert [dict(r)["cnt"] for r in state(store, "stats", b, 2)] == [3]
    assert [(dict(r)["total"], dict(r)["longest"]) for r in state(store, "stats", b, 2)] == [(15, 7)]


# stats[3].A's job, whose compute a failure detector's verdict overtakes: the replica is declared
# dead after it has computed its epoch and before it commits (a process of its own, as each job's).
ZOMBIE = """
import sys

from falkirk.policies.store import StoreConfig
from falkirk.policies.store.control import PairLayouts
from falkirk.spark_jobs.runtime import run_job
from falkirk.spark_jobs.sessions import stats

layouts = PairLayouts(StoreConfig.from_env())


def declared_dead_while_running(ctx):
    result = stats.compute(ctx)
    before = layouts.load(ctx.args.dag_id)
    layouts.save(ctx.args.dag_id, before.fail_replica("stats", 3, "A"), before=before)
    return result


raise SystemExit(run_job(declared_dead_while_running, sys.argv[1:]))
"""


def test_s5_a_zombie_replica_commits_nothing(epoch_one) -> None:
    store, env = epoch_one
    zombie = ReplicaId(task="_", partition=3, replica="A").map_index
    layouts = PairLayouts(store)
    done = subprocess.run([sys.executable, "-c", ZOMBIE, *spec("stats", 2, zombie).argv()],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert done.returncode == TAKEN_OVER_EXIT_CODE, done.stdout[-2000:] + done.stderr[-2000:]
    assert Ledger(store).find(DAG, "stats", 2, zombie) is None
    assert sink(store, 3) == []
    twin = run(env, "stats", 2, ReplicaId(task="_", partition=3, replica="B").map_index)
    assert twin.returncode == 0, twin.stdout[-2000:]
    assert sink(store, 3) == [(9, "http", "c", 4, 4.0)]
    # the zombie runs again (a late retry): it is dead, so it does nothing at all
    late = run(env, "stats", 2, zombie)
    assert late.returncode == TAKEN_OVER_EXIT_CODE and "was declared dead" in late.stdout, late.stdout[-2000:]
    r = layouts.load(DAG).replica("stats", 3, "A")
    assert (r.status.value, r.generation) == ("DEAD", 1)


def test_s9_replicas_are_identical_across_executor_counts_and_shuffle_settings(epoch_one) -> None:
    store, env = epoch_one
    a, b = ReplicaId(task="_", partition=2, replica="A").map_index, ReplicaId(task="_", partition=2, replica="B").map_index
    done = run(env, "stats", 2, a, spark_conf="spark.sql.shuffle.partitions=1")  # the Connect server: local[2]
    assert done.returncode == 0, done.stdout[-2000:]
    local = {k: v for k, v in env.items() if k != "SPARK_REMOTE"}  # a Spark of its own: local[3]
    done = subprocess.run([sys.executable, "-m", f"{JOBS}.stats", *spec("stats", 2, b).argv()], timeout=600,
                          env={**{k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}, **local,
                               "PYSPARK_SUBMIT_ARGS": "--master local[3] --conf spark.sql.shuffle.partitions=7 "
                                                      "--conf spark.ui.enabled=false pyspark-shell"},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
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
    refused = run(env, "stats", 2, ReplicaId(task="_", partition=0, replica="A").map_index)
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    assert "both replicas of sessions partition 2" in said and "--failed-task sessions[4]:2 --failed-task sessions[5]:2" \
        in said, said[-2000:]
    assert Ledger(store).find(DAG, "stats", 2, ReplicaId(task="_", partition=0, replica="A").map_index) is None


# Scenario S2: the replicas each configuration loses (task, partition, replica), and
# whether collection may release epoch 2 of the sessions outputs once the survivors commit it.
QUARTETS = {
    "A": [("stats", 0, "B")],
    "B": [("sessions", 0, "B")],
    "C": [("sessions", 0, "B"), ("stats", 0, "B")],
    "D": [("sessions", 0, "B"), ("stats", 1, "A")],
}


@pytest.mark.parametrize("case", sorted(QUARTETS))
def test_s2_each_quartet_configuration_yields_flux_output_and_states(case: str, epoch_one) -> None:
    store, env = epoch_one
    dag = f"quartet_{case.lower()}"
    assert run_epochs(env, dag, 1, 1) == set()
    layouts = PairLayouts(store)
    before = layouts.load(dag)
    after = before
    for task, partition, replica in QUARTETS[case]:
        after = after.fail_replica(task, partition, replica)
    dead = {str(ReplicaId(task=t, partition=p, replica=r).processor) for t, p, r in QUARTETS[case]}
    standby = None
    if case == "D":  # S8: stats[1].A recreated on a spare, as a standby at its survivor's version 1
        after = after.register("stats", 1, "spare")
        standby = str(ReplicaId(task='stats', partition=1, replica='A').processor)
    layouts.save(dag, after, before=before)
    assert run_epochs(env, dag, 2, 2, skip=(standby,) if standby else ()) == dead - {standby}

    sessions_outputs = {i: store.table_uri(Tier.DURABLE, dag, "sessions", "output", i) for i in range(8)}
    if standby:
        collect(store, dag)  # the janitor, while the standby has still to run epoch 2
        held = {i: sorted(live_partitions(store, uri)) for i, uri in sessions_outputs.items()}
        # The standby (a replica A) reads replicas A: their epoch 2 is kept, where it has rows (partitions
        # 1 and 2 closed no session in epoch 2); the B replicas' readers have all committed it.
        assert held == {0: [2], 1: [1], 2: [], 3: [], 4: [], 5: [], 6: [2], 7: []}
        others = [p for t, (regime, n) in PAIRS.TASKS.items() for p in processors(t, n, regime.replicas)]
        run_epochs(env, dag, 2, 2, skip=tuple(p for p in others if p != standby))
        r = layouts.load(dag).replica("stats", 1, "A")
        assert (r.status.value, r.generation, r.worker) == ("ACTIVE", 2, "spare"), "folded in"
    collect(store, dag)  # a dead consumer replica holds nothing back
    held = {i: sorted(live_partitions(store, uri)) for i, uri in sessions_outputs.items()}
    assert held == {i: [1] if f"sessions[{i}]" in dead else [] for i in range(8)}

    assert sorted(row for p in range(4) for row in sink(store, p, dag)) == SINK
    for p in range(4):
        for r in "AB":
            index = ReplicaId(task="_", partition=p, replica=r).map_index
            if f"stats[{index}]" not in dead - {standby}:
                got = [(d["app"], d["src"], d["cnt"], d["total"], d["longest"])
                       for d in map(dict, state(store, "stats", index, 2, dag))]
                assert got == STATS_AFTER_2[p], (case, p, r)
    rows = Ledger(store).entries(dag)
    assert len({(r.processor, r.epoch) for r in rows}) == len(rows) and {r.incarnation for r in rows} == {0}
    assert {r.processor for r in rows if r.epoch == 2} == {"ingress", *(f"{t}[{i}]" for t in ("sessions", "stats")
                                                                        for i in range(8))} - (dead - {standby})
    reads = {r.map_index: sorted(i.map_index for i in r.inputs if i.task_id == "sessions" and i.through == 2)
             for r in rows if r.task_id == "stats" and r.epoch == 2}
    own_zero_dead = "sessions[1]" in dead  # sessions[0].B: stats' B replicas read partition 0 from A
    for index, got in reads.items():
        own = [2 * p + index % 2 for p in range(4)]
        assert got == ([0, *own[1:]] if own_zero_dead and index % 2 else own), (case, index, got)
    for t, p, r in QUARTETS[case]:
        x = layouts.load(dag).replica(t, p, r)
        if str(ReplicaId(task=t, partition=p, replica=r).processor) != standby:
            assert (x.status.value, x.generation) == ("DEAD", 1)
