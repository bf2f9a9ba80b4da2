"""Small helpers for starting real services as subprocesses and waiting on them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

VENV_BIN = Path(sys.executable).parent


SHORT_JOB_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""JVM flags that start short jobs with less CPU: the C1 compiler only, and the serial GC."""


def local_spark_env(venv_bin: Path = VENV_BIN) -> dict[str, str]:
    """Environment for Spark processes on this machine: the venv's Python and tools, loopback,
    and JVM flags that start short jobs with less CPU (C1-only JIT, serial GC)."""
    return {
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": str(venv_bin / "python"),
        "PYSPARK_DRIVER_PYTHON": str(venv_bin / "python"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_SUBMIT_OPTS": SHORT_JOB_JAVA_OPTIONS,
    }


class ServiceError(RuntimeError):
    """A service did not start or stopped early; the message carries the end of its log."""


# Every port free_port has handed out in this process.
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process has not
    handed out before. The OS may give a port just released again, and two services of one
    stack given the same port cannot both start (an API server lost its port to the
    scheduler's log server that way)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


class Service:
    """One long-running subprocess with its output in a log file, stopped as a process group."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path | None = None):
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False  # on purpose (a fault drill): not a service that died

    def start(self) -> Service:
        self.killed = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        return self

    def check_alive(self) -> None:
        if self.proc is not None and not self.killed and self.proc.poll() is not None:
            raise ServiceError(f"{self.name} exited with status {self.proc.returncode}; end of {self.log_path}:\n"
                               + self.log_tail())

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the whole process group at once, as a lost machine would (fault drills)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.killed = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.proc.wait(30)

    def freeze(self) -> None:
        """SIGSTOP the process group: alive, holding its connections, deciding nothing (a
        process stalled by its machine) until :meth:`thaw`."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT the process group :meth:`freeze` stopped."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout`` (see :func:`stop_all`)."""
        stop_all([self], timeout)


def stop_all(services: Sequence[Service], timeout: float = 20.0) -> None:
    """Stop ``services`` together: SIGTERM to each at once, then wait for them all within one
    ``timeout``, then SIGKILL what is left. Stopping them one by one would add their shutdowns up."""
    running = [s for s in services if s.proc is not None and s.proc.poll() is None]
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for service in running:
            try:
                os.killpg(service.proc.pid, sig)  # type: ignore[union-attr]
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        for service in running:
            try:
                service.proc.wait(max(0.0, deadline - time.monotonic()))  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                pass
        running = [s for s in running if s.proc.poll() is None]  # type: ignore[union-attr]
        if not running:
            return
    # Children that left a group (e.g. task runners) are ended by the group kill above.


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    services: Sequence[Service] = (),
    interval: float = 0.5,
) -> None:
    """Poll ``check`` until it is true; fail early if one of ``services`` died."""
    deadline = time.monotonic() + timeout
    while True:
        for service in services:
            service.check_alive()
        try:
            if check():
                return
        except (httpx.HTTPError, OSError, ValueError):  # ValueError: a half-started server's non-JSON answer
            pass
        if time.monotonic() > deadline:
            tails = "".join(f"\n--- {s.name} ({s.log_path}) ---\n{s.log_tail()}" for s in services)
            raise ServiceError(f"timed out after {timeout:.0f}s waiting for {what}{tails}")
        time.sleep(interval)
