"""The job host's client side: run a job file in a warm interpreter on this worker.

A Spark Connect job started as a fresh ``python job.py`` spends seconds importing PySpark's
client, pandas, pyarrow and delta-rs before it does any work, on every task instance. A
*job host* (:mod:`falkirk.spark_jobs.job_host`) is one long-lived process per worker that has
imported them once; for each job it forks a child, which runs the job file as ``__main__``
with the task's command line, environment and working directory, and streams its output
back. The child is a fresh process (its own session id, its own gRPC channel, its own
delta-rs runtime): nothing of one job is left for the next.

This module finds, starts and talks to the host. The first job on a worker starts it (under a
lock, so two concurrent tasks start one host) and pays the imports once; it exits after
``FALKIRK_JOB_HOST_IDLE_SECONDS`` without a job (default 900), when its socket is removed, or
when the code it preloaded changes on disk. ``FALKIRK_JOB_HOST=off`` runs every job in a
fresh interpreter instead.

The wire protocol, over a Unix socket: the client sends one JSON line ``{"argv", "env",
"cwd"}``; the host answers with the job's output as it is written, in which two control
lines, each starting with a NUL byte, frame the run: ``\\0falkirk-pid N`` (the job's process,
which the client may kill) and ``\\0falkirk-exit N`` (its exit status, negative for a
signal). A client that disconnects gets its job killed.

>>> host = JobHost(Path("/tmp/hosts"), {"FALKIRK_WORKER": "worker-a"})
>>> host.socket_path.parent, host.socket_path.suffix
(PosixPath('/tmp/hosts'), '.sock')
>>> host.socket_path != JobHost(Path("/tmp/hosts"), {"FALKIRK_WORKER": "worker-b"}).socket_path
True
>>> parse_control(b"\\0falkirk-exit -9")
('exit', -9)
>>> parse_control(b"an ordinary line") is None
True
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

HOST_ENV = "FALKIRK_JOB_HOST"
HOST_DIR_ENV = "FALKIRK_JOB_HOST_DIR"
IDLE_ENV = "FALKIRK_JOB_HOST_IDLE_SECONDS"
DEFAULT_IDLE_SECONDS = 900.0
CONTROL = b"\0falkirk-"
HOST_MODULE = "falkirk.spark_jobs.job_host"
# AF_UNIX paths are limited to 108 bytes on Linux.
_MAX_SOCKET_PATH = 100
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]


class JobHostError(RuntimeError):
    """The job host could not be started or reached; the message says where its log is."""


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether jobs run on a job host (``FALKIRK_JOB_HOST`` is not ``off``/``0``/``false``).

    >>> enabled({}), enabled({"FALKIRK_JOB_HOST": "off"})
    (True, False)
    """
    env = os.environ if environ is None else environ
    return env.get(HOST_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def idle_seconds(environ: Mapping[str, str] | None = None) -> float:
    """How long a host waits without a job before it exits.

    >>> idle_seconds({}), idle_seconds({"FALKIRK_JOB_HOST_IDLE_SECONDS": "30"})
    (900.0, 30.0)
    """
    env = os.environ if environ is None else environ
    raw = env.get(IDLE_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_IDLE_SECONDS
    except ValueError:
        raise JobHostError(f"{IDLE_ENV}={raw!r}: give a number of seconds, e.g. {IDLE_ENV}=900") from None
    if value <= 0:
        raise JobHostError(f"{IDLE_ENV}={raw!r}: give a positive number of seconds")
    return value


def hosts_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where a worker's job hosts keep their sockets: ``FALKIRK_JOB_HOST_DIR``, else
    ``$AIRFLOW_HOME/falkirk/job-hosts``, else the temporary directory.

    >>> hosts_dir({"AIRFLOW_HOME": "/opt/airflow"})
    PosixPath('/opt/airflow/falkirk/job-hosts')
    """
    env = os.environ if environ is None else environ
    if env.get(HOST_DIR_ENV):
        return Path(env[HOST_DIR_ENV])
    if env.get("AIRFLOW_HOME"):
        return Path(env["AIRFLOW_HOME"]) / "falkirk" / "job-hosts"
    return Path(tempfile.gettempdir()) / f"falkirk-job-hosts-{os.getuid()}"


def import_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that Airflow and the job's modules read when imported: ``AIRFLOW_HOME``, each
    ``AIRFLOW__SECTION__KEY`` and ``PYTHONPATH`` (not a task's own ``AIRFLOW_CTX_*``, which change
    from task to task). A host that preloads such modules serves only jobs with these values.

    >>> import_env({"AIRFLOW_HOME": "/a", "AIRFLOW_CTX_TASK_ID": "t", "AIRFLOW__CORE__X": "1", "HOME": "/h"})
    {'AIRFLOW_HOME': '/a', 'AIRFLOW__CORE__X': '1'}
    """
    return {k: v for k, v in sorted(environ.items())
            if k in ("AIRFLOW_HOME", "AIRFLOW_CONFIG", "PYTHONPATH") or k.startswith("AIRFLOW__")}


def code_stamp() -> str:
    """A digest of the package's code as it is on disk: a host started before a change serves no
    job after it (a new one starts beside it, and the old one exits once idle)."""
    digest = hashlib.sha1()
    for folder in ("policies", "spark_jobs", "plugins"):
        for path in sorted((_PACKAGE_ROOT / folder).rglob("*.py")):
            try:
                stat = path.stat()
            except OSError:
                continue
            digest.update(f"{path}:{stat.st_mtime_ns}:{stat.st_size};".encode())
    return digest.hexdigest()[:16]


def parse_control(line: bytes) -> tuple[str, int] | None:
    """A control line's ``(kind, number)``; ``None`` for a line of the job's own output."""
    at = line.find(CONTROL)
    if at < 0:
        return None
    kind, _, number = line[at + len(CONTROL):].strip().partition(b" ")
    try:
        return kind.decode(), int(number)
    except ValueError:
        return None


class JobHost:
    """The job host for the worker this process runs on, as the task's environment names it.

    One host serves the tasks of one interpreter, worker (``FALKIRK_WORKER``) and code version;
    jobs with other environments share it, since each child takes the job's own environment.
    ``preload`` names modules the host imports besides the libraries (the TaskFlow form's
    Airflow, which its DAG file imports): such a host is one per :func:`import_env` too.

    >>> plain = JobHost(Path("/tmp/hosts"), {"AIRFLOW__CORE__X": "1"}, stamp="s").socket_path
    >>> plain == JobHost(Path("/tmp/hosts"), {"AIRFLOW__CORE__X": "2"}, stamp="s").socket_path
    True
    >>> warm = JobHost(Path("/tmp/hosts"), {"AIRFLOW__CORE__X": "1"}, stamp="s", preload=("airflow.sdk",))
    >>> warm.socket_path == JobHost(Path("/tmp/hosts"), {"AIRFLOW__CORE__X": "2"}, stamp="s",
    ...                             preload=("airflow.sdk",)).socket_path, warm.socket_path == plain
    (False, False)
    """

    def __init__(self, directory: Path | None = None, environ: Mapping[str, str] | None = None,
                 python: str = sys.executable, stamp: str | None = None, preload: Sequence[str] = ()) -> None:
        env = dict(os.environ if environ is None else environ)
        self.directory = directory or hosts_dir(env)
        self.python = python
        self.idle = idle_seconds(env)
        self.preload = tuple(preload)
        stamp = code_stamp() if stamp is None else stamp
        identity = "|".join([python, env.get("FALKIRK_WORKER", ""), str(_PACKAGE_ROOT), stamp])
        if self.preload:
            identity += "|" + json.dumps([self.preload, import_env(env)])
        name = "host-" + hashlib.sha1(identity.encode()).hexdigest()[:12]
        path = self.directory / f"{name}.sock"
        if len(str(path)) > _MAX_SOCKET_PATH:  # keep the files where asked, the socket where it fits
            path = Path(tempfile.gettempdir()) / f"falkirk-{hashlib.sha1(str(path).encode()).hexdigest()[:16]}.sock"
        self.socket_path = path
        self.log_path = self.directory / f"{name}.log"
        self.pid_path = self.directory / f"{name}.pid"

    def connect(self, timeout: float = 5.0) -> socket.socket | None:
        """A connection to a running host; ``None`` when none answers."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(self.socket_path))
        except OSError:
            sock.close()
            return None
        sock.settimeout(None)
        return sock

    def ensure_started(self, env: Mapping[str, str], timeout: float = 180.0) -> socket.socket:
        """A connection to the host, starting it first if none runs (one starter at a time)."""
        sock = self.connect()
        if sock is not None:
            return sock
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / f"{self.socket_path.stem}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            sock = self.connect()
            if sock is not None:
                return sock
            with open(self.log_path, "ab") as log:
                proc = subprocess.Popen(
                    [self.python, "-m", HOST_MODULE, "--socket", str(self.socket_path), "--pid-file",
                     str(self.pid_path), "--idle-seconds", str(self.idle),
                     *(arg for module in self.preload for arg in ("--preload", module))],
                    env=dict(env), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,  # outlives the task that started it
                )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                sock = self.connect()
                if sock is not None:
                    return sock
                if proc.poll() is not None:
                    break
                time.sleep(0.1)
            if proc.poll() is None:
                proc.kill()
            raise JobHostError(f"the job host did not start within {timeout:.0f}s; its log is {self.log_path}"
                               + _tail(self.log_path))

    def run(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
            on_line: Callable[[str], None] = print, on_started: Callable[[int], None] | None = None) -> int:
        """Run ``argv`` (a job file and its arguments) on the host; returns its exit status
        (negative: killed by that signal). Each line it prints goes to ``on_line``."""
        sock = self.ensure_started(env)
        with sock:
            request = {"argv": list(argv), "env": dict(env), "cwd": cwd or os.getcwd()}
            sock.sendall(json.dumps(request).encode() + b"\n")
            with sock.makefile("rb") as stream:
                for line in stream:
                    control = parse_control(line)
                    if control is None:
                        on_line(line.decode("utf-8", "replace").rstrip("\n"))
                        continue
                    before = line[:line.find(CONTROL)]
                    if before.strip():  # the job's last output had no newline
                        on_line(before.decode("utf-8", "replace").rstrip("\n"))
                    kind, number = control
                    if kind == "pid" and on_started is not None:
                        on_started(number)
                    elif kind == "exit":
                        return number
        raise JobHostError(f"the job host closed the connection without the job's exit status; its log is "
                           f"{self.log_path}" + _tail(self.log_path))


def stop_hosts(directory: Path) -> int:
    """Stop every job host whose pid file is in ``directory`` (a deployment shutting down);
    returns how many were signalled."""
    stopped = 0
    for pid_file in sorted(directory.glob("*.pid")) if directory.is_dir() else []:
        try:
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
            stopped += 1
        except (OSError, ValueError, IndexError):
            pass
        pid_file.unlink(missing_ok=True)
    return stopped


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return ("; its last lines:\n" + "\n".join(text)) if text else ""
