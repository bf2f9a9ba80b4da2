"""Commit latency at a transactional sink: marker pairs against committing once per epoch.

A non-deterministic producer (:mod:`falkirk.spark_jobs.travellers`, ``draw``: ``--chunks``
chunks of about ``--keys / 2`` sampled rows per epoch, streamed to the sink as drawn, each
chunk's determinants saved after it is sent) feeds a SQLite sink (``deliver``), both Spark
Connect clients of one local server, each a process of its own. Per row, latency is the time
from the producer sending it to the sink's transaction that holds it committing.

* **pairs**: a fast and a slow traveller per chunk; the sink commits in transactions of at
  most ``--capacity`` rows as soon as a chunk's ft arrives;
* **once per epoch**: one slow traveller after the last chunk (every chunk's determinants
  saved); the sink commits the epoch in one transaction, as the reference application's SQL
  sink does.

Epochs alternate between the two. The table gives median and 95th-percentile latencies and
the ratios of pairs to once per epoch.

    make bench-travellers
    .venv/bin/python -m benchmarks.travellers_bench --chunks 8 --keys 400 --batch 20 --capacity 64 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from devstack.spark import SparkConnectServer


def epoch(root: Path, remote: str, number: int, markers: str, capacity: int, chunks: int, keys: int,
          batch: int) -> list[float]:
    """Run one epoch with ``markers``; the latency of every row it delivered, in seconds."""
    env = {**os.environ, "SPARK_REMOTE": remote, "FALKIRK_TRAVELLER_CHUNKS": str(chunks),
           "FALKIRK_TRAVELLER_KEYS": str(keys), "FALKIRK_EDGE_BATCH": str(batch)}
    base = [sys.executable, "-m", "falkirk.spark_jobs.travellers"]
    where = ["--root", str(root), "--epoch", str(number), "--markers", markers]
    sink = subprocess.Popen(base + ["deliver", *where, "--capacity", str(capacity)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(base + ["draw", *where], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    if sink.wait(timeout=600) != 0:
        raise RuntimeError(f"epoch {number} ({markers}): the sink exited {sink.returncode}")
    with sqlite3.connect(root / "travellers" / "sink.db") as db:
        return [committed - sent for sent, committed in db.execute(
            "SELECT d.sent_at, t.committed_at FROM delivered d JOIN transactions t USING (txn) WHERE d.epoch = ?",
            (number,))]


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--keys", type=int, default=400, help="keys per chunk (about half are drawn)")
    parser.add_argument("--batch", type=int, default=20, help="rows per in-band commit of the producer")
    parser.add_argument("--capacity", type=int, default=64, help="the largest transaction with marker pairs")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    latencies: dict[str, list[float]] = {"pairs": [], "epoch": []}
    with tempfile.TemporaryDirectory(prefix="bench-travellers-") as tmp:
        root = Path(tmp)
        with SparkConnectServer(root / "spark") as server:
            number = 0
            for r in range(args.rounds):
                for markers, capacity in (("pairs", args.capacity), ("epoch", 1_000_000)):
                    number += 1
                    found = epoch(root, server.url, number, markers, capacity, args.chunks, args.keys, args.batch)
                    latencies[markers] += found
                    print(f"round {r + 1}/{args.rounds} {markers}: {len(found)} rows, median "
                          f"{statistics.median(found):.2f}s", flush=True)
    pairs, once = latencies["pairs"], latencies["epoch"]
    print()
    print(f"{args.chunks} chunks of ~{args.keys // 2} rows per epoch, {args.rounds} epochs each, "
          f"transactions of at most {args.capacity} rows with marker pairs")
    print(f"{'latency, row sent -> committed':<34} {'marker pairs':>13} {'once per epoch':>15} {'ratio':>7}")
    print(f"{'median':<34} {statistics.median(pairs):>12.2f}s {statistics.median(once):>14.2f}s "
          f"{statistics.median(pairs) / statistics.median(once):>7.2f}")
    print(f"{'95th percentile':<34} {p95(pairs):>12.2f}s {p95(once):>14.2f}s {p95(pairs) / p95(once):>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
