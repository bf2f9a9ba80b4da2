"""Sender-side logs benchmark: what logging every block costs per epoch, and what it saves in a recovery.

``dags/falkirk_regions.py`` (orders -> clean -> a hash join with customers -> running totals per
region -> ranking) runs through Airflow (LocalExecutor, jobs on one Spark Connect server, the
durable store on an S3-compatible server, scratch on the local disk) in three configurations,
each at every block size of ``--orders`` (orders per epoch: a block is one epoch of one edge):

* **no fault tolerance**: the sources ``Ephemeral()``, ``clean`` ``Batch()``, ``join`` and
  ``total`` keeping their state in scratch only (``LazyCheckpoint(every=1000000)``: never
  durable): nothing is logged, and a lost state can only be rebuilt by re-running from epoch 1;
* **LazyCheckpoint**: the same, with ``join`` and ``total`` under ``LazyCheckpoint(every=2)``
  (their state durable every second epoch);
* **SenderLog**: the DAG as written: every task's output logged durably until its readers have
  released it, ``join`` and ``total`` keeping their state in scratch only. Garbage collection
  (``falkirk gc``) runs after each of its epochs, pruning what the readers released; it is timed
  apart (a deployment runs it beside the epochs, not in them).

The sink (``report``) is ``Batch(log_outputs=True)`` in all three. Epochs are interleaved (epoch t
of every configuration and size before epoch t+1 of any), each a DAG run timed by Airflow's
clock from its start to its end; epoch 1 is a warm-up. The table gives each configuration's
median per-epoch time and the median of its per-epoch ratios to no fault tolerance at the same
size, against the target: SenderLog at most 1.15x no fault tolerance.

Then a recovery at the largest size: ``total``'s scratch directory is deleted after an odd epoch
(so that LazyCheckpoint's newest durable state is one epoch older), in the LazyCheckpoint and
SenderLog copies. SenderLog's epoch rebuilds the state inside
the job from ``join``'s retained epochs; LazyCheckpoint's epoch fails (its state is gone), and
``falkirk plan --lost-scratch`` + replay restore its last durable state and redo the epochs after
it. For each: the time from the epoch's trigger to every table caught up, the task instances run
again, and the input rows read again.

    make bench-senderlog
    .venv/bin/python -m benchmarks.senderlog_bench --orders 200,20000,200000 --epochs 6
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from devstack.airflow import AirflowStack
from devstack.s3 import MotoS3
from devstack.spark import SparkConnectServer
from falkirk.plugins.recovery import plan, replay
from falkirk.policies.planning.collector import collect
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
DAG_PATH = ROOT / "dags" / "falkirk_regions.py"
CONFIGS = ("noft", "lazy", "senderlog")
LABELS = {"noft": "no fault tolerance", "lazy": "LazyCheckpoint(every=2)", "senderlog": "SenderLog"}
TARGET = 1.15  # SenderLog against no fault tolerance, median per-epoch ratio
DAG_FILE = '''"""Airflow DAG file: the sender-side logs benchmark's copies of dags/falkirk_regions.py."""
import importlib.util

from falkirk.policies import Batch, Ephemeral, LazyCheckpoint

_spec = importlib.util.spec_from_file_location("falkirk_regions_dag", {path!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_plain = {{"ingest": Ephemeral(), "customers": Ephemeral(), "clean": Batch()}}
_noft = {{**_plain, "join": LazyCheckpoint(every=1000000), "total": LazyCheckpoint(every=1000000)}}
_lazy = {{**_plain, "join": LazyCheckpoint(every=2), "total": LazyCheckpoint(every=2)}}
for _orders in {sizes!r}:
    globals()[f"bench_noft_{{_orders}}"] = _module.build_dag(f"bench_noft_{{_orders}}", end={end},
                                                            overrides=_noft, orders=_orders)
    globals()[f"bench_lazy_{{_orders}}"] = _module.build_dag(f"bench_lazy_{{_orders}}", end={end},
                                                            overrides=_lazy, orders=_orders)
    globals()[f"bench_senderlog_{{_orders}}"] = _module.build_dag(f"bench_senderlog_{{_orders}}", end={end},
                                                                 orders=_orders)
'''


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def dag_id(config: str, orders: int) -> str:
    return f"bench_{config}_{orders}"


def run_epoch(client, clock, dag: str, epoch: int) -> float:  # noqa: ANN001
    """One epoch of ``dag``: its DAG run's start to end, by Airflow's clock."""
    client.trigger(dag, f"epoch-{epoch}", clock.logical_date(epoch))
    if (state := client.wait_for_run(dag, f"epoch-{epoch}", timeout=3600)) != "success":
        raise RuntimeError(f"{dag} epoch {epoch} ended {state}")
    run = client.dag_run(dag, f"epoch-{epoch}")
    return _when(run["end_date"]) - _when(run["start_date"])


def rows_of(store: StoreConfig, dag: str, task: str, epochs: range) -> int:
    """The rows ``task`` committed in ``epochs`` (from the ledger)."""
    return sum(o.rows or 0 for e in Ledger(store).entries(dag, task) if e.epoch in epochs for o in e.outputs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", default="200,20000,200000",
                        help="orders per epoch, one size per comma (default 200,20000,200000)")
    parser.add_argument("--epochs", type=int, default=6, help="epochs per configuration and size (default 6)")
    parser.add_argument("--store", choices=("s3", "local"), default="s3",
                        help="where the durable store is: the S3-compatible server (default) or the local disk")
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.orders.split(",")]
    except ValueError:
        parser.error(f"--orders {args.orders!r}: give whole numbers separated by commas, e.g. 200,20000")
    if args.epochs < 3 or any(s < 1 for s in sizes):
        parser.error("--epochs: at least 3 (epoch 1 is a warm-up); --orders: each at least 1")
    root = args.work_dir or Path(tempfile.mkdtemp(prefix="falkirk-bench-senderlog-"))
    shutil.rmtree(root / "dags", ignore_errors=True)
    (root / "dags").mkdir(parents=True)
    end = args.epochs + 10  # the execution outlasts the benchmark: at_end inputs stay retained throughout
    (root / "dags" / "bench.py").write_text(DAG_FILE.format(path=str(DAG_PATH), sizes=sizes, end=end))
    import importlib.util

    spec = importlib.util.spec_from_file_location("falkirk_regions_dag", DAG_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    clock = module.EPOCHS
    times: dict[tuple[str, int], dict[int, float]] = {}
    pruning: dict[int, dict[int, float]] = {}
    s3 = MotoS3(root / "moto").start() if args.store == "s3" else None
    try:
        if s3 is not None:
            s3.create_bucket("bench")
            store = StoreConfig("s3://bench/store", str(root / "scratch"), s3.storage_options())
        else:
            store = StoreConfig(str(root / "durable"), str(root / "scratch"))
        with SparkConnectServer(root / "spark") as server:
            stack = AirflowStack(home=root / "airflow", store=store, dags_folder=root / "dags",
                                 extra_env=server.airflow_env())
            stack.init()
            stack.start()
            try:
                client = stack.client()
                for orders in sizes:
                    for config in CONFIGS:
                        client.wait_for_dag(dag_id(config, orders))
                        client.set_paused(dag_id(config, orders), False)
                for epoch in range(1, args.epochs + 1):
                    for orders in sizes:
                        for config in CONFIGS:
                            dag = dag_id(config, orders)
                            took = run_epoch(client, clock, dag, epoch)
                            times.setdefault((config, orders), {})[epoch] = took
                            if config == "senderlog":  # pruning what the readers released, between epochs
                                gc_started = time.monotonic()
                                collect(store, dag, retain_hours=0)
                                pruning.setdefault(orders, {})[epoch] = time.monotonic() - gc_started
                            say(f"  {dag} epoch {epoch}: {took:.1f}s")
                report(times, pruning, sizes, args.epochs, args.store)
                recovery = recover(client, clock, store, max(sizes), args.epochs)
                report_recovery(recovery, max(sizes))
            finally:
                stack.stop()
    finally:
        if s3 is not None:
            s3.stop()
    return 0


def recover(client, clock, store: StoreConfig, orders: int, last: int) -> dict[str, dict[str, float]]:  # noqa: ANN001
    """``total``'s scratch lost after an odd epoch following ``last`` (LazyCheckpoint(every=2) then
    has no durable state of it), in the LazyCheckpoint and SenderLog copies at ``orders``."""
    found: dict[str, dict[str, float]] = {}
    epoch = last + 1 if last % 2 else last + 2
    for config in ("lazy", "senderlog"):
        for e in range(last + 1, epoch):  # a normal epoch first, to end on an odd one
            run_epoch(client, clock, dag_id(config, orders), e)
    for config in ("lazy", "senderlog"):
        dag = dag_id(config, orders)
        shutil.rmtree(Path(store.scratch_uri) / dag / "total")
        say(f"{dag}: total's scratch directory deleted before epoch {epoch}")
        started = time.monotonic()
        client.trigger(dag, f"epoch-{epoch}", clock.logical_date(epoch))
        state = client.wait_for_run(dag, f"epoch-{epoch}", timeout=3600)
        rerun = 0
        reread = 0
        if config == "lazy":
            if state != "failed":
                raise RuntimeError(f"{dag} epoch {epoch} ended {state}; its lost state should have failed it")
            p = plan(dag, store, client, lost_scratch=[f"{store.scratch_uri}/{dag}/total"])
            say(p.table())
            replay(p.plan_id, store, client, progress=say, timeout=3600)
            state = client.wait_for_run(dag, f"epoch-{epoch}", timeout=3600)
            rerun = len(p.rerun_set())
            # the epochs before the failed one that total read again (the failed epoch runs either way)
            reread = sum(rows_of(store, dag, "join", range(e, e + 1)) for t, e in p.rerun_set()
                         if t == "total" and e < epoch)
        else:
            # no task instance ran again: the epoch's own job replayed join's retained epochs
            reread = rows_of(store, dag, "join", range(1, epoch))
        if state != "success":
            raise RuntimeError(f"{dag} epoch {epoch} ended {state} after its recovery")
        found[config] = {"seconds": time.monotonic() - started, "rerun": rerun, "reread": reread}
        say(f"{dag}: caught up in {found[config]['seconds']:.1f}s")
    return {**found, "epoch": epoch}  # type: ignore[dict-item]


def report(times: dict[tuple[str, int], dict[int, float]], pruning: dict[int, dict[int, float]], sizes: list[int],
           epochs: int, where: str) -> None:
    counted = range(2, epochs + 1)
    print(f"\nper-epoch time, a DAG run's start to end (median of epochs 2-{epochs}; durable store: {where})")
    print(f"{'orders/epoch':>12}  {'configuration':<24} {'median':>8} {'vs no FT':>9}  {'target':<12} "
          f"{'falkirk gc after it':>19}")
    print("-" * 92)
    verdicts = []
    for orders in sizes:
        base = times["noft", orders]
        for config in CONFIGS:
            mine = times[config, orders]
            median = statistics.median(mine[e] for e in counted)
            ratio = statistics.median(mine[e] / base[e] for e in counted)
            target, gc = "", ""
            if config == "senderlog":
                ok = ratio <= TARGET
                verdicts.append(ok)
                target = f"<= {TARGET:.2f} {'met' if ok else 'MISSED'}"
                gc = f"{statistics.median(pruning[orders][e] for e in counted):.1f}s"
            print(f"{orders:>12,}  {LABELS[config]:<24} {median:>7.1f}s {ratio:>9.2f}  {target:<12} {gc:>19}")
    print(f"\nSenderLog within {TARGET:.2f}x of no fault tolerance at {sum(verdicts)} of {len(verdicts)} sizes",
          flush=True)


def report_recovery(recovery: dict[str, dict[str, float]], orders: int) -> None:
    print(f"\nrecovery at {orders:,} orders/epoch: total's scratch state lost before epoch {int(recovery['epoch'])}")
    print(f"{'configuration':<24} {'caught up in':>12} {'task instances re-run':>22} {'input rows re-read':>19}")
    print("-" * 80)
    for config in ("lazy", "senderlog"):
        r = recovery[config]
        print(f"{LABELS[config]:<24} {r['seconds']:>11.1f}s {int(r['rerun']):>22} {int(r['reread']):>19,}")


if __name__ == "__main__":
    raise SystemExit(main())
