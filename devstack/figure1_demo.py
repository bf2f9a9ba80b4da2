"""The main job: the reference application through real Airflow, a lost scratch tier, a
frontier recovery, a check against a failure-free run, and a report.

1. starts a Spark Connect server and Airflow's four components on 127.0.0.1 (under
   ``.falkirk/figure1`` in the checkout, emptied first);
2. runs epochs 1..N of ``falkirk_figure1`` through the scheduler, one DAG run per epoch;
   before epoch ``--lose-at`` the iterative task's scratch tier (``rank``'s directory)
   is deleted, so its run of that epoch fails with "state lost";
3. plans the recovery from the ledger and prints it: per task its frontier and the
   epochs it re-runs, against Airflow's clear-downstream and against restarting from scratch;
4. replays the plan through Airflow and waits for it;
5. runs the same jobs failure-free in this process (same Spark server) and checks every
   output and state table and the query-statistics SQL table, row for row, and that the
   task instances Airflow re-ran are exactly the plan's;
6. writes an HTML report with charts and prints its path.

Run it with ``make demo`` (``--records 2000000`` for millions of events per epoch).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devstack.airflow import PROJECT_ROOT, AirflowStack
from devstack.figure1_report import Strategy, strategies_png, timeline_png, write_report
from devstack.spark import SparkConnectServer
from falkirk.plugins.airflow_rest import AirflowClient
from falkirk.plugins.recovery import plan, replay
from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.recovery import RecoveryPlan
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import open_table, scan
from falkirk.policies.store.ledger import Ledger
from falkirk.spark_jobs.figure1.data import DEFAULT_RECORDS, RECORDS_ENV
from falkirk.spark_jobs.figure1.query_store import QueryStatsStore
from falkirk.spark_jobs.figure1.source import ClickstreamSource

DAG_ID = "falkirk_figure1"
REFERENCE = "falkirk_figure1_reference"
DAG_FILE = PROJECT_ROOT / "dags" / "falkirk_figure1.py"


def _dag_module():
    spec = importlib.util.spec_from_file_location("falkirk_figure1_dag", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def say(message: str) -> None:
    print(message, flush=True)


@dataclass(frozen=True)
class DemoOutcome:
    """What the main job did and found (the tests read it)."""

    store: StoreConfig
    plan: RecoveryPlan
    reran: frozenset[tuple[ProcessorId, int]]  # task instances whose try number the replay raised, read from Airflow
    final: dict[tuple[ProcessorId, int], dict[str, Any]]  # every task instance after the replay, as Airflow reports it
    acknowledged: dict[int, int]  # after each epoch's wave: the clickstream's acknowledgement point
    checks: list[tuple[str, bool, str]]
    report: Path

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)


def wait_for(client: AirflowClient, epochs: list[int], tasks: list[ProcessorId],
             expected: set[str | None] | dict[tuple[ProcessorId, int], set[str | None]], timeout: float = 900,
             progress: Callable[[str], None] = say) -> dict[tuple[ProcessorId, int], dict]:
    """Wait until every (task, epoch) is in an expected state (``None``: never ran), reporting
    changes; ``expected`` is one set for all or a set per (task, epoch). A failure that is not
    expected stops the wait with the place of its log."""
    want = expected if isinstance(expected, dict) else {(t, e): expected for t in tasks for e in epochs}
    deadline = time.monotonic() + timeout
    seen: dict[tuple[ProcessorId, int], str | None] = {}
    started = time.monotonic()
    while True:
        client.on_poll()
        now = {}
        for e in epochs:
            tis = client.task_instances(DAG_ID, f"epoch-{e}")
            for t in tasks:
                now[t, e] = tis.get(t, {"state": None})
        for k, ti in now.items():
            if seen.get(k, "-") != ti["state"]:
                seen[k] = ti["state"]
                if ti["state"] in ("success", "failed", "running", "upstream_failed"):
                    progress(f"  {time.monotonic() - started:6.1f}s  epoch {k[1]}  {k[0]:<10} {ti['state']}")
        if all(ti["state"] in want[k] for k, ti in now.items()):
            return now
        broken = sorted(k for k, ti in now.items() if ti["state"] in ("failed", "upstream_failed")
                        and ti["state"] not in want[k])
        if broken:
            task, epoch = broken[0]
            raise RuntimeError(f"{task} epoch {epoch} is {now[task, epoch]['state']}, expected one of "
                               f"{sorted(map(str, want[task, epoch]))}; its log is under "
                               f"logs/dag_id={DAG_ID}/run_id=epoch-{epoch}/task_id={task} in Airflow's home")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for the task instances: {seen}")
        time.sleep(2)


def _downstream(edges: list[tuple[str, str]], task: str) -> set[str]:
    """Every task that reads ``task``'s outputs, directly or through others."""
    found: set[str] = set()
    frontier = [task]
    while frontier:
        t = frontier.pop()
        for up, down in edges:
            if up == t and down not in found:
                found.add(down)
                frontier.append(down)
    return found


def canonical(rows: list[dict]) -> list[str]:
    """Rows in a comparable, order-free form (nulls included)."""
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)


def compare_tables(store: StoreConfig, lost: str) -> list[tuple[str, bool, str]]:
    """Every table the reference wrote against the recovered run's, row for row. A table in the
    lost scratch directory holds only the epochs written since the loss: those are compared."""
    checks = []
    uris: set[str] = set()
    for e in Ledger(store).entries(REFERENCE):
        uris.update(o.uri for o in e.outputs)
        if e.state_uri:
            uris.add(e.state_uri)
    for ref_uri in sorted(uris):
        uri = ref_uri.replace(f"/{REFERENCE}/", f"/{DAG_ID}/")
        ref_t, got_t = open_table(ref_uri), open_table(uri)
        ref = canonical(scan(ref_t).to_pylist()) if ref_t else []
        got = canonical(scan(got_t).to_pylist()) if got_t else []
        name = uri.split(f"/{DAG_ID}/", 1)[1] + (" (scratch)" if uri.startswith(store.scratch_uri) else "")
        if uri.startswith(lost):
            epochs = {json.loads(r)["epoch"] for r in got}
            ref = [r for r in ref if json.loads(r)["epoch"] in epochs]
            name += f", epochs {min(epochs)}-{max(epochs)} rewritten since the loss" if epochs else ""
        checks.append((f"table {name}", got == ref, f"{len(got)} rows"))
    ours = QueryStatsStore.for_dag(store.durable_uri, DAG_ID)
    theirs = QueryStatsStore.for_dag(store.durable_uri, REFERENCE)
    rows = ours.rows()
    keys = Counter((r[0], r[1]) for r in rows)
    checks.append(("SQL table query_stats equals the failure-free run's", rows == theirs.rows(), f"{len(rows)} rows"))
    checks.append(("no query statistic delivered twice", max(keys.values(), default=1) == 1,
                   f"{len(keys)} distinct (epoch, query)"))
    return checks


def run_demo(root: Path, *, epochs: int = 8, lose_at: int = 6, records: int = DEFAULT_RECORDS, port: int = 0,
             progress: Callable[[str], None] = say, connect: SparkConnectServer | None = None) -> DemoOutcome:
    """Run the whole job under ``root`` (emptied first); see the module docstring. The jobs are
    clients of ``connect``, or of a Spark Connect server started for the run."""
    if not 2 <= lose_at <= epochs:
        raise ValueError(f"--lose-at {lose_at}: give an epoch between 2 and --epochs ({epochs})")
    started = time.monotonic()
    root = root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    store = StoreConfig(str(root / "store"), str(root / "scratch"))
    dag = _dag_module()
    tasks = [ProcessorId(task=t) for t in dag.REGIMES]
    all_epochs = list(range(1, epochs + 1))
    env = {RECORDS_ENV: str(records)}
    source = ClickstreamSource.for_dag(store.durable_uri, DAG_ID)
    acknowledged: dict[int, int] = {}
    progress(f"falkirk_figure1: {epochs} epochs of {records:,} events; rank's scratch tier is lost before epoch "
             f"{lose_at}; everything under {root}")
    with nullcontext(connect) if connect is not None else SparkConnectServer(root) as connect:
        progress(f"Spark Connect server at {connect.url}")
        stack = AirflowStack(home=root / "airflow", store=store, port=port or None, extra_env={
            **connect.airflow_env(), **env})
        stack.init()
        stack.start()
        progress(f"Airflow is up at {stack.base_url} (admin/admin) after {time.monotonic() - started:.0f}s")
        # The failure-free run of the same jobs, without Airflow, side by side with the scheduled one
        # (the scheduled run leaves a core idle while tasks start and wait on each other).
        reference_log = root / "reference.log"
        reference = subprocess.Popen(
            [sys.executable, "-m", "devstack.inprocess", str(DAG_FILE), REFERENCE, "falkirk.spark_jobs.figure1",
             "--epochs", str(epochs)],
            env={**os.environ, **store.env(), **env, "SPARK_REMOTE": connect.url}, cwd=PROJECT_ROOT,
            stdout=reference_log.open("w"), stderr=subprocess.STDOUT)
        progress(f"failure-free reference run of the same jobs ({REFERENCE}, no Airflow) started; log {reference_log}")
        try:
            client = stack.client()
            client.wait_for_dag(DAG_ID)
            client.set_paused(DAG_ID, False)
            clock = dag.EPOCHS
            before = list(range(1, lose_at))
            progress(f"\n== epochs {before[0]}-{before[-1]}: normal runs")
            for e in before:
                client.trigger(DAG_ID, f"epoch-{e}", clock.logical_date(e))
            normal = wait_for(client, before, tasks, {"success"}, progress=progress)
            acknowledged[before[-1]] = source.acknowledged
            progress(f"  the clickstream source is acknowledged through epoch {source.acknowledged} "
                     f"(events acknowledges, each time it runs, what no recovery can ask for again)")
            lost = f"{store.scratch_uri}/{DAG_ID}/rank"
            shutil.rmtree(lost, ignore_errors=True)
            progress(f"\n== the worker holding rank's scratch tier is gone: deleted {lost}")
            after = list(range(lose_at, epochs + 1))
            for e in after:
                client.trigger(DAG_ID, f"epoch-{e}", clock.logical_date(e))
            # rank fails on its lost state; what reads it fails upstream, and later epochs of the
            # tasks that depend on their past never start.
            blocked = _downstream(dag.EDGES, "rank")
            expected: dict[tuple[ProcessorId, int], set[str | None]] = {
                (t, e): ({"failed"} if t == "rank" and e == lose_at else
                         {"upstream_failed"} if t in blocked and e == lose_at else
                         {None} if t == "rank" or t in blocked else {"success"})
                for t in tasks for e in after}
            first = wait_for(client, after, tasks, expected, progress=progress)
            snapshot = {**normal, **first}

            progress("\n== recovery plan")
            p = plan(DAG_ID, store, client, lost_scratch=[lost])
            progress(p.table())
            strategies = _strategies(p, tasks, all_epochs, normal)
            for s in strategies:
                progress(f"  {s.name:<22} re-runs {s.instances:3d} task instances (~{s.task_seconds:.0f} task-seconds)")

            progress("\n== replaying the plan through Airflow")
            report = replay(p.plan_id, store, client, holder="falkirk-demo", progress=progress)
            final = {(t, e): ti for e in all_epochs for t, ti in client.task_instances(DAG_ID, f"epoch-{e}").items()}
            acknowledged[epochs] = source.acknowledged
        except BaseException:
            reference.kill()
            raise
        finally:
            progress("stopping Airflow ...")
            stack.stop()
        progress(f"\n== waiting for the failure-free reference run ({REFERENCE})")
        if reference.wait(timeout=1800) != 0:
            raise RuntimeError(f"the reference run failed ({reference.returncode}); see {reference_log}")
        progress("  " + reference_log.read_text().strip().splitlines()[-1])

    reran = frozenset(k for k, ti in final.items() if ti["try_number"] > snapshot.get(k, {}).get("try_number", 0))
    checks = compare_tables(store, lost)
    checks.append(("the task instances Airflow re-ran are the plan's re-run set", reran == set(p.rerun_set()),
                   f"{len(reran)} re-ran, {len(p.rerun_set())} planned"))
    checks.append(("the replay read the ledger table at most 3 times before its first clear",
                   report.ledger_reads is not None and report.ledger_reads <= 3, f"{report.ledger_reads} reads"))
    checks.append(("every task instance ended in success", all(ti["state"] == "success" for ti in final.values()),
                   f"{len(final)} task instances"))
    progress("\n== checks")
    for name, ok, detail in checks:
        progress(f"  {'ok  ' if ok else 'FAIL'} {name} ({detail})")

    timeline = {}
    for k in final:
        was = {"success": "ran", "failed": "failed"}.get(str(snapshot.get(k, {}).get("state")), "blocked")
        timeline[k] = "rerun" if k in reran and was == "ran" else was
    out = root / "report"
    out.mkdir()
    page = write_report(
        out / "index.html", dag_id=DAG_ID,
        summary=(f"{epochs} epochs of {records:,} events. Before epoch {lose_at} the scratch tier of the iterative "
                 f"task (rank) was lost. Falkirk re-ran {len(p.rerun_set())} task instances; clear-downstream would "
                 f"have re-run {len(p.clear_downstream_set())} and a restart from scratch {len(tasks) * epochs}. "
                 f"The recovery took {report.seconds:.0f}s, and every output equals a failure-free run's."
                 if all(ok for _, ok, _ in checks) else "SOME CHECKS FAILED: see below."),
        plan_table=p.table(),
        timeline=timeline_png(out / "timeline.png", tasks, all_epochs, timeline),
        strategies=strategies_png(out / "strategies.png", strategies),
        checks=checks,
        facts=[("plan", p.plan_id), ("store", store.durable_uri), ("Airflow home", str(root / "airflow")),
               *[(f"clickstream acknowledged after epoch {e}", f"through epoch {a}") for e, a in acknowledged.items()],
               ("whole run", f"{time.monotonic() - started:.0f}s")])
    return DemoOutcome(store, p, reran, final, acknowledged, checks, page)


def _strategies(p: RecoveryPlan, tasks: list[ProcessorId], epochs: list[int],
                normal: dict[tuple[ProcessorId, int], dict[str, Any]]) -> list[Strategy]:
    """Re-run work per strategy, in task instances and in task-seconds at each task's mean measured duration."""
    durations: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for (task, _), ti in normal.items():
        durations[task] += ti.get("duration") or 0
        counts[task] += 1
    cost = {t: durations[t] / counts[t] if counts[t] else 0.0 for t in tasks}
    return [
        Strategy("Falkirk frontier", len(p.rerun_set()), sum(cost[t] for t, _ in p.rerun_set())),
        Strategy("clear-downstream", len(p.clear_downstream_set()), sum(cost[t] for t, _ in p.clear_downstream_set())),
        Strategy("restart from scratch", len(tasks) * len(epochs), sum(cost.values()) * len(epochs)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8, help="epochs to run (default 8)")
    parser.add_argument("--lose-at", type=int, default=6,
                        help="the epoch before which rank's scratch tier is lost (default 6)")
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS,
                        help=f"events per epoch (default {DEFAULT_RECORDS:,}; 2000000 for millions)")
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT / ".falkirk" / "figure1",
                        help="where the run keeps Airflow's home, the store and the report (emptied first)")
    parser.add_argument("--port", type=int, default=8080, help="Airflow API server port (default 8080)")
    args = parser.parse_args(argv)
    if not 2 <= args.lose_at <= args.epochs:
        parser.error(f"--lose-at {args.lose_at}: give an epoch between 2 and --epochs ({args.epochs})")
    if args.records < 1:
        parser.error(f"--records {args.records}: give at least 1")
    started = time.monotonic()
    outcome = run_demo(args.root, epochs=args.epochs, lose_at=args.lose_at, records=args.records, port=args.port)
    say(f"\n{'all checks passed' if outcome.ok else 'SOME CHECKS FAILED'} in {time.monotonic() - started:.0f}s")
    say(f"report: {outcome.report}")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
