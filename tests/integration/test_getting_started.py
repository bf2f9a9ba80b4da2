"""The getting-started page, followed as written: its ``bash`` blocks run in order, in one shell,
in a fresh directory outside the repository (a virtual environment with the wheel built as the
page says, the job and DAG made by ``falkirk new-job``, Spark Connect and ``airflow standalone``
started as the page says), to a green DAG and a replayed recovery, the tables shown, and a
teardown after which no process of the page's is left; then every table of the DAG equals
what the job computes for epochs 1 and 2.

The ports are free ones instead of 8080 and 15002, set through the variables the page names
(``AIRFLOW_PORT``, ``SPARK_CONNECT_PORT``, Airflow's log-server ports), so that the test runs
beside other Airflows and Spark servers.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from devstack.airflow import PROJECT_ROOT
from devstack.processes import free_port
from falkirk.policies import Ledger, StoreConfig, Tier
from falkirk.policies.job_host import hosts_dir, stop_hosts
from falkirk.policies.store.commits import scan

pytestmark = pytest.mark.integration

PAGE = PROJECT_ROOT / "docs" / "getting-started.md"
DAG = "word_count"


def page_script() -> str:
    """The page's bash blocks, in order and unchanged, as one script that stops at the first
    failing command."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) >= 10, "the page lost its steps"
    script = "\n".join(f"echo '>>> step {i}'\n{b}" for i, b in enumerate(blocks, 1))
    return "set -euo pipefail\n" + script


def words_through(epoch: int) -> dict[str, int]:
    """What the skeleton's job counts by the end of ``epoch`` (its lines, jobs/word_count.py)."""
    counts: Counter[str] = Counter()
    for e in range(1, epoch + 1):
        for line in (f"epoch {e} of the falkirk wheel", "the wheel turns one epoch at a time"):
            counts.update(line.split(" "))
    return dict(counts)


def test_the_getting_started_page_runs_as_written_to_a_green_dag_and_a_recovery(tmp_path: Path) -> None:
    project = tmp_path / "my-airflow"
    project.mkdir()
    api_port, connect_port = free_port(), free_port()
    # The machine's environment (its package indexes and certificates), without this checkout's
    # virtual environment or any Airflow, Spark or Falkirk setting of the test session.
    ours = str(PROJECT_ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "FALKIRK", "SPARK", "PYSPARK", "AWS_"))
           and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update({"PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(ours)),
                # the variables the page reads (it says which), set as a reader on a busy machine would
                "FALKIRK_SRC": str(PROJECT_ROOT), "AIRFLOW_PORT": str(api_port), "SPARK_CONNECT_PORT": str(connect_port),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port())})
    (tmp_path / "page.sh").write_text(page_script())
    shell = subprocess.Popen(["bash", str(tmp_path / "page.sh")], cwd=project, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    left: list[str] = []
    try:
        out, _ = shell.communicate(timeout=2400)
        left = _processes_of(project)  # after the page's teardown (processes signalled may take a moment)
        for _ in range(30):
            if not left:
                break
            time.sleep(1)
            left = _processes_of(project)
    except subprocess.TimeoutExpired:
        shell.kill()
        out, _ = shell.communicate()
    finally:
        _stop_group(shell.pid)  # the page's background processes: Spark Connect and airflow standalone
        stop_hosts(hosts_dir({"AIRFLOW_HOME": str(project / "airflow")}))  # the job host, a session of its own
    print(out[-6000:])
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in (project / "airflow.log",
                                                                        project / "spark-connect.log") if p.exists())
    assert shell.returncode == 0, out[-6000:] + logs
    assert "manual__epoch-1: success" in out and "manual__epoch-2: success" in out, out[-3000:]
    assert re.search(r"plan \w+: done, 3 task instances re-ran", out), out[-3000:]
    assert re.search(r"^\s*wheel\s+4$", out, re.M), out[-3000:]  # the tables step: epoch 2's count of "wheel"
    # Spark's own Delta reader, on the server started with the page's jars: the same rows, and the
    # history of the recovered epoch's commit
    assert "words at epoch 2: 12" in out, out[-3000:]
    assert re.search(r'^\d+ [A-Z ]+ \{"falkirk":\{"dag_id":"word_count","task":"word_count","epoch":2,"incarnation":1\}\}$',
                     out, re.M), out[-3000:]
    assert left == [], left  # the teardown stopped Airflow, Spark Connect and the job host

    store = StoreConfig(str(project / "falkirk-store"), str(project / "falkirk-store-scratch"))
    rows = Ledger(store).entries(DAG)
    assert sorted((e.task_id, e.epoch, e.incarnation) for e in rows) == [
        ("word_count", 1, 1), ("word_count", 2, 1), ("word_count_source", 1, 1), ("word_count_source", 2, 0)]
    state = scan(DeltaTable(store.table_uri(Tier.DURABLE, DAG, DAG, "state"))).to_pylist()
    for epoch in (1, 2):
        assert {r["word"]: r["total"] for r in state if r["epoch"] == epoch} == words_through(epoch), epoch


def _processes_of(project: Path) -> list[str]:
    """The processes still running for the page: those whose command line or environment names
    the project directory (Airflow's home, the store, the job host's socket are all under it)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            seen = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if str(project).encode() in seen:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name}: {command[:200]}")
    return found


def _stop_group(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        time.sleep(5)
