"""The reference application on the distributed shape, a worker lost, and the recovery.

1. starts the shape (:class:`devstack.cluster.Cluster`): PostgreSQL, Redis, ``moto_server``,
   a Spark standalone cluster behind a Spark Connect server, and Airflow with the
   CeleryExecutor and two workers, ``worker-a`` and ``worker-b``, each with its own disk;
2. runs ``falkirk_figure1`` (asking for worker-a) and a failure-free copy,
   ``falkirk_figure1_reference`` (on worker-b), side by side, one DAG run per epoch;
3. at ``--move-at`` asks for worker-b for ``falkirk_figure1`` too: placement keeps it on
   worker-a, where its scratch state is;
4. before ``--lose-at`` kills worker-a and deletes its disk; the later epochs are triggered
   and wait on worker-a's queue;
5. plans with ``falkirk plan --lost-worker worker-a``, prints the plan, and replays it
   through Airflow: the re-runs move to worker-b, restoring the durable checkpoints;
6. checks every Delta table and the PostgreSQL query table against the copy's, row for row.

Run it with ``make cluster-demo``; the tests (``tests/integration/cluster/test_cluster.py``) check what
it returns.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from devstack.airflow import PROJECT_ROOT
from devstack.cluster import Cluster, ClusterServers
from devstack.processes import VENV_BIN
from falkirk.plugins.airflow_rest import AirflowClient, api_path
from falkirk.policies import EpochClock
from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.recovery import RecoveryPlan
from falkirk.policies.planning.recovery_log import RecoveryLog
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import scan
from falkirk.policies.store.ledger import Ledger, LedgerEntry
from falkirk.spark_jobs.figure1 import REGIMES
from falkirk.spark_jobs.figure1.data import RECORDS_ENV
from falkirk.spark_jobs.figure1.query_store import QueryStatsStore

DAG_ID = "falkirk_figure1"
REFERENCE = "falkirk_figure1_reference"
DAGS = PROJECT_ROOT / "devstack" / "cluster_dags"
QUEUES_ENV = "FALKIRK_DEMO_QUEUES"  # a JSON file: the queue each copy of the application asks for
TASKS = tuple(REGIMES)
Progress = Callable[[str], None]


def say(message: str) -> None:
    print(message, flush=True)


@dataclass
class ClusterOutcome:
    """What the demo did and found (the tests read it)."""

    store: StoreConfig
    epochs: int
    move_at: int
    lose_at: int
    placed: dict[str, dict[tuple[ProcessorId, int], str]]  # per DAG, the worker Airflow records per (task, epoch)
    stuck: dict[ProcessorId, dict[str, Any]]  # falkirk_figure1's task instances of epoch lose_at before the recovery
    planned: str  # what `falkirk plan` printed
    plan: RecoveryPlan
    replay_output: str
    reran_on: dict[tuple[ProcessorId, int], str]  # after the replay: the worker of each re-run instance
    logs: dict[tuple[str, int, int], str]  # (task, epoch, try) -> the task's log, for the instances read
    ledger: list[LedgerEntry]  # falkirk_figure1's current rows
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    held_checks: list[tuple[str, bool, str]] = field(default_factory=list)  # before the loss, placement held
    spark: dict[str, Any] = field(default_factory=dict)  # the standalone master's status at the end
    spark_blind_to_scratch: bool = False
    query_db: str = ""  # the PostgreSQL URL of the query statistics
    query_rows: int = 0  # falkirk_figure1's rows in it, read before the shape stopped
    query_deliveries: list[tuple] = field(default_factory=list)  # its deliveries: (epoch, incarnation, rows)

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)


def run_cluster_demo(root: Path, *, epochs: int = 8, move_at: int = 2, lose_at: int = 6, records: int = 5_000,
                     extra_env: dict[str, str] | None = None, progress: Progress = say,
                     servers: ClusterServers | None = None) -> ClusterOutcome:
    """Run the whole demo under ``root`` (emptied first); see the module docstring. ``servers``:
    already running ones to run the shape on (default: its own)."""
    if not 2 <= move_at < lose_at <= epochs:
        raise ValueError(f"need 2 <= --move-at ({move_at}) < --lose-at ({lose_at}) <= --epochs ({epochs})")
    root = root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    queues = root / "queues.json"
    queues.write_text(json.dumps({DAG_ID: "worker-a", REFERENCE: "worker-b"}))
    env = {QUEUES_ENV: str(queues), RECORDS_ENV: str(records), **(extra_env or {})}
    started = time.monotonic()
    with Cluster(root / "shape", dags_folder=DAGS, extra_env=env, spark_connect=True, servers=servers) as cluster:
        progress(f"the shape is up after {time.monotonic() - started:.0f}s: Airflow at {cluster.airflow.base_url} "
                 f"(admin/admin), Spark master {cluster.spark.master_url}, store {cluster.store.durable_uri}")
        outcome = _scenario(cluster, queues, epochs, move_at, lose_at, progress)
    progress(f"\n== checks ({time.monotonic() - started:.0f}s in all)")
    for name, ok, detail in outcome.checks:
        progress(f"  {'ok  ' if ok else 'FAIL'} {name} ({detail})")
    return outcome


def _scenario(cluster: Cluster, queues: Path, epochs: int, move_at: int, lose_at: int,
              progress: Progress) -> ClusterOutcome:
    client = cluster.airflow.client()
    store = cluster.store
    clock = _clock()
    for dag in (DAG_ID, REFERENCE):
        client.wait_for_dag(dag)
        client.set_paused(dag, False)

    def trigger(first: int, last: int) -> None:
        for e in range(first, last + 1):
            for dag in (DAG_ID, REFERENCE):
                client.trigger(dag, f"epoch-{e}", clock.logical_date(e))

    def finish(dag: str, first: int, last: int) -> None:
        for e in range(first, last + 1):
            state = client.wait_for_run(dag, f"epoch-{e}", timeout=1800)
            if state != "success":
                raise RuntimeError(f"{dag} epoch {e} ended {state}; logs under {cluster.airflow.home / 'logs'}")

    progress(f"\n== {_epochs(1, move_at - 1)}: {DAG_ID} asks for worker-a, {REFERENCE} for worker-b")
    trigger(1, move_at - 1)
    for dag in (DAG_ID, REFERENCE):
        finish(dag, 1, move_at - 1)
    progress(f"\n== {_epochs(move_at, lose_at - 1)}: {DAG_ID} now asks for worker-b; its scratch state is on worker-a")
    queues.write_text(json.dumps({DAG_ID: "worker-b", REFERENCE: "worker-b"}))
    _wait_for_queue(client, DAG_ID, "rank", "worker-b")
    trigger(move_at, lose_at - 1)
    for dag in (DAG_ID, REFERENCE):
        finish(dag, move_at, lose_at - 1)
    placed = {dag: _workers(client, dag, 1, lose_at - 1) for dag in (DAG_ID, REFERENCE)}
    for dag, where in placed.items():
        progress(f"  {dag}: every task instance of epochs 1-{lose_at - 1} ran on {', '.join(sorted(set(where.values())))}")
    held = compare_as_placed(store)
    progress(f"  with placement held, {sum(ok for _, ok, _ in held)} of {len(held)} tables equal the copy's "
             f"({DAG_ID}'s scratch tables on worker-a, the copy's on worker-b)")

    progress(f"\n== worker-a is lost with its disk ({cluster.scratch_root('worker-a')}); epochs {lose_at}-{epochs} "
             f"are triggered")
    cluster.airflow.worker("worker-a").kill()
    shutil.rmtree(cluster.scratch_root("worker-a"), ignore_errors=True)
    trigger(lose_at, epochs)
    finish(REFERENCE, lose_at, epochs)
    stuck = client.task_instances(DAG_ID, f"epoch-{lose_at}")
    progress(f"  {REFERENCE} finished on worker-b; {DAG_ID} epoch {lose_at} waits: " + ", ".join(
        f"{t} {ti['state']} on queue {ti['queue']}" for t, ti in sorted(stuck.items())))

    progress("\n== falkirk plan --lost-worker worker-a")
    cli = {**os.environ, **store.env(), "FALKIRK_AIRFLOW_URL": cluster.airflow.base_url,
           "FALKIRK_AIRFLOW_USER": "admin", "FALKIRK_AIRFLOW_PASSWORD": "admin"}
    planned = _falkirk(cli, "plan", "--dag", DAG_ID, "--lost-worker", "worker-a")
    progress(planned.rstrip())
    plan_id = planned.strip().splitlines()[-1].split()[-1]
    plan = RecoveryLog(store).plan(plan_id)
    progress("\n== falkirk replay")
    replayed = _falkirk(cli, "replay", plan_id, timeout=3600)
    progress(replayed.rstrip())
    finish(DAG_ID, 1, epochs)
    after = _workers(client, DAG_ID, 1, epochs)
    logs = {(t, e, n): client.task_log(DAG_ID, f"epoch-{e}", t, n)
            for t, e, n in (("rank", lose_at - 1, 1), ("rank", plan.task("rank").rerun[0], 2))}

    outcome = ClusterOutcome(
        store=store, epochs=epochs, move_at=move_at, lose_at=lose_at, placed=placed, stuck=stuck,
        planned=planned, plan=plan, replay_output=replayed, held_checks=held,
        reran_on={k: after[k] for k in plan.rerun_set()}, logs=logs, ledger=Ledger(store).entries(DAG_ID),
        spark=cluster.spark.status(), spark_blind_to_scratch=cluster.spark.hides, query_db=cluster.query_db)
    outcome.checks = compare_with_reference(store, plan, cluster.query_db)
    ours = QueryStatsStore(cluster.query_db, schema=DAG_ID)
    outcome.query_rows, outcome.query_deliveries = len(ours.rows()), ours.deliveries()
    outcome.checks.append(("the re-runs ran on worker-b", set(outcome.reran_on.values()) == {"worker-b"},
                           f"{len(outcome.reran_on)} task instances"))
    outcome.checks.append(("the plan re-runs fewer task instances than clear-downstream",
                           len(plan.rerun_set()) < len(plan.clear_downstream_set()),
                           f"{len(plan.rerun_set())} against {len(plan.clear_downstream_set())}"))
    return outcome


def compare_as_placed(store: StoreConfig) -> list[tuple[str, bool, str]]:
    """Every table of falkirk_figure1, wherever its ledger says it is, against the copy's, row
    for row: scratch tables on their workers' disks too."""
    ours, theirs = _tables(store, DAG_ID), _tables(store, REFERENCE)
    checks = []
    for name in sorted(theirs):
        got = _rows(store, ours[name]) if name in ours else []
        checks.append((f"table {name}",
                       name in ours and _canonical(got) == _canonical(_rows(store, theirs[name])),
                       f"{len(got)} rows at {ours.get(name, 'nowhere')}"))
    return checks


def _tables(store: StoreConfig, dag: str) -> dict[str, str]:
    """``task/table`` (``(scratch)`` after it for the scratch tier) -> its URI, from ``dag``'s ledger."""
    return {uri.split(f"/{dag}/", 1)[1] + (" (scratch)" if store.is_scratch(uri) else ""): uri
            for e in Ledger(store).entries(dag) for uri in (e.state_uri, *(o.uri for o in e.outputs)) if uri}


def compare_with_reference(store: StoreConfig, plan: RecoveryPlan, query_db: str) -> list[tuple[str, bool, str]]:
    """Every table of the copy against falkirk_figure1's, row for row: durable tables whole, and
    scratch tables (both copies' on worker-b) for the epochs the recovery re-ran there; then the
    PostgreSQL query table."""
    checks = []
    for ref_uri in sorted(_tables(store, REFERENCE).values()):
        uri = ref_uri.replace(f"/{REFERENCE}/", f"/{DAG_ID}/")
        ref, got = _rows(store, ref_uri), _rows(store, uri)
        name = uri.split(f"/{DAG_ID}/", 1)[1]
        if store.is_scratch(uri):
            written = sorted({r["epoch"] for r in got})
            rerun = list(plan.task(name.split("/")[0]).rerun)
            ok_epochs = written == rerun
            ref = [r for r in ref if r["epoch"] in rerun]
            checks.append((f"table {name} (scratch, worker-b)", ok_epochs and _canonical(got) == _canonical(ref),
                           f"{len(got)} rows, epochs {written[0] if written else '-'}-{written[-1] if written else '-'}"))
        else:
            checks.append((f"table {name}", _canonical(got) == _canonical(ref), f"{len(got)} rows"))
    ours, theirs = (QueryStatsStore(query_db, schema=d) for d in (DAG_ID, REFERENCE))
    rows = ours.rows()
    checks.append(("PostgreSQL query_stats equals the failure-free copy's", ours.postgres and rows == theirs.rows(),
                   f"{len(rows)} rows"))
    checks.append(("no query statistic delivered twice", ours.duplicates() == [],
                   f"{len({(r[0], r[1]) for r in rows})} distinct (epoch, query)"))
    return checks


def _clock() -> EpochClock:
    """The application's epoch clock, from its DAG file."""
    spec = importlib.util.spec_from_file_location("falkirk_figure1_dag", PROJECT_ROOT / "dags" / "falkirk_figure1.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.EPOCHS


def _epochs(first: int, last: int) -> str:
    return f"epoch {first}" if first == last else f"epochs {first}-{last}"


def _wait_for_queue(client: AirflowClient, dag_id: str, task_id: str, queue: str, timeout: float = 180) -> None:
    """Ask the DAG processor to parse the DAG's file again (it would otherwise wait for its
    ``min_file_process_interval``) and wait until ``task_id`` asks for ``queue``."""
    token = client.request("GET", api_path("dags", dag_id, "details"))["file_token"]
    client.request("PUT", api_path("parseDagFile", token))
    deadline = time.monotonic() + timeout
    while client.request("GET", api_path("dags", dag_id, "tasks", task_id))["queue"] != queue:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the DAG processor did not parse {dag_id} with queue {queue} in {timeout:.0f}s")
        time.sleep(2)


def _workers(client: AirflowClient, dag_id: str, first: int, last: int) -> dict[tuple[ProcessorId, int], str]:
    return {(t, e): ti["hostname"] for e in range(first, last + 1)
            for t, ti in client.task_instances(dag_id, f"epoch-{e}").items()}


def _falkirk(env: dict[str, str], *args: str, timeout: float = 900) -> str:
    done = subprocess.run([str(VENV_BIN / "falkirk"), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"falkirk {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _rows(store: StoreConfig, uri: str) -> list[dict]:
    return scan(DeltaTable(uri, storage_options=store.options_for(uri))).to_pylist()


def _canonical(rows: list[dict]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8, help="epochs to run (default 8)")
    parser.add_argument("--move-at", type=int, default=2,
                        help="the epoch from which falkirk_figure1 asks for worker-b (default 2)")
    parser.add_argument("--lose-at", type=int, default=6, help="the epoch before which worker-a is lost (default 6)")
    parser.add_argument("--records", type=int, default=5_000, help="events per epoch (default 5,000)")
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT / ".falkirk" / "cluster",
                        help="where the shape keeps its databases, store, disks and logs (emptied first)")
    args = parser.parse_args(argv)
    if not 2 <= args.move_at < args.lose_at <= args.epochs:
        parser.error(f"give 2 <= --move-at ({args.move_at}) < --lose-at ({args.lose_at}) <= --epochs ({args.epochs})")
    outcome = run_cluster_demo(args.root, epochs=args.epochs, move_at=args.move_at, lose_at=args.lose_at,
                               records=args.records)
    say(f"\n{'all checks passed' if outcome.ok else 'SOME CHECKS FAILED'}")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
