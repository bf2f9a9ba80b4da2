"""Ledger read benchmark: a DAG of 100 tasks x 1,000 epochs (100,000 ledger rows).

Reports the median of several runs for: reading the DAG's ledger as an Arrow table
(what the control plane queries), as ``LedgerEntry`` objects, one task's ``find`` +
``latest`` (each a scan of its own), and what a job reads before it runs (one snapshot of the
DAG, then three lookups in it); each as a ratio to reading the same rows from one plain
Parquet file with pyarrow (same run).

    make bench-ledger
    .venv/bin/python -m benchmarks.ledger_bench --tasks 100 --epochs 1000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake

from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot, OutputRef, SCHEMA


def median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    root = tempfile.mkdtemp(prefix="falkirk-ledger-bench-")
    store = StoreConfig(f"{root}/store", f"{root}/scratch")
    now = datetime.now(timezone.utc)
    rows = [
        LedgerEntry(dag_id="big", task_id=f"t{t:03d}", epoch=e, regime="eager_checkpoint", run_id=f"epoch-{e}",
                    try_number=1, state_uri=f"{root}/state", state_tier="durable", state_version=e, state_rows=5,
                    outputs=(OutputRef("output", f"{root}/out", "durable", e, 5),), committed_at=now).to_row()
        for e in range(1, args.epochs + 1) for t in range(args.tasks)
    ]
    print(f"writing {len(rows):,} ledger rows ...", flush=True)
    for i in range(0, len(rows), 10_000):  # as ten large appends; jobs append one row each
        write_deltalake(store.ledger_uri, pa.Table.from_pylist(rows[i:i + 10_000], schema=SCHEMA), mode="append")
    plain = f"{root}/plain.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), plain)

    ledger = Ledger(store)
    middle = args.epochs // 2
    baseline = median_seconds(lambda: pq.read_table(plain), args.repeat)
    results = [
        ("read(dag) -> Arrow table", median_seconds(lambda: ledger.read("big"), args.repeat)),
        ("entries(dag) -> LedgerEntry objects", median_seconds(lambda: ledger.entries("big"), args.repeat)),
        ("find + latest (one task)", median_seconds(
            lambda: (ledger.find("big", "t042", middle), ledger.latest("big", "t042", middle)), args.repeat)),
        ("a job's reads: snapshot, then find x3", median_seconds(lambda: _job_reads(ledger, middle), args.repeat)),
    ]
    print(f"\n{'operation':<38} {'median':>10} {'vs plain Parquet read':>22}")
    print("-" * 72)
    print(f"{'plain Parquet read (baseline)':<38} {baseline * 1e3:>8.1f}ms {1.0:>22.2f}")
    for name, seconds in results:
        print(f"{name:<38} {seconds * 1e3:>8.1f}ms {seconds / baseline:>22.2f}")
    return 0


def _job_reads(ledger: Ledger, epoch: int) -> None:
    """What a job asks before it runs: its own epoch, its input's, its previous checkpoint, from one
    snapshot of the DAG (:class:`~falkirk.policies.store.ledger.LedgerSnapshot`)."""
    snapshot = LedgerSnapshot(ledger, "big")
    snapshot.find("t042", epoch), snapshot.find("t041", epoch), snapshot.find("t042", epoch - 1)


if __name__ == "__main__":
    raise SystemExit(main())
