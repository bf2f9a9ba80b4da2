"""Ledger read benchmark: a DAG of 20 tasks x 4 partitions x 1,000 epochs (80,000 ledger rows).

Reports the median of several runs, on the local disk and on the S3-compatible server
(``moto_server``, started here), for: reading the DAG's ledger as an Arrow table (what the
control plane queries), one task's ``find`` + ``latest`` (each a scan of its own), a
:class:`~falkirk.policies.store.ledger.LedgerSnapshot` (the one read a task instance makes: the
DAG's rows and rollbacks), what a job reads before it runs (that snapshot, then three lookups in
it), and a held snapshot brought up to date after one more commit (only that commit is read).
Each is also given as a ratio to reading the same rows from one plain Parquet file with pyarrow
(same run, local disk). Rows that build all 80,000 ``LedgerEntry`` objects are local only.

    make bench-ledger
    .venv/bin/python -m benchmarks.ledger_bench --tasks 20 --partitions 4 --epochs 1000 --no-s3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake

from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot, OutputRef, SCHEMA

DAG = "big"
TARGETS = {  # operation -> (local, S3) target in seconds, from the project's goals
    "snapshot (a task instance's one read)": (0.3, 2.0),
    "held snapshot brought up to date after 1 commit": (0.05, None),
}


def median_seconds(fn: Callable[[], object], repeat: int, setup: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(repeat):
        arg = setup() if setup else None
        started = time.perf_counter()
        fn() if setup is None else fn(arg)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def ledger_rows(root: str, tasks: int, partitions: int, epochs: int) -> list[dict]:
    now = datetime.now(timezone.utc)
    return [
        LedgerEntry(dag_id=DAG, task_id=f"t{t:03d}", epoch=e, regime="eager_checkpoint", run_id=f"epoch-{e}",
                    try_number=1, map_index=p, state_uri=f"{root}/state", state_tier="durable", state_version=e,
                    state_rows=5, outputs=(OutputRef("output", f"{root}/out", "durable", e, 5),),
                    committed_at=now).to_row()
        for e in range(1, epochs + 1) for t in range(tasks) for p in range(partitions)
    ]


def measure(store: StoreConfig, rows: list[dict], args: argparse.Namespace, local: bool) -> dict[str, float]:
    """Write the ledger into ``store`` and time the reads."""
    options = store.options_for(store.ledger_uri)
    for i in range(0, len(rows), 10_000):  # as eight large appends (what compaction leaves); jobs append one row each
        write_deltalake(store.ledger_uri, pa.Table.from_pylist(rows[i:i + 10_000], schema=SCHEMA), mode="append",
                        storage_options=options)
    ledger = Ledger(store)
    ledger.invalidations.record([LedgerEntry.from_row(rows[0])], "plan-bench")  # the rollbacks table exists
    middle = args.epochs // 2
    task, part = f"t{args.tasks // 2:03d}", args.partitions - 1
    results = {
        "read(dag) -> Arrow table": median_seconds(lambda: ledger.read(DAG), args.repeat),
        "find + latest (one partition)": median_seconds(
            lambda: (ledger.find(DAG, task, middle, part), ledger.latest(DAG, task, middle, part)), args.repeat),
        "snapshot (a task instance's one read)": median_seconds(lambda: LedgerSnapshot(ledger, DAG), args.repeat),
        "a job's reads: snapshot, then find x3": median_seconds(
            lambda: _job_reads(ledger, task, part, middle), args.repeat),
    }
    extra = iter(range(args.epochs + 1, args.epochs + 1 + args.repeat))

    def held_and_one_more_commit() -> LedgerSnapshot:
        held = LedgerSnapshot(ledger, DAG)
        ledger.append(LedgerEntry(dag_id=DAG, task_id=task, epoch=next(extra), regime="eager_checkpoint", run_id="epoch-x", try_number=1, map_index=part))
        return held

    def bring_up_to_date(held: LedgerSnapshot) -> None:
        held.refresh()
        assert held.scans == 2 and held.refreshes == 1, (held.scans, held.refreshes)  # the tail, not a scan

    results["held snapshot brought up to date after 1 commit"] = median_seconds(
        bring_up_to_date, args.repeat, setup=held_and_one_more_commit)
    if local:
        results["entries(dag) -> 80,000 LedgerEntry objects"] = median_seconds(lambda: ledger.entries(DAG),
                                                                            max(1, args.repeat // 2))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-s3", dest="s3", action="store_false", help="skip the S3-compatible server's column")
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="falkirk-ledger-bench-"))
    rows = ledger_rows(str(root), args.tasks, args.partitions, args.epochs)
    print(f"a ledger of {len(rows):,} rows ({args.tasks} tasks x {args.partitions} partitions x {args.epochs} "
          f"epochs), median of {args.repeat} runs", flush=True)
    plain = root / "plain.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), plain)
    baseline = median_seconds(lambda: pq.read_table(plain), args.repeat)
    local = measure(StoreConfig(str(root / "store"), str(root / "scratch")), rows, args, local=True)
    remote: dict[str, float] = {}
    if args.s3:
        from devstack.s3 import MotoS3

        with MotoS3(root / "moto") as s3:
            s3.create_bucket("bench")
            remote = measure(StoreConfig("s3://bench/store", str(root / "scratch-s3"), s3.storage_options()),
                             rows, args, local=False)

    def cell(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1e3:.1f}ms"

    print(f"\n{'operation':<48} {'local':>10} {'vs Parquet':>10} {'S3 (moto)':>10}  target local / S3")
    print("-" * 102)
    print(f"{'plain Parquet read, local (baseline)':<48} {cell(baseline):>10} {1.0:>10.2f} {'':>10}")
    failed = []
    for name, seconds in local.items():
        targets = TARGETS.get(name, (None, None))
        shown = " / ".join("-" if t is None else f"< {t:g}s" for t in targets) if name in TARGETS else ""
        print(f"{name:<48} {cell(seconds):>10} {seconds / baseline:>10.2f} {cell(remote.get(name)):>10}  {shown}")
        for target, got, where in ((targets[0], seconds, "local"), (targets[1], remote.get(name), "S3")):
            if target is not None and got is not None and got >= target:
                failed.append(f"{name} on {where}: {got:.3f}s, target < {target:g}s")
    print("\n" + ("\n".join("MISSED " + f for f in failed) if failed else "every target met"))
    return 1 if failed else 0


def _job_reads(ledger: Ledger, task: str, part: int, epoch: int) -> None:
    """What a job asks before it runs: its own epoch, its input's, its previous checkpoint, from one
    snapshot of the DAG (:class:`~falkirk.policies.store.ledger.LedgerSnapshot`)."""
    snapshot = LedgerSnapshot(ledger, DAG)
    snapshot.find(task, epoch, part), snapshot.find("t001", epoch, part), snapshot.find(task, epoch - 1, part)


if __name__ == "__main__":
    raise SystemExit(main())
