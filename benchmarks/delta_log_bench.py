"""Delta log benchmark: what ``delta.checkpointInterval`` costs a table's opens and appends.

A table gets one small append per epoch, as a task's output or state table does, on
``moto_server``. For each interval it prints the median time to open the table after 1, 5, 9,
10, 15, 19 and 20 commits (an open reads the last checkpoint and every commit file since), and
the median append, as ratios to Delta's default interval of 100 measured in the same run.

    .venv/bin/python -m benchmarks.delta_log_bench   (make bench-delta-log)
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from devstack.s3 import MotoS3

INTERVALS = ("100", "10", "5", "2")
PROBES = (1, 5, 9, 10, 15, 19, 20)


def _median_ms(action, times: int) -> float:  # noqa: ANN001
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def main() -> int:
    rows = pa.table({"epoch": pa.array([0] * 50, pa.int64()), "v": list(range(50))})
    results: dict[str, tuple[dict[int, float], float]] = {}
    with MotoS3(Path(tempfile.mkdtemp(prefix="delta-log-bench-"))) as s3:
        s3.create_bucket("delta-log-bench")
        options = s3.storage_options()
        for interval in INTERVALS:
            uri = f"s3://delta-log-bench/interval-{interval}"
            opens = {}
            for version in range(max(PROBES) + 1):
                write_deltalake(uri, rows, mode="append", storage_options=options, partition_by=["epoch"],
                                configuration={"delta.checkpointInterval": interval} if version == 0 else None)
                if version in PROBES:
                    opens[version] = _median_ms(lambda: DeltaTable(uri, storage_options=options), 15)
            append = _median_ms(lambda: write_deltalake(uri, rows, mode="append", storage_options=options), 10)
            results[interval] = (opens, append)
    base_opens, base_append = results["100"]
    print("| checkpoint interval | " + " | ".join(f"open after v{v}, ms" for v in PROBES)
          + " | mean open vs 100 | append, ms | append vs 100 |")
    print("|---" * (len(PROBES) + 4) + "|")
    for interval, (opens, append) in results.items():
        ratio = statistics.mean(opens.values()) / statistics.mean(base_opens.values())
        print(f"| {interval} | " + " | ".join(f"{opens[v]:.0f}" for v in PROBES)
              + f" | {ratio:.2f} | {append:.0f} | {append / base_append:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
