"""Replay benchmark: a replay's wall time against the critical path of the re-runs it waits for.

Two plans of the reference application (``falkirk_figure1``, 8 epochs, the fault before epoch 6):

* **demo**: ``make demo``'s plan: one Airflow (LocalExecutor) and a Spark Connect server; rank's
  scratch tier is deleted, ``plan(lost_scratch=...)``;
* **lost worker**: ``make cluster-demo``'s plan on the distributed shape (Airflow on PostgreSQL,
  two Celery workers, a Spark standalone cluster, the durable store on ``moto_server``); worker-a
  is killed and its disk deleted, ``plan(lost_workers=["worker-a"])``.

The replay (``falkirk.plugins.recovery.replay``, what ``falkirk replay`` runs) is timed from its
call to its return. Its **critical path** is the longest chain of the task instances that ran
inside that window, each weighed by its duration as Airflow records it (end minus start), along
the DAG's edges within an epoch and from a ``depends_on_past`` task's epoch to the next: the time
the re-runs need however well they are driven. **Overhead** is wall time minus critical path: what
the replay's orchestration (and Airflow's scheduling of what it clears) adds.

``make bench-replay`` measures this checkout and, in a git worktree with its own environment
(made and installed on first use, kept under ``--root``), the commit ``--before`` (default
``ea3a66b``, the replay before it became a reconciler over one observation), and prints both::

    make bench-replay
    make bench-replay BENCH_ARGS="--repeats 3"     # each plan 3 times per checkout, judged on medians
    .venv/bin/python -m benchmarks.replay_bench --before ea3a66b
    .venv/bin/python -m benchmarks.replay_bench --measure out.json   # this checkout only
    .venv/bin/python -m benchmarks.replay_bench --measure out.json --plans lost-worker \
        --airflow AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL=5          # with an Airflow setting of one's own

Each replay's results keep its re-runs' timeline (``scheduled_when``, ``queued_when``, start, end,
worker, in seconds from the replay's call) under ``--root``'s ``runs/``.

Only this file is taken from the current tree; in the other checkout it imports that checkout's
``devstack`` and ``falkirk``, through names both have.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

TARGETS = {"overhead after / before": 0.5, "wall / critical path (after)": 1.5}
EPOCHS, LOSE_AT, RECORDS = 8, 6, 5_000
HERE = Path(__file__).resolve()


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def _when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


# -- measuring, inside the checkout measured ------------------------------------------------------------------------


def critical_path(tasks: list[dict[str, Any]], instances: dict[tuple[str, int], dict[str, Any]],
                  started: float, ended: float) -> tuple[float, int, float]:
    """(critical path seconds, instances in the window, their task-seconds) of the task instances
    that ran inside [started, ended], along the DAG's edges and ``depends_on_past``.

    >>> tasks = [{"task_id": "a", "downstream_task_ids": ["b"], "depends_on_past": True},
    ...          {"task_id": "b", "downstream_task_ids": [], "depends_on_past": False}]
    >>> ti = lambda s, e: {"start_date": f"2026-01-01T00:00:{s:02d}Z", "end_date": f"2026-01-01T00:00:{e:02d}Z"}
    >>> t0 = _when("2026-01-01T00:00:00Z")
    >>> critical_path(tasks, {("a", 1): ti(1, 3), ("b", 1): ti(4, 5), ("a", 2): ti(4, 9), ("b", 2): ti(9, 10)},
    ...               t0, t0 + 60)
    (8.0, 4, 9.0)
    """
    upstream: dict[str, set[str]] = {t["task_id"]: set() for t in tasks}
    for t in tasks:
        for down in t["downstream_task_ids"]:
            upstream[down].add(t["task_id"])
    past = {t["task_id"] for t in tasks if t["depends_on_past"]}
    order = {task: i for i, task in enumerate(_topological(upstream))}
    ran = {k: end - start for k, (start, end) in inside(instances, started, ended).items()}
    longest: dict[tuple[str, int], float] = {}
    for task, epoch in sorted(ran, key=lambda k: (k[1], order[k[0]])):
        before = [(u, epoch) for u in upstream[task]] + ([(task, epoch - 1)] if task in past else [])
        longest[task, epoch] = ran[task, epoch] + max((longest[k] for k in before if k in longest), default=0.0)
    return max(longest.values(), default=0.0), len(ran), sum(ran.values())


def inside(instances: dict[tuple[str, int], dict[str, Any]], started: float,
           ended: float) -> dict[tuple[str, int], tuple[float, float]]:
    """(start, end) of the task instances that ran inside [started, ended] (a second's slack:
    Airflow's clock and this process's are one machine's, its stamps rounded)."""
    spans = {k: (_when(ti["start_date"]), _when(ti["end_date"])) for k, ti in instances.items()
             if ti.get("start_date") and ti.get("end_date")}
    return {k: (s, e) for k, (s, e) in spans.items() if s >= started - 1 and e <= ended + 1}


STAGES = ("released -> scheduled", "scheduled -> queued", "queued -> started")


def handoffs(tasks: list[dict[str, Any]], instances: dict[tuple[str, int], dict[str, Any]],
             started: float, ended: float) -> dict[str, float]:
    """The median seconds of each of Airflow's hand-off stages over the task instances that ran
    inside [started, ended]: from an instance's release (the last end among the instances it waits
    for, along the DAG's edges and ``depends_on_past``; the replay's start if none ran inside) to
    Airflow's ``scheduled_when``, to its ``queued_when``, to its start.

    >>> tasks = [{"task_id": "a", "downstream_task_ids": ["b"], "depends_on_past": False},
    ...          {"task_id": "b", "downstream_task_ids": [], "depends_on_past": False}]
    >>> at = lambda s: f"2026-01-01T00:00:{s:02d}Z"
    >>> ti = lambda s, q, b, e: {"scheduled_when": at(s), "queued_when": at(q), "start_date": at(b), "end_date": at(e)}
    >>> t0 = _when(at(0))
    >>> handoffs(tasks, {("a", 1): ti(1, 2, 4, 5), ("b", 1): ti(6, 8, 9, 10)}, t0, t0 + 60)
    {'released -> scheduled': 1.0, 'scheduled -> queued': 1.5, 'queued -> started': 1.5}
    """
    upstream: dict[str, set[str]] = {t["task_id"]: set() for t in tasks}
    for t in tasks:
        for down in t["downstream_task_ids"]:
            upstream[down].add(t["task_id"])
    past = {t["task_id"] for t in tasks if t["depends_on_past"]}
    ran = inside(instances, started, ended)
    waits: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for (task, epoch), (start, _) in ran.items():
        ti = instances[task, epoch]
        if not (ti.get("scheduled_when") and ti.get("queued_when")):
            continue
        before = [(u, epoch) for u in upstream[task]] + ([(task, epoch - 1)] if task in past else [])
        released = max([started, *(ran[k][1] for k in before if k in ran)])
        stamps = [released, _when(ti["scheduled_when"]), _when(ti["queued_when"]), start]
        for stage, (a, b) in zip(STAGES, zip(stamps, stamps[1:])):
            waits[stage].append(max(0.0, b - a))
    return {stage: statistics.median(w) if w else 0.0 for stage, w in waits.items()}


def timeline(instances: dict[tuple[str, int], dict[str, Any]], started: float,
             ended: float) -> list[dict[str, Any]]:
    """The task instances that ran inside [started, ended], in start order, with their
    ``scheduled_when``, ``queued_when``, start and end in seconds from ``started`` and the worker
    (Airflow's ``hostname``) that ran them.

    >>> at = lambda s: f"2026-01-01T00:00:{s:02d}Z"
    >>> ti = {"scheduled_when": at(1), "queued_when": at(2), "start_date": at(3), "end_date": at(5), "hostname": "w"}
    >>> timeline({("a", 1): ti}, _when(at(0)), _when(at(9)))
    [{'task': 'a', 'epoch': 1, 'scheduled': 1.0, 'queued': 2.0, 'start': 3.0, 'end': 5.0, 'worker': 'w'}]
    """
    rows = []
    for (task, epoch), (start, end) in sorted(inside(instances, started, ended).items(), key=lambda kv: kv[1]):
        ti = instances[task, epoch]
        stamp = lambda key: round(_when(ti[key]) - started, 3) if ti.get(key) else None  # noqa: E731
        rows.append({"task": task, "epoch": epoch, "scheduled": stamp("scheduled_when"), "queued": stamp("queued_when"),
                     "start": round(start - started, 3), "end": round(end - started, 3), "worker": ti.get("hostname")})
    return rows


def _topological(upstream: dict[str, set[str]]) -> list[str]:
    done: list[str] = []
    while len(done) < len(upstream):
        done += sorted(t for t, ups in upstream.items() if t not in done and ups <= set(done))
    return done


def _instances(client: Any, dag_id: str, epochs: Iterable[int]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(ti["task_id"], e): ti for e in epochs for ti in client.task_instances(dag_id, f"epoch-{e}").values()}


def _tasks(client: Any, dag_id: str) -> list[dict[str, Any]]:
    from falkirk.plugins.airflow_rest import api_path
    return client.request("GET", api_path("dags", dag_id, "tasks"))["tasks"]


def _timed_replay(name: str, plan: Any, store: Any, client: Any, dag_id: str, slots: int) -> dict[str, Any]:
    """Replay ``plan`` and measure it; ``slots`` is how many task instances the executor runs at
    once where the re-runs go (the bound no schedule of their task-seconds beats)."""
    from falkirk.plugins.recovery import replay
    say(f"{name}: replaying {plan.plan_id} ({len(plan.rerun_set())} task instances in its re-run set)")
    passes = _Passes()
    started = time.time()
    with passes:
        replay(plan.plan_id, store, client, holder="falkirk-bench", progress=lambda line: say(f"  {line}"))
    ended = time.time()
    instances = _instances(client, dag_id, range(1, EPOCHS + 1))
    tasks = _tasks(client, dag_id)
    path, count, task_seconds = critical_path(tasks, instances, started, ended)
    spans = inside(instances, started, ended).values()
    say(f"{name}: wall {ended - started:.1f}s, critical path {path:.1f}s over {count} task instances")
    return {"plan": name, "planned": len(plan.rerun_set()), "instances": count, "task_seconds": task_seconds,
            "slots": slots,
            "critical_path": path, "wall": ended - started,
            "handoffs": handoffs(tasks, instances, started, ended),
            # the replay's own ends of the overhead: until the first re-run starts, after the last ends
            "first_start": min(s for s, _ in spans) - started, "after_last": ended - max(e for _, e in spans),
            # each re-run's stamps, in seconds from the replay's call: where a reader finds the gaps
            "timeline": timeline(instances, started, ended),
            **passes.totals()}


class _Passes(logging.Handler):
    """The replay loop's passes as its debug log gives them (a checkout whose loop logs none
    gives no totals): the seconds before the first pass (checks, lease, invalidations), how many
    passes, and the seconds they spent observing and applying."""

    LINE = re.compile(r"pass \d+ \((?P<stage>[^)]*)\): observed in (?P<observe>[\d.]+)s, \d+ actions applied in "
                      r"(?P<apply>[\d.]+)s")
    SETUP = re.compile(r"checked, leased and invalidated in (?P<seconds>[\d.]+)s")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, float, float]] = []
        self.setup = 0.0
        self.logger = logging.getLogger("falkirk.plugins.replay")

    def __enter__(self) -> _Passes:
        self.level_before = self.logger.level
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)

    def emit(self, record: logging.LogRecord) -> None:
        if m := self.SETUP.search(record.getMessage()):
            self.setup = float(m["seconds"])
        if m := self.LINE.search(record.getMessage()):
            self.seen.append((m["stage"], float(m["observe"]), float(m["apply"])))

    def totals(self) -> dict[str, float]:
        """{} when no pass was logged; else passes, observing and applying seconds.

        >>> p = _Passes()
        >>> p.emit(logging.makeLogRecord({"msg": "plan x: pass 1 (start): observed in 0.250s, 3 actions applied in 0.500s"}))
        >>> p.totals()
        {'setup': 0.0, 'passes': 1, 'observing': 0.25, 'applying': 0.5}
        """
        if not self.seen:
            return {}
        return {"setup": self.setup, "passes": len(self.seen), "observing": sum(o for _, o, _ in self.seen),
                "applying": sum(a for _, _, a in self.seen)}


def _steady_state(client: Any, dag_id: str, clock: Any, label: str) -> list[dict[str, Any]]:
    """Unpause the DAG, run epochs 1 to LOSE_AT - 1 and wait for them; returns its tasks."""
    client.wait_for_dag(dag_id)
    client.set_paused(dag_id, False)
    tasks = _tasks(client, dag_id)
    say(f"{label}: epochs 1-{LOSE_AT - 1}")
    for e in range(1, LOSE_AT):
        client.trigger(dag_id, f"epoch-{e}", clock.logical_date(e))
    _wait(client, dag_id, {(t["task_id"], e): {"success"} for t in tasks for e in range(1, LOSE_AT)})
    return tasks


def _wait(client: Any, dag_id: str, want: dict[tuple[str, int], set[str | None]], timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while True:
        epochs = sorted({e for _, e in want})
        states = {k: ti.get("state") for k, ti in _instances(client, dag_id, epochs).items()}
        if all(states.get(k) in ok for k, ok in want.items()):
            return
        if time.monotonic() > deadline:
            wrong = sorted((k, states.get(k)) for k, ok in want.items() if states.get(k) not in ok)
            raise RuntimeError(f"{dag_id}: not in the expected states after {timeout:.0f}s: {wrong[:5]}")
        time.sleep(2)


def measure_demo(root: Path, airflow_env: dict[str, str]) -> dict[str, Any]:
    """make demo's plan: rank's scratch tier lost before epoch LOSE_AT."""
    from devstack.airflow import AirflowStack
    from devstack.cluster_demo import DAG_ID, _clock
    from devstack.figure1_demo import _downstream
    from devstack.spark import SparkConnectServer
    from falkirk.plugins.recovery import plan
    from falkirk.policies.store import StoreConfig
    from falkirk.spark_jobs.figure1 import EDGES
    from falkirk.spark_jobs.figure1.data import RECORDS_ENV

    store = StoreConfig(str(root / "store"), str(root / "scratch"))
    clock = _clock()
    with SparkConnectServer(root) as connect:
        stack = AirflowStack(home=root / "airflow", store=store,
                             extra_env={**connect.airflow_env(), RECORDS_ENV: str(RECORDS), **airflow_env})
        stack.init()
        stack.start()
        try:
            client = stack.client()
            tasks = _steady_state(client, DAG_ID, clock, "demo")
            lost = f"{store.scratch_uri}/{DAG_ID}/rank"
            shutil.rmtree(lost, ignore_errors=True)
            say(f"demo: deleted {lost}; epochs {LOSE_AT}-{EPOCHS}")
            for e in range(LOSE_AT, EPOCHS + 1):
                client.trigger(DAG_ID, f"epoch-{e}", clock.logical_date(e))
            blocked = _downstream(EDGES, "rank")
            _wait(client, DAG_ID, {
                (t, e): ({"failed"} if t == "rank" and e == LOSE_AT else
                         {"upstream_failed"} if t in blocked and e == LOSE_AT else
                         {None} if t == "rank" or t in blocked else {"success"})
                for t in (t["task_id"] for t in tasks) for e in range(LOSE_AT, EPOCHS + 1)})
            p = plan(DAG_ID, store, client, lost_scratch=[lost])
            # the LocalExecutor's parallelism (devstack's default for one Airflow)
            return _timed_replay("demo", p, store, client, DAG_ID, slots=4)
        finally:
            stack.stop()


def measure_lost_worker(root: Path, airflow_env: dict[str, str]) -> dict[str, Any]:
    """make cluster-demo's plan: worker-a and its disk lost before epoch LOSE_AT."""
    from devstack.cluster import Cluster
    from devstack.cluster_demo import DAG_ID, DAGS, QUEUES_ENV, _clock
    from falkirk.plugins.recovery import plan
    from falkirk.spark_jobs.figure1.data import RECORDS_ENV

    queues = root / "queues.json"
    queues.write_text(json.dumps({DAG_ID: "worker-a"}))
    env = {QUEUES_ENV: str(queues), RECORDS_ENV: str(RECORDS), "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
           **airflow_env}
    clock = _clock()
    with Cluster(root / "shape", dags_folder=DAGS, extra_env=env, spark_connect=True) as cluster:
        client = cluster.airflow.client()
        _steady_state(client, DAG_ID, clock, "lost worker (on worker-a)")
        say(f"lost worker: worker-a is killed and its disk deleted; epochs {LOSE_AT}-{EPOCHS}")
        cluster.airflow.worker("worker-a").kill()
        shutil.rmtree(cluster.scratch_root("worker-a"), ignore_errors=True)
        for e in range(LOSE_AT, EPOCHS + 1):
            client.trigger(DAG_ID, f"epoch-{e}", clock.logical_date(e))
        p = plan(DAG_ID, cluster.store, client, lost_workers=["worker-a"])
        # the survivor worker-b's Celery concurrency
        return _timed_replay("lost worker", p, cluster.store, client, DAG_ID, slots=2)


PLANS = {"demo": measure_demo, "lost-worker": measure_lost_worker}


def measure(out: Path, root: Path, plans: list[str], airflow_env: dict[str, str] | None = None) -> None:
    # Only each plan's own directory starts afresh: ``root`` also keeps the other checkout and
    # the compared runs' results.
    results = []
    for name in plans:
        shutil.rmtree(root / name, ignore_errors=True)
        (root / name).mkdir(parents=True)
        results.append(PLANS[name](root / name, airflow_env or {}))
    out.write_text(json.dumps(results, indent=1))


# -- comparing two checkouts -----------------------------------------------------------------------------------------


def checkout_at(commit: str, root: Path) -> Path:
    """A worktree of ``commit`` under ``root`` with its own installed environment."""
    tree = root / f"checkout-{commit}"
    if not (tree / ".venv" / ".compiled").exists():
        if not tree.exists():
            say(f"git worktree add {tree} {commit}")
            subprocess.run(["git", "worktree", "add", "-f", str(tree), commit], cwd=HERE.parents[1], check=True,
                           capture_output=True)
        say(f"make install in {tree} (its own environment; once)")
        subprocess.run(["make", "install"], cwd=tree, check=True, stdout=subprocess.DEVNULL)
    return tree


def run_in(checkout: Path, label: str, root: Path, plans: list[str], settings: list[str]) -> list[dict[str, Any]]:
    out = root / f"{label}.json"
    say(f"== {label}: {checkout}")
    subprocess.run([str(checkout / ".venv" / "bin" / "python"), str(HERE), "--measure", str(out),
                    "--root", str(root / label), "--plans", ",".join(plans), *(f"--airflow={kv}" for kv in settings)], cwd=checkout, check=True,
                   env={**os.environ, "PYTHONPATH": str(checkout)})
    return json.loads(out.read_text())


def verdicts(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, tuple[float, float, int]]:
    """Per plan: (the median overhead after over the median overhead before, the median of wall /
    critical path after, how many replays of each checkout): a plan replayed several times
    (``--repeats``) is judged on its medians, not on its luckiest or unluckiest replay.

    >>> r = lambda plan, wall, path: {"plan": plan, "wall": wall, "critical_path": path}
    >>> verdicts([r("demo", 14, 10), r("demo", 18, 10), r("demo", 30, 10)],
    ...          [r("demo", 12, 10), r("demo", 13, 10), r("demo", 11, 10)])
    {'demo': (0.25, 1.2, 3)}
    """
    out = {}
    for plan in dict.fromkeys(r["plan"] for r in after):
        b = [r for r in before if r["plan"] == plan]
        a = [r for r in after if r["plan"] == plan]
        overhead = lambda runs: statistics.median(r["wall"] - r["critical_path"] for r in runs)  # noqa: E731
        out[plan] = (overhead(a) / overhead(b), statistics.median(r["wall"] / r["critical_path"] for r in a),
                     min(len(a), len(b)))
    return out


def report(before: list[dict[str, Any]], after: list[dict[str, Any]], commit: str) -> tuple[str, bool]:
    from benchmarks.regime_bench import table
    rows = [["plan", "checkout", "task instances", "critical path (s)", "replay wall (s)", "overhead (s)",
             "to first start (s)", "after last end (s)", "wall / critical path"]]
    for label, results in ((commit, before), ("this", after)):
        for r in results:
            rows.append([r["plan"], label, str(r["instances"]), f"{r['critical_path']:.1f}", f"{r['wall']:.1f}",
                         f"{r['wall'] - r['critical_path']:.1f}", f"{r['first_start']:.1f}", f"{r['after_last']:.1f}",
                         f"{r['wall'] / r['critical_path']:.2f}"])
    checks = [["plan", "replays each", "overhead after / before", "target", "wall / critical path (after)", "target"]]
    ok = True
    for plan, (shrink, ratio, runs) in verdicts(before, after).items():
        ok = ok and shrink <= TARGETS["overhead after / before"] and ratio <= TARGETS["wall / critical path (after)"]
        checks.append([plan, str(runs), f"{shrink:.2f}", "<= 0.50", f"{ratio:.2f}", "<= 1.50"])
    stages = [["plan", "checkout", *(f"{stage} (s)" for stage in STAGES)]]
    for label, results in ((commit, before), ("this", after)):
        for r in results:
            if "handoffs" in r:
                stages.append([r["plan"], label, *(f"{r['handoffs'][stage]:.2f}" for stage in STAGES)])
    handed = f"\n\nAirflow's hand-off per task instance (median)\n\n{table(stages)}" if len(stages) > 1 else ""
    bounds = [["plan", "checkout", "slots", "task-seconds / slots", "bound (s)", "wall / bound"]]
    for label, results in ((commit, before), ("this", after)):
        for r in results:
            if "slots" in r:
                bound = max(r["critical_path"], r["task_seconds"] / r["slots"])
                bounds.append([r["plan"], label, str(r["slots"]), f"{r['task_seconds'] / r['slots']:.1f}",
                               f"{bound:.1f}", f"{r['wall'] / bound:.2f}"])
    bounded = (f"\n\nthe bound no schedule beats with the executor's slots: max(critical path, task-seconds / "
               f"slots)\n\n{table(bounds)}") if len(bounds) > 1 else ""
    loops = [["plan", "checkout", "before the first pass (s)", "passes", "observing (s)", "applying (s)"]]
    for label, results in ((commit, before), ("this", after)):
        for r in results:
            if "passes" in r:
                loops.append([r["plan"], label, f"{r['setup']:.1f}", str(r["passes"]), f"{r['observing']:.1f}", f"{r['applying']:.1f}"])
    looped = (f"\n\nthe replay's own time (its debug log): its checks, lease and invalidations, then its "
              f"passes, reading Airflow and the store, and acting\n\n{table(loops)}") if len(loops) > 1 else ""
    return f"{table(rows)}\n\n{table(checks)}{handed}{bounded}{looped}", ok


def airflow_settings(parser: argparse.ArgumentParser, given: list[str]) -> dict[str, str]:
    """``--airflow`` values as environment variables; anything but ``AIRFLOW__SECTION__KEY=VALUE``
    is refused, naming it.

    >>> airflow_settings(argparse.ArgumentParser(), ["AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL=5"])
    {'AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL': '5'}
    """
    settings = {}
    for kv in given:
        key, sep, value = kv.partition("=")
        if not sep or not re.fullmatch(r"AIRFLOW__[A-Z0-9_]+__[A-Z0-9_]+", key):
            parser.error(f"--airflow {kv!r}: give AIRFLOW__SECTION__KEY=VALUE, e.g. "
                         f"AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL=5")
        settings[key] = value
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="ea3a66b", help="the commit to compare with (default ea3a66b)")
    parser.add_argument("--measure", type=Path, metavar="OUT",
                        help="measure this checkout only and write the results to OUT (JSON)")
    parser.add_argument("--root", type=Path, default=HERE.parents[1] / ".falkirk" / "bench-replay",
                        help="where the stacks, the other checkout and the results live")
    parser.add_argument("--plans", default=",".join(PLANS), help=f"which plans, comma-separated (default: all, "
                                                                  f"{','.join(PLANS)})")
    parser.add_argument("--airflow", action="append", default=[], metavar="AIRFLOW__SECTION__KEY=VALUE",
                        help="an Airflow setting for both shapes, over the project's own (repeatable), e.g. "
                             "--airflow AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL=5")
    parser.add_argument("--repeats", type=int, default=1, metavar="N",
                        help="replay each plan N times in each checkout, in turn, and judge the targets on the "
                             "medians (default 1)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give 1 or more")
    plans = args.plans.split(",")
    if unknown := sorted(set(plans) - set(PLANS)):
        parser.error(f"--plans: {', '.join(unknown)} is not a plan; use some of {','.join(PLANS)}")
    root = args.root.resolve()
    airflow_env = airflow_settings(parser, args.airflow)
    if args.measure:
        measure(args.measure.resolve(), root, plans, airflow_env)
        return 0
    root.mkdir(parents=True, exist_ok=True)
    other = checkout_at(args.before, root)
    before: list[dict[str, Any]] = []
    after: list[dict[str, Any]] = []
    for i in range(args.repeats):  # the checkouts in turn: a machine that slows down weighs on both
        before += run_in(other, args.before, root / "runs" / str(i), plans, args.airflow)
        after += run_in(HERE.parents[1], "this", root / "runs" / str(i), plans, args.airflow)
    text, ok = report(before, after, args.before)
    print(f"\nreplays of {EPOCHS} epochs with the fault before epoch {LOSE_AT}; overhead = wall - critical path\n\n"
          f"{text}\n\n{'targets met' if ok else 'TARGETS MISSED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
