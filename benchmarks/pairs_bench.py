"""Process pairs benchmark: a worker lost mid-stream, and what the pairs cost (Flux, Shah, Hellerstein, Brewer: fail-over without rollback).

The shape is :class:`devstack.cluster.Cluster` (Airflow on PostgreSQL with Celery workers
worker-0..worker-3 and a spare worker-4, Spark standalone behind Spark Connect, the store on
``moto_server``). ``dags/falkirk_pairs.py`` (sessions per (src, dst), then running statistics per
(app, src), 4 partitions each) reads a synthetic stream of ``--events`` numbered events per epoch.
Three copies of it, one configuration each, run ``--epochs`` epochs, interleaved (epoch e of
process pairs, then of unreplicated, then of cluster pairs), so that whatever grows over a run
(the tables' logs, the ledger, the Spark server's state) weighs on the three alike:

* **unreplicated**: ``sessions`` and ``stats`` under ``EagerCheckpoint()``, one copy;
* **cluster pairs**: two full copies of the unreplicated DAG, triggered together (an epoch ends
  when both copies have it);
* **process pairs**: ``ProcessPairs()`` (each partition twice, chained over worker-0..3). Before
  epoch ``--lose-at`` worker-1 is killed with its disk. ``falkirk watch`` notices it and takes
  over its replicas; two epochs later ``falkirk pairs --catch-up`` recreates them on worker-4.

It prints, for process pairs, per epoch: output rows and the latency from ingress commit to the
sink commit, for the partitions that lost a replica and for the others; the state copied by the
catch-up (bytes, seconds); the input dropped (closed sessions missing downstream, must be 0).
Then the per-epoch time of each configuration (median over the same epochs: all but the three
from the loss to the catch-up) and the ratios measured in this run, against the targets: no
output gap for partitions that were not recovering; the epoch spanning the failure at most 1.5x
a normal one; process pairs within 1.2x of cluster pairs.

    make bench-pairs
    .venv/bin/python -m benchmarks.pairs_bench --epochs 20 --lose-at 10 --events 2000
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from devstack.airflow import USERS
from devstack.cluster import Cluster
from falkirk.plugins.pairs import catch_up
from falkirk.policies.store.ledger import Ledger
from falkirk.spark_jobs.sessions.ingress import SYNTHETIC_ENV, events

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ("worker-0", "worker-1", "worker-2", "worker-3", "worker-4")
LOST = "worker-1"
SPARE = "worker-4"
PARTITIONS = 4
UNREP, PAIR_A, PAIR_B, PP = "bench_unreplicated", "bench_cluster_a", "bench_cluster_b", "bench_process_pairs"
DAG_FILE = '''"""Airflow DAG file: the process pairs benchmark's copies of dags/falkirk_pairs.py."""
import importlib.util

from falkirk.policies import EagerCheckpoint

_spec = importlib.util.spec_from_file_location("falkirk_pairs_dag", {path!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_eager = {{"sessions": EagerCheckpoint(), "stats": EagerCheckpoint()}}
bench_unreplicated = _module.build_dag("bench_unreplicated", regimes=_eager)
bench_cluster_a = _module.build_dag("bench_cluster_a", regimes=_eager)
bench_cluster_b = _module.build_dag("bench_cluster_b", regimes=_eager)
bench_process_pairs = _module.build_dag("bench_process_pairs")
'''


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def run_epochs(client, clock, dags: list[str], epochs: range) -> dict[int, float]:  # noqa: ANN001
    """Trigger each epoch of ``dags`` together, one epoch after the other; its wall time (first start
    to last end, by Airflow's clock)."""
    took = {}
    for e in epochs:
        for dag in dags:
            client.trigger(dag, f"epoch-{e}", clock.logical_date(e))
        runs = []
        for dag in dags:
            if (state := client.wait_for_run(dag, f"epoch-{e}", timeout=1800)) != "success":
                raise RuntimeError(f"{dag} epoch {e} ended {state}")
            runs.append(client.dag_run(dag, f"epoch-{e}"))
        took[e] = max(_when(r["end_date"]) for r in runs) - min(_when(r["start_date"]) for r in runs)
        say(f"  {', '.join(dags)} epoch {e}: {took[e]:.1f}s")
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lose-at", type=int, default=10)
    parser.add_argument("--events", type=int, default=2000, help="events per epoch (default 2000)")
    parser.add_argument("--root", type=Path, default=Path("/tmp/falkirk-pairs-bench"))
    args = parser.parse_args(argv)
    if not 3 <= args.lose_at <= args.epochs - 3:
        parser.error(f"--lose-at {args.lose_at}: give an epoch from 3 to {args.epochs - 3}")
    shutil.rmtree(args.root, ignore_errors=True)
    dags = args.root / "dags"
    dags.mkdir(parents=True)
    (dags / "bench.py").write_text(DAG_FILE.format(path=str(ROOT / "dags" / "falkirk_pairs.py")))
    import importlib.util

    spec = importlib.util.spec_from_file_location("falkirk_pairs_dag", ROOT / "dags" / "falkirk_pairs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    clock = module.EPOCHS
    env = {SYNTHETIC_ENV: str(args.events)}
    with Cluster(args.root / "shape", dags_folder=dags, workers=WORKERS, spark_connect=True, extra_env=env) as cluster:
        client, store = cluster.airflow.client(), cluster.store
        for dag in (UNREP, PAIR_A, PAIR_B, PP):
            client.wait_for_dag(dag)
            client.set_paused(dag, False)
        unrep: dict[int, float] = {}
        cluster_pairs: dict[int, float] = {}
        pp: dict[int, float] = {}

        def each(epochs: range) -> None:  # process pairs first: its epoch at --lose-at spans the loss
            for e in epochs:
                pp.update(run_epochs(client, clock, [PP], [e]))
                unrep.update(run_epochs(client, clock, [UNREP], [e]))
                cluster_pairs.update(run_epochs(client, clock, [PAIR_A, PAIR_B], [e]))

        say(f"epochs 1-{args.lose_at - 1} of the three configurations")
        each(range(1, args.lose_at))
        cli = {**cluster.airflow.env(), "FALKIRK_AIRFLOW_URL": cluster.airflow.base_url,
               "FALKIRK_AIRFLOW_USER": "admin", "FALKIRK_AIRFLOW_PASSWORD": USERS["admin"][1]}
        log = args.root / "watch.log"
        with open(log, "wb") as out:
            watcher = subprocess.Popen([sys.executable, "-m", "falkirk.plugins.cli", "watch", "--dag", PP,
                                        "--timeout", "15", "--poll", "3"], env=cli, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        try:
            time.sleep(8)
            say(f"{LOST} is lost with its disk; epochs {args.lose_at}-{args.epochs} go on")
            cluster.airflow.worker(LOST).kill()
            shutil.rmtree(cluster.scratch_root(LOST), ignore_errors=True)
            each(range(args.lose_at, args.lose_at + 2))
            started = time.monotonic()
            caught = catch_up(PP, store, client, spare=SPARE, progress=say)
            copy_seconds = time.monotonic() - started
            each(range(args.lose_at + 2, args.epochs + 1))
        finally:
            watcher.kill()
            watcher.wait()
        rows = Ledger(store).entries(PP)
    report(args, rows, unrep, cluster_pairs, pp, caught, copy_seconds, log.read_text())
    return 0


def report(args, rows, unrep, cluster_pairs, pp, caught, copy_seconds, watched) -> None:  # noqa: ANN001
    recovering = sorted({int(r["replica"].split("[")[1][0]) for r in caught.replicas})
    ingress = {r.epoch: r.committed_at.timestamp() for r in rows if r.task_id == "ingress"}
    first_sink: dict[tuple[int, int], float] = {}
    out_rows: dict[tuple[int, int], int] = {}
    closed: dict[int, int] = {}
    for r in rows:
        if r.task_id == "stats":
            key = (r.map_index // 2, r.epoch)
            first_sink[key] = min(first_sink.get(key, float("inf")), r.committed_at.timestamp())
            out_rows[key] = r.output_rows
    per_partition: dict[tuple[int, int], int] = {}
    for r in rows:  # closed sessions per epoch: the rows of any committed replica of each partition (the same)
        if r.task_id == "sessions" and not r.run_id.startswith("catch-up:"):
            per_partition[r.map_index // 2, r.epoch] = r.output_rows
    for (_, e), n in per_partition.items():
        closed[e] = closed.get(e, 0) + n
    lines = ["", f"process pairs, {PARTITIONS} partitions chained over worker-0..3, {LOST} lost before epoch "
             f"{args.lose_at}; partitions that lost a replica: {recovering}", "",
             "| epoch | output rows (recovering / others) | latency ingress->sink, s (recovering / others) | "
             "input dropped |", "|---|---|---|---|"]
    dropped_total = 0
    for e in range(1, args.epochs + 1):
        rec = [p for p in range(PARTITIONS) if p in recovering]
        oth = [p for p in range(PARTITIONS) if p not in recovering]
        lat = {grp: [first_sink[p, e] - ingress[e] for p in ps if (p, e) in first_sink] for grp, ps in
               (("rec", rec), ("oth", oth))}
        expected = sum(1 for ev in events(e, args.events) if ev[3] == "END")
        dropped = expected - closed.get(e, 0)
        dropped_total += dropped
        lines.append(f"| {e} | {sum(out_rows.get((p, e), 0) for p in rec)} / {sum(out_rows.get((p, e), 0) for p in oth)}"
                     f" | {max(lat['rec'], default=float('nan')):.1f} / {max(lat['oth'], default=float('nan')):.1f} "
                     f"| {dropped} |")
    faulty = (args.lose_at, args.lose_at + 1, args.lose_at + 2)
    normal = statistics.median(v for e, v in pp.items() if e not in faulty)
    spanning = pp[args.lose_at]
    steady_u = statistics.median(v for e, v in unrep.items() if e not in faulty)
    steady_c = statistics.median(v for e, v in cluster_pairs.items() if e not in faulty)
    copied = sum(r["bytes"] for r in caught.replicas)
    gap = [e for e in range(1, args.epochs + 1) for p in range(PARTITIONS)
           if p not in recovering and (p, e) not in first_sink]
    lines += ["", f"state copied by the catch-up onto {SPARE}: {copied} bytes in {copy_seconds:.1f}s "
              f"({len(caught.replicas)} replicas)", f"input dropped: {dropped_total} (target 0)",
              f"output gap in partitions not recovering: {len(gap)} epochs (target 0)", "",
              "| configuration | per-epoch time, s (median) | ratio |", "|---|---|---|",
              f"| unreplicated | {steady_u:.1f} | 1.00 |",
              f"| cluster pairs (two copies) | {steady_c:.1f} | {steady_c / steady_u:.2f} |",
              f"| process pairs | {normal:.1f} | {normal / steady_u:.2f} |", "",
              f"process pairs / cluster pairs: {normal / steady_c:.2f} (target <= 1.2)",
              f"epoch {args.lose_at} (spanning the failure) / a normal epoch: {spanning / normal:.2f} (target <= 1.5)"]
    noticed = [line for line in watched.splitlines() if "has not answered" in line]
    lines.append(f"falkirk watch: {noticed[0] if noticed else 'did not notice the lost worker'}")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
