"""The distributed shape on one machine: every part its own process, every worker its own disk.

* Airflow's metadata in PostgreSQL, the CeleryExecutor on Redis, and two Celery workers,
  ``worker-a`` and ``worker-b``: each its own process, queue, hostname in Airflow and
  scratch directory (its "local disk", ``<scratch root>/<worker>``);
* a Spark standalone master with two workers, each with its own work and local directories,
  and (where mount namespaces are allowed) blind to the Celery workers' scratch disks, as
  executors on other hosts are;
* the durable store on the S3-compatible server (``moto_server``), and the reference
  application's query statistics in PostgreSQL (database ``queries``, ``FALKIRK_QUERY_DB``);
* with ``spark_connect=True``, a Spark Connect server whose executors run on that cluster:
  tasks are Connect clients (seconds to start) instead of ``spark-submit`` drivers.

Everything listens on 127.0.0.1 and is started and stopped here. ``make cluster-tools``
installs Debian's ``postgresql`` and ``redis-server``; the rest comes with the package.

The servers (:class:`ClusterServers`: PostgreSQL, Redis, ``moto_server``, Spark and Spark
Connect) can outlive one shape: several shapes in turn, each with its own Airflow, workers,
databases, Redis database, bucket and disks, share one set (the test suite does, as a team's
staging servers outlive the deployments tried on them). Losing a worker loses nothing of them.

Example::

    with Cluster(work_dir) as cluster:
        client = cluster.airflow.client()
        client.wait_for_dag("falkirk_orders")
        cluster.airflow.worker("worker-b").kill()   # a lost machine
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from devstack.airflow import PROJECT_ROOT, AirflowStack, Worker, migrated_database
from devstack.s3 import MotoS3
from devstack.s3_outage import S3Outage
from devstack.servers import PostgresServer, RedisServer
from devstack.spark import SparkConnectServer, StandaloneSpark
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.config import s3a_conf

WORKERS = ("worker-a", "worker-b")
BUCKET = "falkirk"


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


class ClusterServers:
    """What a shape's Airflow runs beside, started once: PostgreSQL, Redis, ``moto_server``, a
    Spark standalone cluster blind to ``<root>/scratch`` and, with ``spark_connect``, a Spark
    Connect server on it. :meth:`new_shape` numbers the shapes that share them. ``postgres``: a
    server already running (left running at the end) instead of one of their own."""

    def __init__(self, root: Path, spark_workers: int = 2, spark_connect: bool = True,
                 postgres: PostgresServer | None = None) -> None:
        self.root = Path(root).resolve()
        self._given_postgres = postgres
        self.spark_workers = spark_workers
        self.spark_connect = spark_connect
        self.connect: SparkConnectServer | None = None
        self._shapes = itertools.count()
        self._stack = ExitStack()

    @property
    def scratch(self) -> Path:
        """The directory the Spark workers cannot see: every shape's worker disks are in it."""
        return self._dir("scratch")

    def start(self) -> ClusterServers:
        try:
            self.postgres = self._given_postgres or PostgresServer(self.root / "postgres")
            self.redis = RedisServer(self.root / "redis")
            self.s3 = MotoS3(self._dir("s3"))
            # The Spark workers stand for other hosts: the Celery workers' disks are not theirs to see.
            self.spark = StandaloneSpark(self._dir("spark"), cores=1, memory="1g", workers=self.spark_workers,
                                         hidden_dir=self.scratch)
            if self.spark_connect:  # one driver on the cluster; each task a light client of it
                self.connect = SparkConnectServer(self._dir("connect"), master=self.spark.master_url,
                                                  conf=s3a_conf(self.s3.storage_options()))
            if self._given_postgres is None:
                self._stack.enter_context(self.postgres)
            # Airflow's schema migration (half a minute) runs once, while the other servers start;
            # each shape's database is a copy of it.
            with ThreadPoolExecutor(1) as pool:
                migrated = pool.submit(migrated_database, self.postgres)
                for server in (self.redis, self.s3, self.spark, self.connect):
                    if server is not None:
                        self._stack.enter_context(server)
                migrated.result()
        except BaseException:
            self._stack.close()
            raise
        return self

    def new_shape(self) -> int:
        """A number no other shape on these servers has (0 first): its databases, Redis
        database, bucket and disks are named by it."""
        return next(self._shapes)

    def _dir(self, name: str) -> Path:
        return _made(self.root / name)

    def stop(self) -> None:
        self._stack.close()

    def __enter__(self) -> ClusterServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Cluster:
    """A Celery-run Airflow with its workers and their disks, on :class:`ClusterServers`: its own
    (started and stopped with it), or ``servers`` shared with other shapes (left running)."""

    def __init__(self, root: Path, dags_folder: Path = PROJECT_ROOT / "dags", workers: tuple[str, ...] = WORKERS,
                 spark_workers: int = 2, extra_env: Mapping[str, str] | None = None,
                 spark_connect: bool = False, servers: ClusterServers | None = None, s3_front: bool = False) -> None:
        self.root = Path(root).resolve()
        # With s3_front, the shape reaches S3 through a front a fault drill can freeze or take
        # down (devstack.s3_outage.S3Outage, at self.front), every object kept.
        self.s3_front = s3_front
        self.front: S3Outage | None = None
        self.dags_folder = dags_folder
        self.worker_names = workers
        self.extra_env = dict(extra_env or {})
        if servers is not None and spark_connect and servers.connect is None:
            raise ValueError("spark_connect=True needs servers started with spark_connect=True")
        self.spark_connect = spark_connect
        self._own = servers is None
        self.servers = servers or ClusterServers(self.root, spark_workers=spark_workers, spark_connect=spark_connect)
        self._stack = ExitStack()

    def scratch_root(self, worker: str) -> Path:
        """``worker``'s local disk: its scratch tier."""
        return Path(self.store.worker_scratch(worker))

    def start(self) -> Cluster:
        try:
            if self._own:
                self._stack.enter_context(self.servers)
            servers = self.servers
            self.postgres, self.redis, self.s3, self.spark = servers.postgres, servers.redis, servers.s3, servers.spark
            self.connect = servers.connect if self.spark_connect else None
            n = servers.new_shape()
            # A shape on shared servers names its databases by its number: another user of the same
            # PostgreSQL may have a "queries" of its own.
            suffix = "" if self._own else f"_shape{n}"
            # The reference application's query statistics go to PostgreSQL; its clickstream's
            # acknowledgement point (the source system's own state) to a file every worker reaches.
            self.postgres.create_database(f"queries{suffix}")
            self.query_db = self.postgres.url(f"queries{suffix}", driver="postgresql")
            extra = {"FALKIRK_QUERY_DB": self.query_db,
                     "FALKIRK_CLICKSTREAM_ACKS": str(self._dir("sources") / "{dag_id}.json"), **self.extra_env}
            if self.connect is not None:  # a server with Delta's jars and the store's s3a settings
                extra = {**self.connect.airflow_env(), "FALKIRK_SPARK_READS_STORE": "true", **extra}
            bucket = f"{BUCKET}-{n}" if n else BUCKET
            self.s3.create_bucket(bucket)
            # The store as the scheduler and the CLI see it; each worker keeps its scratch tables in
            # <scratch>/<its name>/ (FALKIRK_WORKER), standing for its own local disk.
            scratch = servers.scratch / f"shape-{n}" if n else servers.scratch
            if self.s3_front:
                self.front = self._stack.enter_context(S3Outage(self.s3.endpoint, self._dir("s3-front")))
            s3 = self.front or self.s3
            self.store = StoreConfig(f"s3://{bucket}/store", str(scratch), s3.storage_options())
            self.airflow = AirflowStack(
                home=self.root / "airflow", store=self.store, dags_folder=self.dags_folder,
                spark_master=self.spark.master_url,
                database_url=migrated_database(self.postgres, f"airflow{suffix}"),
                broker_url=self.redis.database_url(n), extra_env=extra,
                workers=tuple(Worker(name) for name in self.worker_names))
            self.airflow.init()
            self._stack.callback(self.airflow.stop)  # what started, even if the start fails half-way
            self.airflow.start(timeout=180)
        except BaseException:
            self._stack.close()
            raise
        return self

    def _dir(self, name: str) -> Path:
        return _made(self.root / name)

    def stop(self) -> None:
        self._stack.close()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
