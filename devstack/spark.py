"""A real Spark standalone cluster on 127.0.0.1: one master and its workers, via ``spark-class``.

Example::

    with StandaloneSpark(work_dir) as cluster:
        print(cluster.master_url)          # spark://127.0.0.1:PORT
        print(cluster.completed_apps())    # names of applications that finished on it
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import httpx

from devstack.processes import SHORT_JOB_JAVA_OPTIONS, VENV_BIN, Service, free_port, local_spark_env, wait_until
from devstack.spark_packages import submit_args

# The SQL settings of every Spark this package starts: its epochs are thousands of rows, where
# compiling each query's generated code (whole stages, and single expressions too) and
# re-planning it at every shuffle cost more than they save (the reference application's epoch
# runs about 10% faster warm, far more on a JVM that has just started). A deployment with large
# epochs leaves them on. Spark's Delta reader rebuilds a table's snapshot from its log in 50
# tasks by default; a log of a few hundred commits takes one (a small table opens three times
# as fast).
SMALL_EPOCHS_SQL_CONF = {"spark.sql.shuffle.partitions": "4", "spark.sql.adaptive.enabled": "false",
                         "spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
                         "spark.databricks.delta.snapshotPartitions": "1"}
SMALL_EPOCHS_CONF = [arg for key, value in SMALL_EPOCHS_SQL_CONF.items() for arg in ("--conf", f"{key}={value}")]


def can_hide_directories() -> bool:
    """Whether this process may give a child a mount namespace of its own (``unshare -m``)."""
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class StandaloneSpark:
    """A standalone master and ``workers`` workers with ``cores`` cores each, bound to loopback;
    each worker has its own work and local directories, as separate machines would.

    ``hidden_dir``: a directory the workers (and so the executors) must not see, as on other
    hosts: where Linux mount namespaces are allowed (``unshare -m``, as root), each worker runs
    with an empty tmpfs mounted over it; :attr:`hides` says whether that took effect.
    """

    def __init__(self, work_dir: Path, cores: int = 2, memory: str = "2g", workers: int = 1,
                 hidden_dir: Path | None = None) -> None:
        self.work_dir = work_dir
        self.port, self.ui_port, self.worker_ui_port = free_port(), free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        env = {**os.environ, **local_spark_env(), "SPARK_NO_DAEMONIZE": "1"}
        spark_class = str(VENV_BIN / "spark-class")
        self.master = Service(
            "spark-master",
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", str(self.ui_port)],
            env, work_dir / "spark-master.log",
        )
        self.hides = hidden_dir is not None and can_hide_directories()
        hide = ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount -t tmpfs falkirk-other-host "$0" '
                '&& exec "$@"', str(hidden_dir)] if self.hides else []
        self.workers = [
            Service(
                f"spark-worker-{i}" if i else "spark-worker",
                [*hide, spark_class, "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1",
                 "--webui-port", str(self.worker_ui_port if i == 0 else free_port()), "--cores", str(cores),
                 "--memory", memory, "--work-dir", str(work_dir / (f"worker-{i}" if i else "worker"))],
                {**env, "SPARK_LOCAL_DIRS": str(work_dir / (f"worker-{i}" if i else "worker") / "local")},
                work_dir / (f"spark-worker-{i}.log" if i else "spark-worker.log"),
            )
            for i in range(workers)
        ]
        self.worker = self.workers[0]

    def status(self) -> dict:
        """The master's JSON status (workers, running and completed applications)."""
        return httpx.get(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5).json()

    def completed_apps(self) -> list[str]:
        return [app["name"] for app in self.status().get("completedapps", [])]

    def start(self, timeout: float = 90) -> StandaloneSpark:
        self.master.start()
        wait_until("the Spark master", lambda: self.status().get("status") == "ALIVE", timeout, [self.master])
        for worker in self.workers:
            worker.start()
        wait_until("the Spark workers to register", lambda: self.status().get("aliveworkers", 0) >= len(self.workers),
                   timeout, [self.master, *self.workers])
        return self

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.master.stop()

    def __enter__(self) -> StandaloneSpark:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spark_submit(
    application: Path,
    args: list[str],
    env: dict[str, str],
    master: str = "local[2]",
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run one job with the venv's ``spark-submit``, as the operator would; its output (the
    JVM's and the Python driver's, interleaved) is in the result's ``stdout``."""
    import subprocess

    full_env = {**os.environ, **local_spark_env(), **env}
    argv = [str(VENV_BIN / "spark-submit"), "--master", master, "--conf", "spark.ui.enabled=false",
            *SMALL_EPOCHS_CONF, *submit_args(), str(application), *args]
    return subprocess.run(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


class SparkConnectServer:
    """A Spark Connect server (``local[cores]``, or on a cluster's ``master``) on 127.0.0.1: jobs
    connect as clients over gRPC.

    One JVM serves every task, so a task starts in about as long as Python takes to import
    PySpark. Its executors' Python workers run this venv's interpreter, which imports
    ``spark_jobs`` for the functions the runtime ships to them. It loads the JVM packages of
    :mod:`devstack.spark_packages` (Delta, S3A) with Delta's extension and catalog, then ``conf``:
    a store's :meth:`~falkirk.policies.store.config.StoreConfig.spark_conf` lets it read that
    store's tables over ``s3a://``.

    Example::

        with SparkConnectServer(work_dir) as server:
            print(server.url)   # sc://127.0.0.1:PORT
    """

    def __init__(self, work_dir: Path, cores: int = 2, venv_bin: Path = VENV_BIN, master: str | None = None,
                 conf: Mapping[str, str] | None = None, packages: bool = True, delta_extension: bool = True) -> None:
        self.work_dir = work_dir
        self.cores = cores
        self.master = master
        self.venv_bin = venv_bin
        self.conf = dict(conf or {})
        # Without them (``make bench-spark-packages``): no JVM packages, or no Delta SQL extension and catalog.
        self.packages, self.delta_extension = packages, delta_extension
        self._new_service()

    def _new_service(self) -> None:
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        venv_bin, master = self.venv_bin, self.master
        # The JVM flags of short jobs (C1 only, serial GC) suit this long-lived server too: its
        # queries are small and many, each planned anew, so the optimizing compiler (C2) kept
        # recompiling for the whole session; and a Metaspace threshold above Spark's classes spares
        # the full collections it otherwise triggers while starting. With the expressions
        # interpreted (SMALL_EPOCHS_SQL_CONF), the server used about 15% less CPU over the same
        # tests (tests/integration/test_steps.py), in the same wall time.
        env = {**os.environ, **local_spark_env(venv_bin),
               "SPARK_SUBMIT_OPTS": f"{SHORT_JOB_JAVA_OPTIONS} -XX:MetaspaceSize=256m"}
        # On a cluster the executors are JVMs of their own: the same flags.
        executors = ["--conf", f"spark.executor.extraJavaOptions={SHORT_JOB_JAVA_OPTIONS}"] if master else []
        # The Connect service as a driver plugin, its sessions sharing the executors' Python
        # workers (devstack/connect_server.py says why).
        self.service = Service(
            "spark-connect",
            [str(venv_bin / "spark-submit"), "--master", master or f"local[{self.cores}]", "--name", "falkirk-connect",
             "--conf", "spark.plugins=org.apache.spark.sql.connect.SparkConnectPlugin",
             "--conf", "spark.sql.artifact.isolation.enabled=false",
             "--conf", f"spark.connect.grpc.binding.port={self.port}",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", "spark.ui.enabled=false", *SMALL_EPOCHS_CONF, *executors,
             *(submit_args(self.conf, self.delta_extension) if self.packages else []),
             str(Path(__file__).resolve().parent / "connect_server.py")],
            env, self.work_dir / "spark-connect.log",
        )

    def airflow_env(self) -> dict[str, str]:
        """The environment that makes Airflow's ``spark_default`` a connection to this server."""
        return {"AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1",
                                                         "port": self.port})}

    def submit(self, application: Path, args: list[str], env: dict[str, str],
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run one job as a client of this server, as the operator does on a ``spark_connect``
        connection; its output is in the result's ``stdout``."""
        import subprocess

        return subprocess.run([str(self.venv_bin / "python"), str(application), *args],
                              env={**os.environ, **env, "SPARK_REMOTE": self.url}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)

    def _up(self) -> bool:
        # The port answering is not enough: a free port can be taken by another process's
        # connection before the server binds it. connect_server.py says when its service is up.
        try:
            return f"Spark Connect service up on port {self.port}" in self.service.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return False

    def start(self, timeout: float = 120, attempts: int = 3) -> SparkConnectServer:
        for attempt in range(1, attempts + 1):
            self.service.start()
            try:
                wait_until("the Spark Connect server", self._up, timeout, [self.service])
                return self
            except Exception:
                lost_port = "BindException" in self.service.log_tail(200)
                self.service.stop()
                if not lost_port or attempt == attempts:
                    raise
                self._new_service()  # the port went to someone else: another one
        raise AssertionError("unreachable: the last attempt returns or raises")

    def stop(self) -> None:
        self.service.stop()

    def __enter__(self) -> SparkConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
