"""Debian's PostgreSQL and Redis, each started on 127.0.0.1 under a directory of its own.

The distributed shape (:mod:`devstack.cluster`) keeps Airflow's metadata and the reference
application's query statistics in PostgreSQL and runs the CeleryExecutor on Redis.
``make cluster-tools`` installs both (``postgresql``, ``redis-server``).

PostgreSQL refuses to run as root: started by root, ``initdb`` and the server run as the
``postgres`` user the package creates, in a directory of that user's under the system's
temporary directory (a test's own directories are root's alone); it is removed on stop.

Example::

    with PostgresServer(work_dir / "pg") as pg, RedisServer(work_dir / "redis") as redis:
        pg.create_database("airflow")
        print(pg.url("airflow"), redis.url)
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from devstack.processes import Service, ServiceError, free_port, wait_until

PG_USER = "falkirk"
PG_PASSWORD = "falkirk"
REDIS_DATABASES = 64


def _pg_bin(name: str) -> str:
    """A PostgreSQL server program from Debian's package (its version directory, newest first)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    if not found:
        raise ServiceError(f"PostgreSQL's {name} is not installed: run `make cluster-tools` (Debian's postgresql)")
    return found[0]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


class PostgresServer:
    """One PostgreSQL cluster (``initdb``) on 127.0.0.1:``port``, with a password user ``falkirk``."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = Path(root).resolve()
        if os.geteuid() == 0:  # the postgres user's own directory, which it can reach
            self.root.mkdir(parents=True, exist_ok=True)
            self.home = Path(tempfile.mkdtemp(prefix="falkirk-postgres-"))
            os.chown(self.home, pwd.getpwnam("postgres").pw_uid, pwd.getpwnam("postgres").pw_gid)
        else:
            self.home = self.root
        self.data = self.home / "data"
        self.port = port or free_port()
        self.service: Service | None = None

    def _as_owner(self) -> list[str]:
        """The command prefix that runs a server program as a user PostgreSQL accepts."""
        return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def start(self) -> PostgresServer:
        self.home.mkdir(parents=True, exist_ok=True)
        if not (self.data / "PG_VERSION").exists():
            pwfile = self.home / "pwfile"
            pwfile.write_text(PG_PASSWORD)
            if os.geteuid() == 0:
                os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
            done = subprocess.run([*self._as_owner(), _pg_bin("initdb"), "-D", str(self.data), "-U", PG_USER,
                                   "--pwfile", str(pwfile), "-A", "scram-sha-256", "-E", "UTF8"],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise ServiceError(f"initdb failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        self.service = Service("postgres", [*self._as_owner(), _pg_bin("postgres"), "-D", str(self.data),
                                            "-p", str(self.port), "-k", str(self.home), "-c", "listen_addresses=127.0.0.1",
                                            "-c", "max_connections=200", "-c", "fsync=off"],
                               env={"PATH": os.environ.get("PATH", "")}, log_path=self.root / "postgres.log")
        self.service.start()
        wait_until("PostgreSQL", lambda: _listening(self.port), timeout=60, services=[self.service])
        return self

    def url(self, database: str = "postgres", driver: str = "postgresql+psycopg2") -> str:
        return f"{driver}://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, template: str | None = None) -> None:
        """Create ``name`` unless it exists; with ``template``, as a copy of that database (which
        nobody may be connected to meanwhile)."""
        import psycopg2

        db = psycopg2.connect(self.url(driver="postgresql"))
        db.autocommit = True  # CREATE DATABASE cannot run inside a transaction
        try:
            with db.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        finally:
            db.close()

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
        if self.home != self.root:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisServer:
    """``redis-server`` on 127.0.0.1:``port``, nothing persisted."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = Path(root).resolve()
        self.port = port or free_port()
        self.service: Service | None = None

    @property
    def url(self) -> str:
        return self.database_url(0)

    def database_url(self, number: int) -> str:
        """The URL of one of the server's numbered databases (0-63): deployments sharing the
        server each take their own, and see none of the others' queues."""
        if not 0 <= number < REDIS_DATABASES:
            raise ValueError(f"number={number}: Redis here has databases 0-{REDIS_DATABASES - 1}")
        return f"redis://127.0.0.1:{self.port}/{number}"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServiceError("redis-server is not installed: run `make cluster-tools` (Debian's redis-server)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.service = Service("redis", [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                         "--appendonly", "no", "--dir", str(self.root),
                                         "--databases", str(REDIS_DATABASES)],
                               env={"PATH": os.environ.get("PATH", "")}, log_path=self.root / "redis.log")
        self.service.start()
        wait_until("Redis", lambda: _listening(self.port), timeout=30, services=[self.service])
        return self

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
