"""What a Falkirk task instance costs against the same Spark work as a plain Airflow task.

One Airflow (LocalExecutor) and one Spark Connect server run three DAGs
(``benchmarks/overhead_dags``), one DAG run at a time, epochs interleaved so that drift hits
all alike:

* ``bench_plain``: a plain ``@task`` that opens its own Spark Connect session, counts the
  epoch's words (``benchmarks.overhead_job``) and appends them to a Delta table;
* ``bench_falkirk``: the same job as four Falkirk tasks, one per regime, one after another,
  each a client of the same server on the worker's job host;
* ``bench_taskflow``: the same four written inline in the DAG file (``@task.falkirk``,
  ``benchmarks/overhead_dags/bench_taskflow.py``), on the job host;
* ``bench_falkirk_cold``: the same four with ``FALKIRK_JOB_HOST=off``: each job in a fresh
  interpreter, as every Falkirk task ran before the job host (the "before" figure);
* ``bench_figure1`` and ``bench_figure1_cold``: the reference application
  (``dags/falkirk_figure1.py``), an epoch of five task instances, on the job host and in fresh
  interpreters: one DAG run's start to end.

Each row is the median, over its task instances, of Airflow's own start-to-end time of a
task instance (``start_date`` to ``end_date``), and its ratio to the plain task's.

``--lineage`` turns on Airflow's OpenLineage provider for every task, plain and Falkirk alike
(events appended to a file): the ratios then say what a Falkirk task's lineage (its epoch,
the tables it read and wrote: :mod:`falkirk.plugins.lineage`) adds to what lineage costs any
task.

    make bench-overhead
    make bench-overhead BENCH_ARGS="--lineage"
    .venv/bin/python -m benchmarks.overhead_bench --epochs 30 --cold-epochs 8 --figure1-epochs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from datetime import datetime
from pathlib import Path

from devstack.airflow import AirflowStack
from devstack.spark import SparkConnectServer
from falkirk.policies.store import StoreConfig

HERE = Path(__file__).resolve().parent
REGIMES = ("ephemeral", "batch", "lazy", "eager")
LABELS = {"ephemeral": "ephemeral", "batch": "batch(log_outputs=true)", "lazy": "lazy_checkpoint(every=10)",
          "eager": "eager_checkpoint"}


def seconds(ti: dict) -> float:
    start, end = (datetime.fromisoformat(ti[k].replace("Z", "+00:00")) for k in ("start_date", "end_date"))
    return (end - start).total_seconds()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30, help="task instances per row (default 30)")
    parser.add_argument("--cold-epochs", type=int, default=8, help="epochs of the fresh-interpreter baseline")
    parser.add_argument("--figure1-epochs", type=int, default=5,
                        help="epochs of the reference application with and without the job host (default 5)")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--lineage", action="store_true",
                        help="turn on OpenLineage (a file transport) for every task, plain and Falkirk")
    args = parser.parse_args(argv)
    root = args.work_dir or Path(tempfile.mkdtemp(prefix="falkirk-bench-overhead-"))
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    times: dict[tuple[str, str], list[float]] = {}
    events = root / "lineage.jsonl"
    lineage = {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events),
                                                              "append": True})} if args.lineage else {}
    with SparkConnectServer(root / "spark") as server:
        stack = AirflowStack(home=root / "airflow", store=store, dags_folder=HERE / "overhead_dags", extra_env={
            **server.airflow_env(), "FALKIRK_BENCH_REMOTE": server.url, "FALKIRK_BENCH_PLAIN": str(root / "plain"),
            **lineage})
        stack.init()
        stack.start()
        try:
            client = stack.client()
            from benchmarks.overhead_dags.bench_overhead import EPOCHS

            dags = ["bench_plain", "bench_falkirk", "bench_taskflow", "bench_falkirk_cold"]
            for dag in dags:
                client.wait_for_dag(dag)
                client.set_paused(dag, False)
            # Epoch 0 of each warms the server, the host and the tables; it is not counted.
            for epoch in range(0, args.epochs + 1):
                for dag in dags:
                    if dag.endswith("_cold") and epoch > args.cold_epochs:
                        continue
                    run_id = f"epoch-{epoch}"
                    client.trigger(dag, run_id, EPOCHS.logical_date(epoch + 1))
                    state = client.wait_for_run(dag, run_id, timeout=900)
                    if state != "success":
                        raise SystemExit(f"{dag} {run_id} ended {state}; logs in {stack.home / 'logs'}")
                    if epoch == 0:
                        continue
                    for task_id, ti in client.task_instances(dag, run_id).items():
                        times.setdefault((dag, task_id), []).append(seconds(ti))
                print(f"epoch {epoch} done", flush=True)
            # The reference application: one DAG run (five task instances) per epoch, the copy on
            # the job host and the one in fresh interpreters alternating.
            for dag in ("bench_figure1", "bench_figure1_cold"):
                client.wait_for_dag(dag)
                client.set_paused(dag, False)
            for epoch in range(1, args.figure1_epochs + 1):
                for dag in ("bench_figure1", "bench_figure1_cold"):
                    run_id = f"epoch-{epoch}"
                    client.trigger(dag, run_id, EPOCHS.logical_date(epoch))
                    state = client.wait_for_run(dag, run_id, timeout=1800)
                    if state != "success":
                        raise SystemExit(f"{dag} {run_id} ended {state}; logs in {stack.home / 'logs'}")
                    run = client.dag_run(dag, run_id)
                    times.setdefault((dag, "run"), []).append(seconds(run))
                print(f"reference application epoch {epoch} done", flush=True)
        finally:
            stack.stop()
    plain = statistics.median(times["bench_plain", "plain"])
    rows = [("plain Airflow task, own Spark Connect session (baseline)", times["bench_plain", "plain"])]
    rows += [(f"Falkirk {LABELS[r]}, job host", times["bench_falkirk", r]) for r in REGIMES]
    rows += [(f"Falkirk {LABELS[r]}, @task.falkirk, job host", times["bench_taskflow", r]) for r in REGIMES]
    rows += [(f"Falkirk {LABELS[r]}, fresh interpreter", times["bench_falkirk_cold", r]) for r in REGIMES]
    print(f"\nper task instance, Airflow's start to end (median); {args.epochs} epochs, "
          f"{args.cold_epochs} for the fresh interpreter")
    if args.lineage:
        emitted = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
        falkirk = sum(1 for e in emitted if "falkirk" in e["run"].get("facets", {}))
        print(f"OpenLineage on for every task: {len(emitted)} run events in {events}, {falkirk} with a Falkirk "
              f"epoch facet")
    print(f"{'task instance':<62} {'n':>3} {'median':>8} {'vs plain':>9} {'added':>7}")
    print("-" * 93)
    for label, values in rows:
        median = statistics.median(values)
        print(f"{label:<62} {len(values):>3} {median:>7.2f}s {median / plain:>9.2f} {median - plain:>+6.2f}s")
    host = [statistics.median(times["bench_falkirk", r]) for r in REGIMES]
    inline = [statistics.median(times["bench_taskflow", r]) for r in REGIMES]
    print(f"\nthe TaskFlow form (@task.falkirk) per task instance, by regime: "
          f"{', '.join(f'{i / o:.2f}x' for i, o in zip(inline, host))} the operator form's, "
          f"{', '.join(f'{i / plain:.2f}x' for i in inline)} the plain task's; the four together "
          f"{sum(inline):.2f}s against {sum(host):.2f}s as operators ({sum(inline) / sum(host):.2f}x) and "
          f"{4 * plain:.2f}s as plain tasks ({sum(inline) / (4 * plain):.2f}x)")
    cold = [statistics.median(times["bench_falkirk_cold", r]) for r in REGIMES]
    print(f"\nfour Falkirk task instances: {sum(host):.2f}s on the job host, {sum(cold):.2f}s in fresh interpreters "
          f"({sum(cold) / sum(host):.2f}x)")
    if args.figure1_epochs:
        warm, fresh = times["bench_figure1", "run"], times["bench_figure1_cold", "run"]
        print(f"\nthe reference application (falkirk_figure1), one epoch = one DAG run of 5 task instances, "
              f"Airflow's start to end; {len(warm)} epochs each")
        print(f"{'':<34} {'median':>8} {'epochs':>40}")
        print(f"{'fresh interpreter per job (before)':<34} {statistics.median(fresh):>7.1f}s "
              f"{' '.join(f'{t:.1f}' for t in fresh):>40}")
        print(f"{'job host':<34} {statistics.median(warm):>7.1f}s {' '.join(f'{t:.1f}' for t in warm):>40}")
        print(f"speed-up: {statistics.median(fresh) / statistics.median(warm):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
