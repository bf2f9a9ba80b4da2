"""Reading a Falkirk input: the runtime's path against Spark's own Delta reader, in one run.

A job reads one epoch of an upstream task's Delta table. The runtime's path
(:func:`falkirk.spark_jobs.delta_sink.read_frame` without ``spark_reads``) reads the Delta log
with delta-rs in the job and then the epoch's files: with Spark's Parquet reader for a local
table; on S3, with pyarrow in the job (an epoch under 16 MB) or in the executors
(``mapInArrow``). Spark's Delta reader
(``spark.read.format("delta").load(...).where(epoch = e)``, over ``s3a://`` on S3) reads both
in the Spark server, pruning to the epoch's partition.

The table is written as the runtime writes an output (one commit per epoch, partitioned by
epoch) with ``--epochs`` epochs of ``rows`` rows each, at the size of ``make bench-regimes``'s
per-epoch output (20,000 items) and at ten times it; the durable store on ``moto_server`` and
on the local disk. Each path reads the last epoch into Spark's no-op sink (every column
materialized), alternately, ``--repeats`` times after a warm-up; the table gives the medians,
Spark's reader's time as a ratio to the runtime's path, and the default: ``read_frame`` as a job
runs it where the Spark server reaches the store (``FALKIRK_SPARK_READS_STORE=true``, as here),
which picks Spark's Delta reader for an epoch on S3 of ``SPARK_READ_MIN_BYTES`` or more
(:func:`~falkirk.spark_jobs.delta_sink.read_path`), with its time as a ratio to the faster path's.

A second table follows an epoch read in the job's process (the scratch tier, a small epoch on
S3) into the queries after the read: an iterative job (``rank``) joins its state into each
iteration and persists the result. ``on_the_executors`` hands such rows to the executors once
(above ``INLINE_MAX_ROWS``); the table times the read and ``--queries`` such iterations both ways,
handed over and left inline in each query, alternately, with the ratio.

    make bench-read
    .venv/bin/python -m benchmarks.read_bench --sizes 20000,50000,200000 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from devstack.s3 import MotoS3
from devstack.spark import SparkConnectServer
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import CommitKey, commit_epoch, open_table
from falkirk.policies.store.config import spark_uri
from falkirk.spark_jobs.delta_sink import epoch_bytes, on_the_executors, read_frame, read_path

DAG, TASK = "bench", "aggregate"


def epoch_rows(epoch: int, rows: int) -> pa.Table:
    """An aggregate's output: one row per item, as ``make bench-regimes``'s jobs write them."""
    items = pa.array([f"item-{i:08d}" for i in range(rows)])
    return pa.table({"item": items, "total": pa.array(range(epoch, epoch + rows), pa.int64()),
                     "clicks": pa.array([(i * 7 + epoch) % 1000 for i in range(rows)], pa.int64()),
                     "share": pa.array([i / rows for i in range(rows)], pa.float64()),
                     "epoch": pa.array([epoch] * rows, pa.int64())})


def write_table(store: StoreConfig, rows: int, epochs: int) -> tuple[str, CommitKey]:
    from falkirk.policies.regimes import Tier

    uri = store.table_uri(Tier.DURABLE, DAG, f"{TASK}-{rows}", "output")
    keys = [CommitKey(dag_id=DAG, task_id=f"{TASK}-{rows}", epoch=epoch) for epoch in range(1, epochs + 1)]
    for key in keys:
        commit_epoch(uri, epoch_rows(key.epoch, rows), key, store.options_for(uri))
    return uri, keys[-1]


def _timed(read: Callable[[], object]) -> float:
    started = time.perf_counter()
    read().write.format("noop").mode("overwrite").save()  # type: ignore[attr-defined]
    return time.perf_counter() - started


def measure(spark, store: StoreConfig, rows: int, epochs: int, repeats: int) -> dict[str, float | str]:  # noqa: ANN001
    uri, key = write_table(store, rows, epochs)
    options = store.options_for(uri)
    size = epoch_bytes(open_table(uri, options), key.epoch)
    paths = {
        "runtime": lambda: read_frame(spark, uri, key, rows, options),
        "spark delta": lambda: spark.read.format("delta").load(spark_uri(uri)).where(f"epoch = {key.epoch}")
        .drop("epoch"),
        # read_frame as a job runs it where the Spark server reaches the store (FALKIRK_SPARK_READS_STORE)
        "default": lambda: read_frame(spark, uri, key, rows, options, spark_reads=True),
    }
    for read in paths.values():  # warm-up: the JVM's classes, the S3 clients
        _timed(read)
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, read in paths.items():
            times[name].append(_timed(read))
    chosen = read_path(uri, size, spark_reads=True)
    return {"bytes": size, "chosen": chosen.value, **{name: statistics.median(values) for name, values in times.items()}}


def measure_reuse(spark, rows: int, queries: int, repeats: int) -> dict[str, float]:  # noqa: ANN001
    """Seconds to take ``rows`` read on the driver into Spark and run ``queries`` iterations
    over them (a join with the rows, persisted, counted): handed to the executors, and inline."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    table = epoch_rows(1, rows).drop_columns(["epoch"])
    schema = from_arrow_schema(table.schema)

    def run(inline_max_rows: int) -> float:
        started = time.perf_counter()
        state = on_the_executors(spark, table, schema, inline_max_rows=inline_max_rows)
        frame, kept = state.select("item", "total"), []
        for i in range(queries):
            step = state.select("item", F.col("clicks").alias("c"))
            frame = frame.join(step, "item").select("item", (F.col("total") + F.col("c")).alias("total")).persist()
            kept.append(frame)
            frame.count()
        elapsed = time.perf_counter() - started
        for frame in kept:
            frame.unpersist()
        return elapsed

    modes = {"handed over": 0, "inline": rows + 1}
    for limit in modes.values():
        run(limit)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(repeats):
        for name, limit in modes.items():
            times[name].append(run(limit))
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20000,50000,200000", help="rows per epoch, comma-separated")
    parser.add_argument("--epochs", type=int, default=8, help="epochs in the table (default 8)")
    parser.add_argument("--repeats", type=int, default=5, help="timed reads per path (default 5)")
    parser.add_argument("--queries", default="1,4", help="iterations after a read on the driver, comma-separated")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    from pyspark.sql import SparkSession

    results, reuse = [], []
    with tempfile.TemporaryDirectory(prefix="falkirk-read-bench-") as tmp:
        root = Path(tmp)
        with MotoS3(root) as s3:
            s3.create_bucket("falkirk-bench")
            stores = {"s3 (moto_server)": StoreConfig("s3://falkirk-bench/store", str(root / "scratch"),
                                                      s3.storage_options()),
                      "local": StoreConfig(str(root / "durable"), str(root / "scratch"))}
            with SparkConnectServer(root / "spark", conf=stores["s3 (moto_server)"].spark_conf()) as server:
                spark = SparkSession.builder.remote(server.url).getOrCreate()
                try:
                    for where, store in stores.items():
                        for rows in sizes:
                            print(f"{where}, {rows:,} rows an epoch ...", flush=True)
                            results.append((where, rows, measure(spark, store, rows, args.epochs, args.repeats)))
                    for rows in sizes:
                        for queries in (int(q) for q in args.queries.split(",")):
                            print(f"read on the driver, {rows:,} rows, {queries} queries after ...", flush=True)
                            reuse.append((rows, queries, measure_reuse(spark, rows, queries, args.repeats)))
                finally:
                    spark.stop()
    print()
    print("| store | rows an epoch | MB | runtime's path | Spark's Delta reader | Spark / runtime | default reads with "
          "| default / faster |")
    print("|---|---|---|---|---|---|---|---|")
    for where, rows, times in results:
        runtime, delta, default = (float(times[k]) for k in ("runtime", "spark delta", "default"))
        print(f"| {where} | {rows:,} | {int(times['bytes']) / 1e6:.1f} | {runtime:.3f} s | {delta:.3f} s | "
              f"{delta / runtime:.2f} | {times['chosen']} | {default / min(runtime, delta):.2f} |")
    print()
    print("| rows read on the driver | queries after | handed to the executors | inline in each query "
          "| handed over / inline |")
    print("|---|---|---|---|---|")
    for rows, queries, times in reuse:
        print(f"| {rows:,} | {queries} | {times['handed over']:.3f} s | {times['inline']:.3f} s | "
              f"{times['handed over'] / times['inline']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
