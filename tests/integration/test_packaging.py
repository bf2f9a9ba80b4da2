"""The package as a team installs it: the wheel, built from this checkout, in a fresh virtual
environment with the lock (no editable install, no checkout on ``sys.path``), and a user
project laid out like an Astro project (its own ``dags/``, ``plugins/`` and ``include/``)
run through real Airflow and Spark from that environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from deltalake import DeltaTable

from devstack.airflow import PROJECT_ROOT, AirflowStack
from devstack.demo import run_id_of
from devstack.processes import VENV_BIN
from devstack.spark import SparkConnectServer
from falkirk.policies import EpochClock, Ledger, StoreConfig, Tier
from falkirk.policies.store.commits import scan
from tests.integration.recovery.drill import wait_states
from tests.oracle import canonical, expected_tables

pytestmark = pytest.mark.integration

DAG = "team_orders"
TASKS = ("ingest", "aggregate", "publish", "top_three")
EPOCHS = (1, 2, 3, 4)
USER_DAG = '''\
"""A team's own DAG: the package's orders jobs, found by module name, and a job of its own
written inline (the TaskFlow form)."""
from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, task

from falkirk.plugins.operators import RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import Batch, EagerCheckpoint, Ephemeral, EpochClock
from falkirk.spark_jobs.runtime import EpochResult

EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))


@task.falkirk(regime=Batch(log_outputs=True))
def top_three(ctx):
    """The three customers with the highest running totals this epoch."""
    from pyspark.sql import functions as F

    totals = ctx.read_input("aggregate")
    return EpochResult(outputs={"output": totals.orderBy(F.col("total_amount").desc(), "customer")
                                .limit(3).select("customer", "total_amount")})


with DAG(dag_id="team_orders", schedule=EpochTimetable(EPOCHS), start_date=EPOCHS.first, catchup=False,
         max_active_runs=3, default_args={"retries": 0}):
    ingest = RegimeSparkSubmitOperator(task_id="ingest", application="falkirk.spark_jobs.pipeline.ingest",
                                       regime=Ephemeral())
    aggregate = RegimeSparkSubmitOperator(task_id="aggregate", application="falkirk.spark_jobs.pipeline.aggregate",
                                          regime=EagerCheckpoint())
    publish = RegimeSparkSubmitOperator(task_id="publish", application="falkirk.spark_jobs.pipeline.publish",
                                        regime=Batch(log_outputs=True))
    ingest >> aggregate >> [publish, top_three()]
'''
USER_PLUGIN = '''\
"""The team's own plugin, beside the package's."""
from airflow.plugins_manager import AirflowPlugin


class TeamTools(AirflowPlugin):
    name = "team_tools"
'''
CLOCK = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))  # USER_DAG's


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # The sdist first, then the wheel from it: a clean tree, nothing written into the checkout.
    built = subprocess.run([str(VENV_BIN / "uv"), "build", "--out-dir", str(out), str(PROJECT_ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = out.glob("falkirk_airflow-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment with the wheel and the lock: its ``bin`` directory."""
    root = tmp_path_factory.mktemp("team-venv")
    base = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base), "-m", "venv", str(root)], check=True, timeout=300)
    # The wheelhouse holds pyspark built once by `make install` (PyPI has only its source archive).
    installed = subprocess.run([str(VENV_BIN / "uv"), "pip", "install", "--python", str(root / "bin" / "python"),
                                "--find-links", str(VENV_BIN.parent / "wheelhouse"),
                                str(wheel), "-c", str(PROJECT_ROOT / "requirements.lock")],
                               capture_output=True, text=True, timeout=1200)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return root / "bin"


def run_python(venv: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "python"), "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": f"{venv}:/usr/bin:/bin", "HOME": str(cwd)})


def test_the_wheel_installs_one_import_name(wheel: Path, venv: Path, tmp_path: Path) -> None:
    """The wheel's top-level names are ``falkirk`` and its metadata; in the fresh environment
    the package imports from site-packages and the checkout's folder names do not import."""
    with zipfile.ZipFile(wheel) as whl:
        tops = {name.split("/")[0] for name in whl.namelist()}
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/top_level.txt"))
        assert whl.read(meta).decode().split() == ["falkirk"]
        entry_points = whl.read(next(n for n in whl.namelist() if n.endswith("entry_points.txt"))).decode()
        bundled = "falkirk/plugins/ui/falkirk.js" in whl.namelist()  # the view's bundle
    assert {t for t in tops if not t.endswith(".dist-info")} == {"falkirk"} and bundled
    assert "provider_info = falkirk.plugins.provider_info:get_provider_info" in entry_points
    assert "falkirk = falkirk.plugins.falkirk_plugin:FalkirkPlugin" in entry_points
    for name in ("plugins", "policies", "spark_jobs", "devstack", "tests", "benchmarks"):
        gone = run_python(venv, f"import {name}", tmp_path)
        assert gone.returncode == 1 and f"No module named '{name}'" in gone.stderr, (name, gone.stderr)
    where = run_python(venv, "import falkirk.policies, falkirk.plugins.operators, falkirk.spark_jobs.runtime as r; "
                             "print(r.__file__)", tmp_path)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(venv.parent / "lib")), where.stdout


def test_the_repositorys_plugins_folder_registers_the_plugin_once(tmp_path: Path) -> None:
    """Airflow's plugins_folder at this repository's plugins/ (an Astro-style layout): the
    folder's .airflowignore leaves the plugin to the package's entry points, so it is
    registered once and no module is imported by its bare file name."""
    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    stack = AirflowStack(home=tmp_path / "airflow", store=store, plugins_folder=PROJECT_ROOT / "plugins")
    # (the other providers' plugins, such as OpenLineage's, are listed too)
    names = [p["name"] for p in last_json(stack.airflow("plugins", "--output", "json").stdout)]
    assert names.count("falkirk") == 1, names
    loaded = subprocess.run(
        [str(VENV_BIN / "python"), "-c", "import json, sys; from airflow import plugins_manager as m; "
         "m.ensure_plugins_loaded(); print(json.dumps([m.get_import_errors(), "
         "sorted(set(sys.modules) & {'api', 'cli', 'view', 'recovery', 'operators', 'falkirk_plugin'})]))"],
        env=stack.env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert last_json(loaded.stdout) == [{}, []]


def test_a_team_project_on_the_installed_package_plans_and_replays_to_the_failure_free_tables(
        venv: Path, tmp_path: Path) -> None:
    """A project with its own dags/ (the package's jobs by module name) and plugins/ (a plugin
    of its own): Airflow lists both plugins once and no import error; the Falkirk API answers;
    aggregate's epoch 2 fails, and ingest's epoch 4 fails before anything of that run is in the
    ledger (its epoch comes from the serialized epoch clock); ``falkirk plan --failed-task '*'``
    and ``falkirk replay`` from the environment re-run exactly what they affect, and every
    table equals the failure-free run."""
    project = tmp_path / "project"
    for folder in ("dags", "plugins", "include"):
        (project / folder).mkdir(parents=True)
    (project / "dags" / "team_orders.py").write_text(USER_DAG)
    (project / "plugins" / "team_plugin.py").write_text(USER_PLUGIN)
    faults = tmp_path / "faults"
    faults.write_text(f"{DAG}/aggregate:2:before-commit,{DAG}/ingest:4:before-commit\n")
    store = StoreConfig(str(tmp_path / "durable"), str(tmp_path / "scratch"))
    with SparkConnectServer(tmp_path, venv_bin=venv) as spark:
        stack = AirflowStack(home=tmp_path / "airflow", store=store, dags_folder=project / "dags",
                             plugins_folder=project / "plugins", venv_bin=venv,
                             extra_env={**spark.airflow_env(), "FALKIRK_CRASH_AT": f"@{faults}"})
        stack.init()
        listed = last_json(stack.airflow("plugins", "--output", "json").stdout)
        assert sorted(p["name"] for p in listed) == ["falkirk", "team_tools"]
        errors = stack.airflow("dags", "list-import-errors", "--local", "--output", "json")
        assert last_json(errors.stdout) == [], errors.stdout
        stack.start()
        try:
            client = stack.client()
            client.wait_for_dag(DAG)
            regimes = client.request("GET", f"/falkirk/api/v1/dags/{DAG}/regimes")
            assert {t["task_id"]: t["regime"] for t in regimes["tasks"]} == {
                "aggregate": "eager_checkpoint", "ingest": "ephemeral", "publish": "batch(log_outputs=true)",
                "top_three": "batch(log_outputs=true)"}
            client.set_paused(DAG, False)
            for epoch in EPOCHS:
                client.trigger(DAG, run_id_of(epoch), CLOCK.logical_date(epoch))
            wait_states(client, DAG, {1: {t: {"success"} for t in TASKS}, 2: {"aggregate": {"failed"}},
                                      4: {"ingest": {"failed"}}})
            assert Ledger(store).find(DAG, "ingest", 4) is None and max(e.epoch for e in Ledger(store).entries(DAG)) == 3
            faults.write_text("")  # the cause is fixed
            # The view places epoch 4's run by the serialized epoch clock, though it committed nothing.
            view = client.request("GET", f"/falkirk/api/v1/dags/{DAG}/view")
            assert view["last_epoch"] == 4 and len(view["status"]["ingest"]) == 4, view
            assert view["status"]["ingest"][3] == "-" and view["epochs"][-1] == {"epoch": 4, "run_id": run_id_of(4)}
            assert sorted((f["task_id"], f["epoch"]) for f in view["failed"]) == [("aggregate", 2), ("ingest", 4)]
            preview = client.request("POST", f"/falkirk/api/v1/dags/{DAG}/preview", json={
                "failed_tasks": [{"task_id": t, "epoch": e} for t, e in (("aggregate", 2), ("ingest", 4))]})

            env = {"PATH": f"{venv}:/usr/bin:/bin", "HOME": str(tmp_path), **store.env(),
                   "FALKIRK_AIRFLOW_URL": stack.base_url, "FALKIRK_AIRFLOW_USER": "admin",
                   "FALKIRK_AIRFLOW_PASSWORD": "admin"}
            planned = subprocess.run([str(venv / "falkirk"), "plan", "--dag", DAG, "--failed-task", "*",
                                      "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
            assert planned.returncode == 0, planned.stderr
            plan = json.loads(planned.stdout)
            rerun = sorted((t["task_id"], e) for t in plan["tasks"] for e in t["rerun"])
            assert rerun == sorted([("ingest", 4), *((t, e) for t in ("aggregate", "publish", "top_three")
                                                     for e in (2, 3, 4))]), plan["tasks"]
            assert sorted(map(tuple, preview["rerun"])) == rerun  # the view plans what the CLI plans
            replayed = subprocess.run([str(venv / "falkirk"), "replay", plan["plan_id"]], env=env, cwd=tmp_path,
                                      capture_output=True, text=True, timeout=1200)
            assert replayed.returncode == 0, replayed.stdout[-3000:] + replayed.stderr[-3000:]
            wait_states(client, DAG, {e: {t: {"success"} for t in TASKS} for e in EPOCHS})
        finally:
            stack.stop()
    want = expected_tables(list(EPOCHS))
    for name in ("aggregate/output", "aggregate/state", "publish/output"):
        task, table = name.split("/")
        uri = store.table_uri(Tier.DURABLE, DAG, task, table)
        assert canonical(scan(DeltaTable(uri)).to_pylist()) == canonical(want[name]), name
    top = [{"customer": r["customer"], "total_amount": r["total_amount"], "epoch": e} for e in EPOCHS
           for r in sorted((r for r in want["aggregate/output"] if r["epoch"] == e),
                           key=lambda r: (-r["total_amount"], r["customer"]))[:3]]
    uri = store.table_uri(Tier.DURABLE, DAG, "top_three", "output")
    assert canonical(scan(DeltaTable(uri)).to_pylist()) == canonical(top)
    assert sorted({(e.task_id, e.epoch) for e in Ledger(store).entries(DAG)}) == [
        (t, e) for t in sorted(TASKS) for e in EPOCHS]


def last_json(output: str):
    """The JSON a CLI command printed after its log lines."""
    return json.loads(output.strip().splitlines()[-1])
