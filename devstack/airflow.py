"""A real Airflow 3 deployment on one machine, and a small client for its REST API.

:class:`AirflowStack` initialises an ``AIRFLOW_HOME`` (SQLite and the LocalExecutor by
default, the simple auth manager with fixed users) and runs the four components,
api-server, scheduler, dag-processor and triggerer, on 127.0.0.1. With a ``database_url``
(PostgreSQL), a ``broker_url`` (Redis) and ``workers``, it runs the CeleryExecutor instead,
with one ``airflow celery worker`` per :class:`Worker`: each its own process, name, queue and
scratch root, as separate machines would be. :class:`AirflowClient` drives it the way a
user's scripts would: token, trigger, wait, clear.

Example::

    with AirflowStack(home=Path(".airflow"), store=store) as stack:
        client = stack.client()
        client.wait_for_dag("falkirk_orders")
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from devstack.processes import VENV_BIN, Service, ServiceError, free_port, local_spark_env, stop_all, wait_until
from falkirk.plugins.airflow_rest import AirflowClient
from falkirk.plugins.supervised import bundle_config
from falkirk.policies.job_host import hosts_dir, stop_hosts
from falkirk.policies.store import StoreConfig

if TYPE_CHECKING:
    from devstack.servers import PostgresServer

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SQLITE_MODULE = "falkirk_devstack_sqlite"
# Fixed credentials for the embedded default; change them for anything shared.
USERS = {"admin": ("admin", "admin"), "viewer": ("viewer", "viewer")}  # name: (role, password)
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# "0" starts no triggerer: it runs only deferred tasks, and no Falkirk task defers. The test
# suite sets it (tests/conftest.py), saving each of its deployments the triggerer's start-up.
TRIGGERER_ENV = "FALKIRK_DEVSTACK_TRIGGERER"
TERMINAL_RUN_STATES = {"success", "failed"}


# A freshly migrated SQLite database per Airflow installation, copied into every new home this
# process initialises: `airflow db migrate` costs about 10 s of CPU per home, and the file it
# leaves is the same each time (the schema, its version and the default pool). The
# airflow.cfg that the first command wrote goes with it, its paths moved to the new home:
# the four components, started together, would otherwise race to write one.
_SQLITE_SCHEMAS: dict[str, tuple[Path, Path]] = {}  # venv -> (its migrated home's copy, that home)


def _keep_schema(home: Path) -> tuple[Path, Path]:
    folder = Path(tempfile.mkdtemp(prefix="falkirk-airflow-schema-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    for name in ("airflow.db", "airflow.cfg"):
        shutil.copyfile(home / name, folder / name)
    return folder, home


def _copy_schema(kept: tuple[Path, Path], home: Path) -> bool:
    folder, origin = kept
    if not (folder / "airflow.db").exists():
        return False
    shutil.copyfile(folder / "airflow.db", home / "airflow.db")
    return _copy_config(kept, home)


def _copy_config(kept: tuple[Path, Path], home: Path) -> bool:
    folder, origin = kept
    if not (folder / "airflow.cfg").exists():
        return False
    (home / "airflow.cfg").write_text((folder / "airflow.cfg").read_text().replace(str(origin), str(home)))
    return True


# The same for PostgreSQL: per server, one database migrated once (``airflow_schema``), which
# every new database on it copies (CREATE DATABASE ... TEMPLATE: a fraction of a second).
_POSTGRES_SCHEMAS: dict[tuple[str, str], tuple[Path, Path]] = {}  # (server URL, venv) -> its kept airflow.cfg
_MIGRATED_URLS: dict[str, tuple[Path, Path]] = {}  # a copy's URL -> the airflow.cfg to start its home with
SCHEMA_DATABASE = "airflow_schema"


def migrated_database(server: PostgresServer, name: str | None = None, venv_bin: Path = VENV_BIN) -> str | None:
    """A new database ``name`` on ``server`` that already holds Airflow's schema, and its URL:
    the first call on a server migrates a template database (``airflow db migrate``), every
    call copies it. An :class:`AirflowStack` on that URL skips the migration. Without ``name``,
    only the template is made (and ``None`` returned).

    Example::

        stack = AirflowStack(home=home, store=store, database_url=migrated_database(postgres, "airflow"))
    """
    key = (server.url(), str(venv_bin))
    if key not in _POSTGRES_SCHEMAS:
        server.create_database(SCHEMA_DATABASE)
        home = Path(tempfile.mkdtemp(prefix="falkirk-airflow-schema-"))
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        AirflowStack(home=home, store=StoreConfig(str(home / "store"), str(home / "scratch")), venv_bin=venv_bin,
                     database_url=server.url(SCHEMA_DATABASE)).init()
        _POSTGRES_SCHEMAS[key] = (home, home)
    if name is None:
        return None
    server.create_database(name, template=SCHEMA_DATABASE)
    url = server.url(name)
    _MIGRATED_URLS[url] = _POSTGRES_SCHEMAS[key]
    return url


@dataclass(frozen=True)
class Worker:
    """A Celery worker: ``name`` is its hostname in Airflow (``FALKIRK_WORKER``) and its queue;
    its local disk's scratch directory is ``<scratch root>/<name>``."""

    name: str


@dataclass
class AirflowStack:
    """Airflow's components with their configuration, logs and database under ``home``."""

    home: Path
    store: StoreConfig
    port: int | None = None
    dags_folder: Path = PROJECT_ROOT / "dags"
    spark_master: str = "local[2]"
    # Default: 4 task processes with the LocalExecutor; with Celery the workers' concurrency is the
    # limit, and Airflow's default 32 leaves room for the slots that messages stranded on a lost
    # worker's queue keep holding in the scheduler (until it restarts).
    parallelism: int | None = None
    extra_env: Mapping[str, str] | None = None
    plugins_folder: Path = PROJECT_ROOT / "plugins"
    venv_bin: Path = VENV_BIN  # the environment Airflow (and the package) is installed in
    database_url: str | None = None  # PostgreSQL (postgresql+psycopg2://...); default SQLite in the home
    broker_url: str | None = None  # Redis, for the CeleryExecutor
    workers: tuple[Worker, ...] = ()  # Celery workers; none: the LocalExecutor

    def __post_init__(self) -> None:
        self.home = self.home.resolve()
        self.port = self.port or free_port()
        self.services: list[Service] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def jwt_secret(self) -> str:
        """The secret that signs this Airflow's tokens: random, made once per home (0600)."""
        path = self.home / "jwt_secret"
        if not path.exists():
            self.home.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(48))
        return path.read_text().strip()

    def env(self) -> dict[str, str]:
        """The environment every component (and every task it runs) sees."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                # The repository's own plugins/: its .airflowignore leaves the plugin to the
                # package's entry points, as a project laid out like this one would run it.
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.plugins_folder),
                # The SQLite connection arguments below, importable without the checkout on the path
                # (after any directories extra_env puts first).
                "PYTHONPATH": os.pathsep.join(filter(None, [(self.extra_env or {}).get("PYTHONPATH"),
                                                            self._python_dir(), os.environ.get("PYTHONPATH")])),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__PARALLELISM": str(self.parallelism or (32 if self.workers else 4)),
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
                **self._database_env(),
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": self.base_url,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
                # Workers wait longer than the default 5 s for the API server on a loaded machine.
                "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
                "AIRFLOW__API_AUTH__JWT_SECRET": self.jwt_secret,
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, (r, _) in USERS.items()),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                # An idle scheduler loop sleeps this long (Airflow's default: 1 s) before it looks
                # for the next task to queue, several times between one task's end and the next
                # one's start: an epoch of three warm task instances took 2.9 s instead of 4.1 s,
                # for 1.7 s more of the scheduler's CPU per idle minute (4.6 s instead of 2.9 s).
                "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.25",
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
                # A task's supervisor waits on its sockets at most this long (Airflow's default: 5 s)
                # between heartbeats; when the task's sockets close before its process can be reaped,
                # that whole wait passes with the task done and its worker slot still taken. On the
                # Celery shape a quarter of the re-runs held a slot 5 s after their end, and a lost
                # worker's replay waited on them. One heartbeat a second per running task instead.
                "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
                "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": self.spark_master}),
                # The provider's DAGs (falkirk_recovery carries recoveries out) beside the DAGs
                # folder, and the user its task reaches Airflow's REST API as.
                "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundle_config()),
                "AIRFLOW_CONN_FALKIRK_AIRFLOW": json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": self.port,
                                                            "login": "admin", "password": USERS["admin"][1]}),
                # Not operator defaults: a cluster's jobs want their own JVM flags and hosts.
                **local_spark_env(self.venv_bin),
                "PYTHONUNBUFFERED": "1",
                **self.store.env(),
                **{k: v for k, v in (self.extra_env or {}).items() if k != "PYTHONPATH"},
            }
        )
        return env

    def _database_env(self) -> dict[str, str]:
        """The metadata database and the executor."""
        if self.workers and not (self.database_url and self.broker_url):
            raise ValueError("workers= needs database_url= (PostgreSQL) and broker_url= (Redis) for the CeleryExecutor")
        if self.database_url is None:
            return {
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
                # A writer waits up to a minute for SQLite's lock instead of failing after 5 s.
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": f"{SQLITE_MODULE}.CONNECT_ARGS",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": f"{SQLITE_MODULE}.CONNECT_ARGS",
            }
        env = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url,
               "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor" if self.workers else "LocalExecutor"}
        if self.workers:
            env.update({
                "AIRFLOW__CELERY__BROKER_URL": self.broker_url or "",
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + self.database_url,
                # Each worker loads Airflow's plugins once, before it forks its pool, rather than
                # each task process on its own (falkirk.plugins.celery_worker).
                "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": "falkirk.plugins.celery_worker.CELERY_CONFIG",
                # A task instance's hostname is its worker's name: two workers share this host.
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": "falkirk.policies.workers.worker_name",
                # The workers placement may send a scratch group to (plugins/placement.py).
                "FALKIRK_WORKERS": ",".join(w.name for w in self.workers),
            })
        return env

    def worker_env(self, worker: Worker) -> dict[str, str]:
        """What one Celery worker (and every task it runs) sees on top of :meth:`env`."""
        return {"FALKIRK_WORKER": worker.name, "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}

    def _python_dir(self) -> str:
        """A directory in the home holding a copy of :mod:`devstack.sqlite_connect`: Airflow
        imports it by name, and devstack is not installed (nor is the checkout on the path, whose
        editable-install metadata would show the package twice)."""
        folder = self.home / "python"
        target = folder / f"{SQLITE_MODULE}.py"
        if not target.exists():
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(__file__).with_name("sqlite_connect.py"), target)
        return str(folder)

    def init(self) -> None:
        """Create the home, the password file and the database (idempotent)."""
        self.home.mkdir(parents=True, exist_ok=True)
        passwords = {user: password for user, (_, password) in USERS.items()}
        (self.home / "passwords.json").write_text(json.dumps(passwords))
        if self.database_url is not None:
            kept = _MIGRATED_URLS.get(self.database_url)
            if kept is None or (self.home / "airflow.cfg").exists() or not _copy_config(kept, self.home):
                self.airflow("db", "migrate")
            return
        database = self.home / "airflow.db"
        if database.exists():
            self.airflow("db", "migrate")  # an existing home: bring it up to this Airflow's schema
            return
        kept = _SQLITE_SCHEMAS.get(str(self.venv_bin))
        if kept is not None and not (self.home / "airflow.cfg").exists() and _copy_schema(kept, self.home):
            return
        self.airflow("db", "migrate")
        # Write-ahead logging lets the UI and the REST API read while a task commits (persists in the file).
        with closing(sqlite3.connect(database, timeout=60)) as db:
            db.execute("PRAGMA journal_mode=WAL")
        _SQLITE_SCHEMAS.setdefault(str(self.venv_bin), _keep_schema(self.home))

    def airflow(self, *args: str, timeout: float = 600, env: Mapping[str, str | None] | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run an ``airflow`` CLI command against this home; raises with its output on failure
        (unless ``check=False``). A variable ``None`` in ``env`` is removed."""
        merged = {k: v for k, v in {**self.env(), **(env or {})}.items() if v is not None}
        proc = subprocess.run(
            [str(self.venv_bin / "airflow"), *args], env=merged, cwd=self.home,
            capture_output=True, text=True, timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise ServiceError(f"airflow {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def start(self, timeout: float = 120) -> AirflowStack:
        """Start the components and wait until the API server and the scheduler are healthy."""
        env = self.env()
        for name in self.components():
            argv = [str(self.venv_bin / "airflow"), name]
            if name == "api-server":
                argv += ["--host", "127.0.0.1", "--port", str(self.port)]
            self.services.append(Service(name, argv, env, self.home / "logs" / f"{name}.out", cwd=self.home).start())
        for worker in self.workers:
            self.services.append(self._worker_service(worker, env).start())
        wait_until("the Airflow API server and scheduler", self._healthy, timeout, self.services)
        return self

    @staticmethod
    def components() -> tuple[str, ...]:
        """The components :meth:`start` runs: all four, or without the triggerer (:data:`TRIGGERER_ENV`)."""
        if os.environ.get(TRIGGERER_ENV, "1") == "0":
            return tuple(c for c in COMPONENTS if c != "triggerer")
        return COMPONENTS

    def _worker_service(self, worker: Worker, env: Mapping[str, str]) -> Service:
        argv = [str(self.venv_bin / "airflow"), "celery", "worker", "--celery-hostname", f"{worker.name}@%h",
                "--queues", f"default,{worker.name}", "--concurrency", "2"]
        return Service(f"worker:{worker.name}", argv, {**env, **self.worker_env(worker)},
                       self.home / "logs" / f"worker-{worker.name}.out", cwd=self.home)

    def worker(self, name: str) -> Service:
        """The Celery worker process named ``name`` (to stop or kill it, as a lost machine)."""
        return self._service(f"worker:{name}")

    def kill(self, component: str) -> None:
        """SIGKILL one component (``api-server``, ``scheduler``, ...) and the processes it
        started, such as the scheduler's running task instances; the others keep running."""
        self._service(component).kill()

    def freeze(self, component: str) -> None:
        """SIGSTOP one component and the processes it started (``thaw`` goes on): a scheduler
        frozen between two of its decisions, as a stalled machine holds it."""
        self._service(component).freeze()

    def thaw(self, component: str) -> None:
        self._service(component).thaw()

    def restart(self, *components: str, timeout: float = 120) -> None:
        """Start killed or stopped components again and wait until Airflow is healthy."""
        for service in [self._service(c) for c in components]:
            service.stop()
            service.start()
        wait_until("the Airflow API server and scheduler", self._healthy, timeout, self.services)

    def _service(self, component: str) -> Service:
        found = [s for s in self.services if s.name == component]
        if not found:
            raise ValueError(f"component={component!r}: running are {[s.name for s in self.services]}")
        return found[0]

    def _healthy(self) -> bool:
        health = httpx.get(f"{self.base_url}/api/v2/monitor/health", timeout=5).json()
        return health.get("scheduler", {}).get("status") == "healthy"

    def stop(self) -> None:
        stop_all(self.services)
        self.services.clear()
        stop_hosts(hosts_dir(self.env()))  # the job hosts its tasks started

    def check_alive(self) -> None:
        for service in self.services:
            service.check_alive()

    def client(self, user: str = "admin") -> AirflowClient:
        return AirflowClient(self.base_url, user, USERS[user][1], on_poll=self.check_alive)

    def __enter__(self) -> AirflowStack:
        self.init()
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
