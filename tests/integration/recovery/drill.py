"""The recovery drills' shared parts: six copies of ``falkirk_clicks`` in one Airflow, what
they expect, and how their tables are compared with the failure-free copy ``clicks_ref``."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from deltalake import DeltaTable

from devstack.airflow import AirflowStack
from devstack.demo import run_id_of
from devstack.processes import VENV_BIN
from falkirk.plugins.airflow_rest import AirflowClient
from falkirk.policies.regimes import Tier
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.control import Collections
from falkirk.policies.store.ledger import Ledger
from falkirk.spark_jobs.clicks.feed import clicks_for_epoch
from tests.oracle import canonical
from tests.unit.test_recovery import oracle

HERE = Path(__file__).resolve().parent
DAGS = HERE / "dags"
REF, A, B, C, K, G = "clicks_ref", "clicks_a", "clicks_b", "clicks_c", "clicks_k", "clicks_g"
EPOCHS = list(range(1, 7))
TASKS = ("source", "clean", "model", "sink")
TABLES = [("source", "output", Tier.SCRATCH), ("clean", "output", Tier.DURABLE), ("model", "output", Tier.SCRATCH),
          ("model", "state", Tier.SCRATCH), ("model", "state", Tier.DURABLE), ("sink", "output", Tier.DURABLE),
          ("sink", "state", Tier.DURABLE)]
DUPLICATED = clicks_for_epoch(4)[:8]  # clicks_c's wrong delivery of epoch 4: these eight events twice


@dataclass
class Drill:
    stack: AirflowStack
    store: StoreConfig
    client: AirflowClient
    inbox: Path
    stale_plan: str = ""


def wait_states(client: AirflowClient, dag: str, expected: dict[int, dict[str, set]], timeout: float = 900) -> None:
    """Wait until each (epoch, task) is in one of its expected states (None: never ran)."""
    deadline = time.monotonic() + timeout
    while True:
        client.on_poll()
        runs = client.task_instances_by_run(dag)
        now = {e: {t: ti["state"] for t, ti in runs.get(run_id_of(e), {}).items()} for e in expected}
        if all(now[e].get(t) in ok for e, want in expected.items() for t, ok in want.items()):
            return
        bad = [(e, t) for e in now for t, s in now[e].items() if s == "failed" and "failed" not in expected[e].get(t, ())]
        if bad or time.monotonic() > deadline:
            why = "a task failed" if bad else f"still not there after {timeout:.0f} s"
            raise AssertionError(f"{dag}: {why}: states {now}, expected {expected}; task logs under the Airflow home")
        time.sleep(2)


SUCCESS = {t: {"success"} for t in TASKS}


def clock():
    from devstack.demo import dag_epoch_clock

    return dag_epoch_clock(HERE.parents[2] / "dags" / "falkirk_clicks.py")


def rows(store: StoreConfig, dag: str, task: str, table: str, tier: Tier) -> list[tuple]:
    uri = store.table_uri(tier, dag, task, table)
    dt = open_table(uri)
    return canonical(scan(dt).to_pylist()) if dt is not None else []


def assert_equals_reference(store: StoreConfig, dag: str, lost_scratch: bool = False) -> None:
    """Every output and state table equals the reference's, row for row; scratch tables of a
    lost scratch directory hold only epochs written since, and those equal the reference's;
    epochs a collection deleted (at or below the task's mark) may be absent."""
    # A task's partitions go at or below its own mark, its outputs once its consumers' marks pass.
    collected = max(Collections(store).through(dag).values(), default=0)
    for task, table, tier in TABLES:
        ref, got = rows(store, REF, task, table, tier), rows(store, dag, task, table, tier)
        epochs = {dict(r)["epoch"] for r in got}
        if lost_scratch and tier is Tier.SCRATCH:
            ref = [r for r in ref if dict(r)["epoch"] in epochs]
        ref = [r for r in ref if dict(r)["epoch"] > collected or dict(r)["epoch"] in epochs]
        assert got == ref, f"{dag}: {task}/{table} ({tier.value}) differs from the failure-free run"
    sink = [(dict(r)["epoch"], dict(r)["item"]) for r in rows(store, dag, "sink", "output", Tier.DURABLE)]
    epochs = {dict(r)["epoch"] for r in rows(store, REF, "sink", "output", Tier.DURABLE)}
    assert len(sink) == len(set(sink)) == 3 * len(epochs)  # published exactly once per epoch


def check_minimal(p, store: StoreConfig, dag: str, bad=None, scratch_lost=False) -> None:
    frontiers, redo = oracle(Ledger(store).entries(dag), len(EPOCHS), bad, scratch_lost)
    assert {t.task_id: t.kept_through for t in p.tasks} == frontiers
    assert p.rerun_set() == redo
    ours, theirs = len(p.rerun_set()), len(p.clear_downstream_set())
    print(f"{dag}: {'; '.join(f.describe() for f in p.failures)}: re-runs {ours} task instances, "
          f"clear-downstream {theirs}")
    assert ours < theirs and p.rerun_set() < p.clear_downstream_set()


def tries(client: AirflowClient, dag: str, epochs: Iterable[int] = EPOCHS) -> dict[tuple[int, str], tuple]:
    """(state, try number) of every task instance of ``dag``'s runs of ``epochs``."""
    return {(e, t): (ti["state"], ti["try_number"]) for e in epochs
            for t, ti in client.task_instances(dag, run_id_of(e)).items()}



def snapshot(store: StoreConfig, dag: str) -> dict:
    out = {}
    for task, table, tier in TABLES:
        uri = store.table_uri(tier, dag, task, table)
        dt = open_table(uri)
        out[f"{task}/{table}/{tier.value}"] = (dt.version(), canonical(scan(dt).to_pylist())) if dt else None
    out["ledger"] = DeltaTable(store.ledger_uri).version()
    return out


def falkirk(drill: Drill, *args: str, crash: str = "", lease_seconds: int = 30,
            timeout: float = 900) -> subprocess.CompletedProcess:
    """The ``falkirk`` command as a user runs it, in its own process (so that it can be killed)."""
    env = {**os.environ, **drill.store.env(), "FALKIRK_AIRFLOW_URL": drill.stack.base_url,
           "FALKIRK_AIRFLOW_USER": "admin", "FALKIRK_AIRFLOW_PASSWORD": "admin",
           "FALKIRK_LEASE_SECONDS": str(lease_seconds), "FALKIRK_CRASH_AT": crash}
    proc = subprocess.run([str(VENV_BIN / "falkirk"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    print(f"$ falkirk {' '.join(args)} -> {proc.returncode}\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
    return proc
