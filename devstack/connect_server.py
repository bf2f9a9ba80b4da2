"""A Spark Connect server whose sessions share one Python worker pool per executor.

Spark's own ``SparkConnectServer`` turns on per-session artifact isolation, and with it every
Connect session gets Python workers of its own on each executor: each job then starts a Python
daemon and imports pyarrow and delta-rs there before its first Python task (3-8 s per job and
executor on a loaded two-core machine, measured on the standalone cluster). The jobs here ship
no artifacts (the executors' interpreter has the package installed), so this server starts the
same Connect service as a driver plugin with isolation off: sessions share the executors'
``default`` Python workers, which Spark reuses from task to task.

Run by :class:`devstack.spark.SparkConnectServer` through ``spark-submit`` with
``--conf spark.plugins=org.apache.spark.sql.connect.SparkConnectPlugin``; it holds the driver
until it is terminated.
"""

from __future__ import annotations

import signal
import threading

from pyspark.sql import SparkSession


def main() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    spark = SparkSession.builder.getOrCreate()  # starts the Connect service (the driver plugin)
    print(f"Spark Connect service up on port {spark.conf.get('spark.connect.grpc.binding.port')}", flush=True)
    stop.wait()
    spark.stop()


if __name__ == "__main__":
    main()
