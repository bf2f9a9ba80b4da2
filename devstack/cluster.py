"""The distributed shape on one machine: every part its own process, every worker its own disk.

* Airflow's metadata in PostgreSQL, the CeleryExecutor on Redis, and two Celery workers,
  ``worker-a`` and ``worker-b``: each its own process, queue, hostname in Airflow and
  scratch directory (its "local disk", ``<root>/scratch/<worker>``);
* a Spark standalone master with two workers, each with its own work and local directories,
  and (where mount namespaces are allowed) blind to the Celery workers' scratch disks, as
  executors on other hosts are;
* the durable store on the S3-compatible server (``moto_server``), and the reference
  application's query statistics in PostgreSQL (database ``queries``, ``FALKIRK_QUERY_DB``);
* with ``spark_connect=True``, a Spark Connect server whose executors run on that cluster:
  tasks are Connect clients (seconds to start) instead of ``spark-submit`` drivers.

Everything listens on 127.0.0.1 and is started and stopped here. ``make cluster-tools``
installs Debian's ``postgresql`` and ``redis-server``; the rest comes with the package.

Example::

    with Cluster(work_dir) as cluster:
        client = cluster.airflow.client()
        client.wait_for_dag("falkirk_orders")
        cluster.airflow.worker("worker-b").kill()   # a lost machine
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Mapping

from devstack.airflow import PROJECT_ROOT, AirflowStack, Worker
from devstack.s3 import MotoS3
from devstack.servers import PostgresServer, RedisServer
from devstack.spark import SparkConnectServer, StandaloneSpark
from falkirk.policies.store import StoreConfig

WORKERS = ("worker-a", "worker-b")
BUCKET = "falkirk"


class Cluster:
    """PostgreSQL, Redis, ``moto_server``, a Spark standalone cluster and a Celery-run Airflow."""

    def __init__(self, root: Path, dags_folder: Path = PROJECT_ROOT / "dags", workers: tuple[str, ...] = WORKERS,
                 spark_workers: int = 2, extra_env: Mapping[str, str] | None = None,
                 spark_connect: bool = False) -> None:
        self.root = Path(root).resolve()
        self.dags_folder = dags_folder
        self.worker_names = workers
        self.spark_workers = spark_workers
        self.extra_env = dict(extra_env or {})
        self.spark_connect = spark_connect
        self.connect: SparkConnectServer | None = None
        self._stack = ExitStack()

    def scratch_root(self, worker: str) -> Path:
        """``worker``'s local disk: its scratch tier."""
        return Path(self.store.worker_scratch(worker))

    def start(self) -> "Cluster":
        try:
            self.postgres = self._stack.enter_context(PostgresServer(self.root / "postgres"))
            self.postgres.create_database("airflow")
            # The reference application's query statistics go to PostgreSQL; its clickstream's
            # acknowledgement point (the source system's own state) to a file every worker reaches.
            self.postgres.create_database("queries")
            self.query_db = self.postgres.url("queries", driver="postgresql")
            self.redis = RedisServer(self.root / "redis")
            self.s3 = MotoS3(self._dir("s3"))
            # The Spark workers stand for other hosts: the Celery workers' disks are not theirs to see.
            self.spark = StandaloneSpark(self._dir("spark"), cores=1, memory="1g", workers=self.spark_workers,
                                         hidden_dir=self._dir("scratch"))
            extra = {"FALKIRK_QUERY_DB": self.query_db,
                     "FALKIRK_CLICKSTREAM_ACKS": str(self._dir("sources") / "{dag_id}.json"), **self.extra_env}
            if self.spark_connect:  # one driver on the cluster; each task a light client of it
                self.connect = SparkConnectServer(self._dir("connect"), master=self.spark.master_url)
                extra = {**self.connect.airflow_env(), **extra}
            # The store as the scheduler and the CLI see it; each worker keeps its scratch tables in
            # <scratch>/<its name>/ (FALKIRK_WORKER), standing for its own local disk.
            self.store = StoreConfig(f"s3://{BUCKET}/store", str(self.root / "scratch"), self.s3.storage_options())
            self.airflow = AirflowStack(
                home=self.root / "airflow", store=self.store, dags_folder=self.dags_folder,
                spark_master=self.spark.master_url, database_url=self.postgres.url("airflow"),
                broker_url=self.redis.url, extra_env=extra,
                workers=tuple(Worker(name) for name in self.worker_names))
            # Airflow's schema migration (half a minute) runs while the other servers start.
            with ThreadPoolExecutor(1) as pool:
                migrated = pool.submit(self.airflow.init)
                for server in (self.redis, self.s3, self.spark, self.connect):
                    if server is not None:
                        self._stack.enter_context(server)
                self.s3.create_bucket(BUCKET)
                migrated.result()
            self._stack.callback(self.airflow.stop)  # what started, even if the start fails half-way
            self.airflow.start(timeout=180)
        except BaseException:
            self._stack.close()
            raise
        return self

    def _dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def stop(self) -> None:
        self._stack.close()

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
