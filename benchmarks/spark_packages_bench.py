"""What Spark's JVM packages cost a job: the same Spark work on a Spark Connect server started as
devstack starts it (Delta, S3A and the AWS SDK on its classpath, Delta's SQL extension and
catalog: :mod:`devstack.spark_packages`) and on one started without them.

The work is one epoch of the reference application's ``rank`` (``falkirk.spark_jobs.figure1.rank``,
its ``compute`` as the runtime calls it): the epoch's events and the previous state read from
Parquet files, three PageRank iterations over cached frames, the outputs and the state collected.
A third server has the packages without Delta's SQL extension and catalog. The servers run side by
side, idle while another works: each round runs one epoch on each, each server first in turn,
after warm-up rounds on each, so a machine's drift weighs on all alike::

    make bench-spark-packages
    .venv/bin/python -m benchmarks.spark_packages_bench --rounds 24

It prints each server's median and mean seconds per epoch, and the ratios of the medians to the
server without packages.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from devstack.spark import SparkConnectServer

EVENTS, USERS, STATE_EPOCHS = 5_000, 300, 6


class _Epoch:
    """The part of the runtime's ``EpochContext`` that ``rank.compute`` uses."""

    def __init__(self, spark: Any, events: Any, state: Any) -> None:
        self.spark, self._events, self._state, self._cached = spark, events, state, []

    def read_input(self, _name: str) -> Any:
        return self._events

    def previous_state(self) -> Any:
        return self._state

    def cache(self, frame: Any) -> Any:
        self._cached.append(frame.persist())
        return frame

    def release(self) -> None:
        while self._cached:
            self._cached.pop().unpersist()


def one_epoch(spark: Any, events: Path, state: Path | None) -> tuple[float, pa.Table]:
    """Seconds of one epoch of ``rank`` over the files given, and the state it computed."""
    from falkirk.spark_jobs.figure1 import rank

    began = time.perf_counter()
    epoch = _Epoch(spark, spark.read.parquet(str(events)), spark.read.parquet(str(state)) if state else None)
    result = rank.compute(epoch)
    result.outputs["output"].toArrow()
    new_state = result.state.toArrow()
    epoch.release()
    return time.perf_counter() - began, new_state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=16, help="measured epochs per server (default 16)")
    parser.add_argument("--warm", type=int, default=3, help="unmeasured epochs per server first (default 3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="falkirk-bench-packages-") as scratch:
        return _run(Path(scratch), args.rounds, args.warm)


def _run(root: Path, rounds: int, warm: int) -> int:
    """The bench in ``root``, which holds its files and the servers' directories."""
    from pyspark.sql import SparkSession

    from falkirk.spark_jobs.figure1.data import ITEMS

    rng = np.random.default_rng(7)
    events = root / "events.parquet"
    pq.write_table(pa.table({"user": rng.integers(0, USERS, EVENTS), "item": rng.integers(0, ITEMS, EVENTS),
                             "clicks": rng.integers(0, 3, EVENTS)}), events)
    servers = {"Delta's packages, extension and catalog (devstack's)": (True, True),
               "Delta's packages only": (True, False), "no JVM packages": (False, False)}
    started: dict[str, SparkConnectServer] = {}
    try:
        for label, (packages, extension) in servers.items():
            work = root / f"server-{len(started)}"
            work.mkdir()
            started[label] = SparkConnectServer(work, packages=packages, delta_extension=extension).start()
        sessions = {label: SparkSession.builder.remote(s.url).create() for label, s in started.items()}
        state = root / "state.parquet"
        first = next(iter(sessions.values()))
        for epoch in range(STATE_EPOCHS):  # a state of a few epochs, the same for every measured round
            _, table = one_epoch(first, events, state if epoch else None)
            pq.write_table(table, state)
        for session in sessions.values():
            for _ in range(warm):
                one_epoch(session, events, state)
        seconds: dict[str, list[float]] = {label: [] for label in sessions}
        labels = list(sessions)
        for r in range(rounds):
            for label in labels[r % len(labels):] + labels[:r % len(labels)]:  # each server first in turn
                seconds[label].append(one_epoch(sessions[label], events, state)[0])
                print(".", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        for server in started.values():
            server.stop()
    width = max(len(label) for label in seconds)
    print(f"rank, one epoch ({pq.read_metadata(state).num_rows:,} state rows, {EVENTS:,} events), "
          f"{rounds} rounds alternating")
    print(f"{'server':<{width}}  median (s)  mean (s)")
    for label, values in seconds.items():
        print(f"{label:<{width}}  {statistics.median(values):10.3f}  {statistics.mean(values):8.3f}")
    medians = [statistics.median(v) for v in seconds.values()]
    print(f"against no JVM packages: devstack's {medians[0] / medians[2]:.2f}, packages only {medians[1] / medians[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
