"""The reference application's epoch at any commit: the "before" figure of ``make bench-overhead``.

Runs in a checkout of that commit, with that checkout's own environment and dev stack, so that
an older version is measured as it was (one Airflow with the LocalExecutor, one Spark Connect
server, as ``benchmarks/overhead_bench.py``): epochs of ``falkirk_figure1`` one DAG run at a time,
each DAG run's start to end as Airflow records it. Only this file is taken from the current tree::

    git worktree add /tmp/before 10b06de && cd /tmp/before && make install
    PYTHONPATH=. .venv/bin/python /path/to/benchmarks/figure1_at_commit.py --epochs 5
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
from datetime import datetime
from pathlib import Path

from devstack.airflow import AirflowStack  # the checkout's own
from devstack.spark import SparkConnectServer
from falkirk.policies.store import StoreConfig

DAGS = Path(__file__).resolve().parent / "figure1_at_commit_dags"


def seconds(run: dict) -> float:
    start, end = (datetime.fromisoformat(run[k].replace("Z", "+00:00")) for k in ("start_date", "end_date"))
    return (end - start).total_seconds()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    checkout = Path.cwd()
    spec = importlib.util.spec_from_file_location("figure1_dag", checkout / "dags" / "falkirk_figure1.py")
    figure1 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figure1)
    root = Path(tempfile.mkdtemp(prefix="falkirk-figure1-at-commit-"))
    store = StoreConfig(str(root / "durable"), str(root / "scratch"))
    times = []
    with SparkConnectServer(root / "spark") as server:
        stack = AirflowStack(home=root / "airflow", store=store, dags_folder=DAGS,
                             extra_env={**server.airflow_env(), "FALKIRK_BENCH_CHECKOUT": str(checkout)})
        stack.init()
        stack.start()
        try:
            client = stack.client()
            client.wait_for_dag("bench_figure1")
            client.set_paused("bench_figure1", False)
            for epoch in range(1, args.epochs + 1):
                run_id = f"epoch-{epoch}"
                client.trigger("bench_figure1", run_id, figure1.EPOCHS.logical_date(epoch))
                state = client.wait_for_run("bench_figure1", run_id, timeout=1800)
                if state != "success":
                    raise SystemExit(f"{run_id} ended {state}; logs in {stack.home / 'logs'}")
                times.append(seconds(client.dag_run("bench_figure1", run_id)))
                print(f"epoch {epoch}: {times[-1]:.1f}s", flush=True)
        finally:
            stack.stop()
    print(f"\nthe reference application at {checkout.name}: epoch median {statistics.median(times):.1f}s "
          f"({' '.join(f'{t:.1f}' for t in times)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
