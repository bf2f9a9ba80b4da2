"""The job host: one warm interpreter per worker that forks a child for each Spark Connect job.

It imports PySpark's Connect client, pandas, pyarrow, delta-rs and the job runtime once, then
serves jobs over a Unix socket (the protocol and the client are in
:mod:`falkirk.policies.job_host`). For each job it forks: the child starts its own session
(new process group), takes the job's environment, working directory and command line, runs
the job file as ``__main__`` exactly as ``python job.py ARGS`` would, and exits with its status.
Its output goes straight to the client's socket.

Fork safety: the host is single-threaded and never opens a gRPC channel, a Spark session or a
Delta table itself, so a child starts with none of them half-made (gRPC's and delta-rs's
runtimes are created lazily, in the child). Modules that read the environment when imported
are not preloaded: :data:`PRELOAD` holds only libraries and the runtime, and the job's own
modules are imported by the child.

Run by :class:`falkirk.policies.job_host.JobHost`; by hand::

    python -m falkirk.spark_jobs.job_host --socket /tmp/h.sock --pid-file /tmp/h.pid
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

# Imported once by the host; every job's child inherits them. Nothing here reads a job's
# environment when imported.
PRELOAD = (
    "pyarrow", "pyarrow.parquet", "pandas", "deltalake", "grpc",
    "pyspark.sql.connect.session", "pyspark.sql.functions", "pyspark.sql.types", "pyspark.sql.window",
    "falkirk.spark_jobs.runtime", "falkirk.spark_jobs.delta_sink",
)
_REQUEST_TIMEOUT = 30.0


def preload(extra: tuple[str, ...] = ()) -> None:
    """Import :data:`PRELOAD`, then ``extra``: the modules a kind of job shares (``--preload``).
    A host with ``extra`` is started with the environment those modules read when imported, and
    serves only jobs with that environment (the client names hosts after it)."""
    for name in (*PRELOAD, *extra):
        importlib.import_module(name)


def serve(socket_path: Path, pid_file: Path | None, idle_seconds: float) -> None:
    """Accept jobs until ``idle_seconds`` pass without one, or the socket file is removed."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    socket_path.unlink(missing_ok=True)  # a dead host's; the starter holds the lock
    listener.bind(str(socket_path))
    listener.listen(64)
    inode = socket_path.stat().st_ino
    if pid_file is not None:
        pid_file.write_text(f"{os.getpid()}\n")
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    jobs: dict[int, socket.socket] = {}  # child pid -> its client's connection
    last = time.monotonic()
    print(f"job host {os.getpid()} serving on {socket_path}", flush=True)
    while not stopping:
        for key, _ in selector.select(timeout=0.2):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                pid = _start_job(conn, listener, jobs)
                if pid is None:
                    conn.close()
                    continue
                jobs[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
                last = time.monotonic()
            else:  # a client speaks only to hang up: its task is gone, so is its job
                conn = key.fileobj  # type: ignore[assignment]  # registered as a socket above
                try:
                    data = conn.recv(64)
                except OSError:
                    data = b""
                if not data:
                    selector.unregister(conn)
                    _kill(key.data)
        for pid, status in _reaped():
            client = jobs.pop(pid, None)  # the connection of the job that ended
            if client is None:
                continue
            try:
                selector.unregister(client)
            except (KeyError, ValueError):
                pass
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            try:
                client.sendall(b"\0falkirk-exit %d\n" % code)
            except OSError:
                pass
            client.close()
            last = time.monotonic()
        if not jobs and time.monotonic() - last > idle_seconds:
            print(f"job host {os.getpid()}: idle for {idle_seconds:.0f}s, exiting", flush=True)
            break
        if not _still_ours(socket_path, inode):
            print(f"job host {os.getpid()}: {socket_path} was removed, exiting", flush=True)
            break
    for pid in list(jobs):
        _kill(pid)
    if _still_ours(socket_path, inode):
        socket_path.unlink(missing_ok=True)
    if pid_file is not None and pid_file.exists() and pid_file.read_text().strip() == str(os.getpid()):
        pid_file.unlink(missing_ok=True)


def _start_job(conn: socket.socket, listener: socket.socket, jobs: dict[int, socket.socket]) -> int | None:
    """Read one request and fork its job; the child never returns from here."""
    conn.settimeout(_REQUEST_TIMEOUT)
    try:
        with conn.makefile("rb") as stream:
            request = json.loads(stream.readline() or b"null")
        argv, env, cwd = request["argv"], request["env"], request["cwd"]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print(f"job host: a malformed request ({exc!r}); closing it", flush=True)
        return None
    conn.settimeout(None)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    try:
        listener.close()
        for other in jobs.values():
            other.close()
        code = _run_child(conn, argv, env, cwd)
    except BaseException:  # noqa: BLE001 - a child must never go back into the host's loop
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _run_child(conn: socket.socket, argv: list[str], env: dict[str, str], cwd: str) -> int:
    os.setsid()  # its own process group: a kill reaches whatever it starts
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(conn.fileno(), 1)
    os.dup2(conn.fileno(), 2)
    conn.close()
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="replace",
                                  line_buffering=True, write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="replace",
                                  line_buffering=True, write_through=True)
    os.write(1, b"\0falkirk-pid %d\n" % os.getpid())
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if "numpy" in sys.modules:  # numpy's global generator is not reseeded at fork, unlike `random`
        sys.modules["numpy"].random.seed()
    application = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, str(Path(application).resolve().parent))  # as `python job.py` does
    try:
        runpy.run_path(application, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    return 0


def _reaped() -> list[tuple[int, int]]:
    done: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done.append((pid, status))


def _kill(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
            return
        except (ProcessLookupError, PermissionError):
            continue


def _still_ours(path: Path, inode: int) -> bool:
    try:
        return path.stat().st_ino == inode
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve Spark Connect jobs from a warm interpreter.")
    parser.add_argument("--socket", required=True, type=Path, help="the Unix socket to listen on")
    parser.add_argument("--pid-file", type=Path, default=None)
    parser.add_argument("--idle-seconds", type=float, default=900.0)
    parser.add_argument("--preload", action="append", default=[], metavar="MODULE",
                        help="a module to import besides the libraries (repeatable)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    preload(tuple(args.preload))
    print(f"job host {os.getpid()}: preloaded {len(PRELOAD) + len(args.preload)} modules in "
          f"{time.monotonic() - started:.1f}s", flush=True)
    serve(args.socket, args.pid_file, args.idle_seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
