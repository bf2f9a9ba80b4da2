"""The job host (falkirk.spark_jobs.job_host) as real processes: a warm interpreter that forks a
child per job. Each job runs as ``__main__`` with its own command line, environment and working
directory, nothing of one job reaches the next, its exit status (or the signal that killed it)
comes back, and a client that dies takes its job with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from falkirk.policies.job_host import JobHost, stop_hosts

JOB = textwrap.dedent("""
    import os, sys, time
    print("name", __name__)
    print("argv", sys.argv[1:])
    print("cwd", os.getcwd())
    print("env", os.environ.get("JOB_VALUE"), os.environ.get("ONLY_FIRST"))
    print("preloaded", "pyspark.sql.connect.session" in sys.modules)
    if os.environ.get("PID_FILE"):
        open(os.environ["PID_FILE"], "w").write(str(os.getpid()))
    if os.environ.get("SLEEP"):
        time.sleep(float(os.environ["SLEEP"]))
    if os.environ.get("KILL_SELF"):
        os.kill(os.getpid(), 9)
    sys.stdout.write("no newline at the end")
    raise SystemExit(int(os.environ.get("CODE", "0")))
""")


@pytest.fixture()
def host(tmp_path: Path):
    (tmp_path / "job.py").write_text(JOB)
    env = {**os.environ, "FALKIRK_JOB_HOST_DIR": str(tmp_path / "hosts")}
    yield JobHost(environ=env), env, tmp_path
    stop_hosts(tmp_path / "hosts")


def run(host: JobHost, env: dict, tmp_path: Path, **extra: str) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = host.run([str(tmp_path / "job.py"), "a", "--b"], {**env, **extra}, cwd=str(tmp_path), on_line=lines.append)
    return code, lines


def test_a_job_runs_as_main_with_its_own_command_line_environment_and_directory(host) -> None:
    host, env, tmp_path = host
    code, lines = run(host, env, tmp_path, JOB_VALUE="one", ONLY_FIRST="yes", CODE="7")
    assert code == 7
    assert lines == ["name __main__", "argv ['a', '--b']", f"cwd {tmp_path}", "env one yes", "preloaded True",
                     "no newline at the end"]
    code, lines = run(host, env, tmp_path, JOB_VALUE="two")
    assert code == 0 and "env two None" in lines  # the first job's variable is not there
    assert len(list((tmp_path / "hosts").glob("*.pid"))) == 1  # one host served both


def test_a_job_killed_by_a_signal_reports_the_signal(host) -> None:
    host, env, tmp_path = host
    code, lines = run(host, env, tmp_path, KILL_SELF="1")
    assert code == -signal.SIGKILL and "preloaded True" in lines


def test_a_client_that_dies_takes_its_job_with_it(host) -> None:
    host, env, tmp_path = host
    run(host, env, tmp_path)  # the host is up
    pid_file = tmp_path / "job.pid"
    client = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os
        from falkirk.policies.job_host import JobHost
        env = {{**os.environ, "FALKIRK_JOB_HOST_DIR": {str(tmp_path / 'hosts')!r}, "SLEEP": "120",
               "PID_FILE": {str(pid_file)!r}}}
        JobHost(environ=env).run([{str(tmp_path / 'job.py')!r}], env, on_line=lambda line: None)
    """)])
    deadline = time.monotonic() + 60
    # the job creates the file, then writes its pid: wait for the pid, not only the file
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    job = int(pid_file.read_text())
    os.kill(client.pid, signal.SIGKILL)  # the task process is gone
    client.wait()
    deadline = time.monotonic() + 10
    while _alive(job) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(job)


def test_concurrent_first_jobs_start_one_host_and_an_idle_host_exits(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    env = {**os.environ, "FALKIRK_JOB_HOST_DIR": str(tmp_path / "hosts"), "FALKIRK_JOB_HOST_IDLE_SECONDS": "3"}
    host = JobHost(environ=env)
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(run(host, env, tmp_path)[0])) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert codes == [0, 0, 0]
    log = host.log_path.read_text()
    assert log.count("serving on") == 1, log
    pid = int(host.pid_path.read_text())
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid) and not host.socket_path.exists() and "idle for 3s, exiting" in host.log_path.read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_host_that_preloads_airflow_serves_the_jobs_of_its_airflow_configuration_only(tmp_path: Path) -> None:
    """The TaskFlow form's host (``preload``): a host of its own, which has imported the modules
    named before the first job; a job with another Airflow configuration gets another host, and
    a task's own ``AIRFLOW_CTX_*`` variables do not count."""
    job = tmp_path / "job.py"
    job.write_text("import sys\nprint('warm', 'airflow.sdk' in sys.modules)\n")
    env = {**os.environ, "FALKIRK_JOB_HOST_DIR": str(tmp_path / "hosts"), "AIRFLOW_HOME": str(tmp_path / "af"),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "sqlite://"}
    try:
        said: list[str] = []
        plain = JobHost(environ=env)
        assert plain.run([str(job)], env, on_line=said.append) == 0 and said == ["warm False"]
        for task in ("a", "b"):
            said.clear()
            task_env = {**env, "AIRFLOW_CTX_TASK_ID": task}
            warm = JobHost(environ=task_env, preload=("airflow.sdk",))
            assert warm.run([str(job)], task_env, on_line=said.append) == 0 and said == ["warm True"], said
        assert len(list((tmp_path / "hosts").glob("*.pid"))) == 2  # the plain host and one warm host
        other = {**env, "AIRFLOW__CORE__PARALLELISM": "7"}
        assert JobHost(environ=other, preload=("airflow.sdk",)).run([str(job)], other, on_line=said.append) == 0
        assert len(list((tmp_path / "hosts").glob("*.pid"))) == 3
    finally:
        stop_hosts(tmp_path / "hosts")
