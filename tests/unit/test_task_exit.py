"""falkirk.plugins.task_exit: Airflow's task supervisor, in a process that has loaded the plugins,
notices its child's exit when it happens, not when its ``select`` times out.

Each probe runs in a fresh interpreter, Airflow's ``[workers] min_heartbeat_interval`` set to
4 s: the supervisor's ``select`` timeout once its child's sockets are closed. The child (started by
Airflow's own ``WatchedSubprocess.start``, forked as a task process is) closes its sockets and
exits 0.3 s later, the order in which a task process that ends can close them.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import subprocess
import sys
import textwrap

import pytest

from falkirk.plugins.task_exit import watch_exit

INTERVAL = 4

PROBE = textwrap.dedent("""
    import json, os, sys, time, uuid
    from typing import ClassVar
    from pydantic import TypeAdapter
    from airflow.sdk.execution_time.supervisor import MIN_HEARTBEAT_INTERVAL, WatchedSubprocess
    if sys.argv[1] == "plugins":
        from airflow.sdk.listener import get_listener_manager
        get_listener_manager()  # loads every plugin, as Airflow's processes do as they start

    class Child(WatchedSubprocess):
        decoder: ClassVar[TypeAdapter] = TypeAdapter(dict)

        def _handle_request(self, msg, log, req_id):
            pass

    def end():
        for fd in range(64):
            try:
                os.close(fd)
            except OSError:
                pass
        time.sleep(0.3)
        os._exit(0)

    child = Child.start(id=uuid.uuid4(), target=end)
    started = time.monotonic()
    code = None
    while code is None or child._open_sockets:
        code = child._service_subprocess(max_wait_time=MIN_HEARTBEAT_INTERVAL)  # as its monitor loop waits
    print(json.dumps({"exit code": code, "noticed after": time.monotonic() - started}))
""")


def supervise(tmp_path, mode: str) -> dict:  # noqa: ANN001
    env = {"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PATH": "/usr/bin:/bin",
           "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": str(INTERVAL)}
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfds are Linux's")
def test_a_supervisor_in_a_process_with_the_plugins_notices_its_childs_exit_when_it_happens(tmp_path) -> None:  # noqa: ANN001
    seen = supervise(tmp_path, "plugins")
    assert seen["exit code"] == 0
    assert seen["noticed after"] < INTERVAL / 2


def test_without_the_plugins_the_supervisor_notices_it_only_when_its_select_times_out(tmp_path) -> None:  # noqa: ANN001
    seen = supervise(tmp_path, "bare")
    assert seen["exit code"] == 0
    assert seen["noticed after"] >= INTERVAL - 0.1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfds are Linux's")
def test_a_watch_dropped_with_its_selector_unread_leaves_no_descriptor_open() -> None:
    def open_fds() -> int:
        """This process's open pidfds (other tests' garbage may hold or close other descriptors)."""
        def target(fd: str) -> str:
            try:
                return os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # closed while listed
                return ""
        return sum(target(fd) == "anon_inode:[pidfd]" for fd in os.listdir("/proc/self/fd"))

    gc.collect()
    before = open_fds()
    for _ in range(20):  # a worker's process supervises task after task
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        selector = selectors.DefaultSelector()
        assert watch_exit(selector, child.pid) is not None
        child.wait()
        selector.close()
        del selector
    gc.collect()
    assert open_fds() == before
