"""falkirk.plugins.celery_worker: Airflow's Celery configuration, and the plugins loaded once when a
worker starts, inherited by the task processes it forks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# Run in a fresh interpreter: loading every plugin is what is under test, and this process's
# modules would hide it. Celery sends ``import_modules`` as a worker starts (before its pool);
# the probe sends it the same way, forks as the pool does, and reports what the child has.
PROBE = textwrap.dedent("""
    import json, os, sys
    sys.argv = ["airflow", "celery", "worker"]
    from celery.signals import import_modules
    from airflow.sdk.listener import get_listener_manager
    from falkirk.plugins.celery_worker import CELERY_CONFIG
    from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
    before = {"operator": "falkirk.plugins.operators" in sys.modules, "listeners": get_listener_manager.cache_info().currsize}
    import_modules.send(sender=None)
    read, write = os.pipe()
    if os.fork() == 0:
        child = {"operator": "falkirk.plugins.operators" in sys.modules, "listeners": get_listener_manager.cache_info().currsize,
                 "spark provider": "airflow.providers.apache.spark.operators.spark_submit" in sys.modules,
                 "dagbag": "airflow.dag_processing.dagbag" in sys.modules}
        os.write(write, json.dumps(child).encode())
        os._exit(0)
    os.close(write)
    os.wait()
    print(json.dumps({"same config": CELERY_CONFIG is DEFAULT_CELERY_CONFIG, "before": before,
                      "child": json.loads(os.read(read, 4096))}))
""")


def test_a_forked_task_process_finds_the_plugins_the_worker_loaded_when_it_started(tmp_path) -> None:  # noqa: ANN001
    env = {"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"same config": True, "before": {"operator": False, "listeners": 0},
                    "child": {"operator": True, "listeners": 1, "spark provider": True, "dagbag": True}}
