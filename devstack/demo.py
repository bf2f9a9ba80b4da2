"""The main job on the embedded default: three epochs of ``falkirk_orders`` through real Airflow.

Starts the Airflow components on 127.0.0.1 (home ``.airflow`` in the checkout), runs
epochs 1..N one DAG run each through the scheduler, prints the ledger as a table of
epochs x tasks, and stops the components. Run it with ``.venv/bin/python -m devstack.demo``.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from devstack.airflow import PROJECT_ROOT, AirflowClient, AirflowStack
from devstack.report import epoch_table
from falkirk.policies.epochs import EpochClock
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger

DAG_ID = "falkirk_orders"
TASKS = ["ingest", "aggregate", "publish"]


def dag_epoch_clock(dag_file: Path = PROJECT_ROOT / "dags" / "falkirk_orders.py") -> EpochClock:
    """The epoch grid the DAG file declares (``EPOCHS``), loaded the way Airflow loads DAG files."""
    spec = importlib.util.spec_from_file_location("falkirk_orders_dag", dag_file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.EPOCHS


def run_id_of(epoch: int) -> str:
    return f"epoch-{epoch}"


def run_epochs(
    client: AirflowClient,
    clock: EpochClock,
    epochs: list[int],
    dag_id: str = DAG_ID,
    progress: Callable[[str], None] = print,
) -> dict[int, str]:
    """Trigger one DAG run per epoch, in order, each after the previous finished; returns run states."""
    client.wait_for_dag(dag_id)
    client.set_paused(dag_id, False)
    states = {}
    for epoch in epochs:
        run_id = run_id_of(epoch)
        progress(f"epoch {epoch}: triggering {dag_id} run {run_id} (logical date {clock.logical_date(epoch).date()})")
        client.trigger(dag_id, run_id, clock.logical_date(epoch))
        states[epoch] = client.wait_for_run(dag_id, run_id, progress=progress)
        progress(f"epoch {epoch}: run {states[epoch]}")
        if states[epoch] != "success":
            break
    return states


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="how many epochs to run (default 3)")
    parser.add_argument("--home", type=Path, default=PROJECT_ROOT / ".airflow", help="AIRFLOW_HOME")
    parser.add_argument("--store", default=str(PROJECT_ROOT / ".falkirk" / "store"), help="durable store root")
    parser.add_argument("--port", type=int, default=8080, help="API server port (default 8080)")
    args = parser.parse_args(argv)

    store = StoreConfig(durable_uri=args.store, scratch_uri=str(Path(args.store).parent / "scratch"))
    for root in (store.durable_uri, store.scratch_uri):  # each demo starts from an empty store
        shutil.rmtree(root, ignore_errors=True)
    stack = AirflowStack(home=args.home, store=store, port=args.port)
    started = time.monotonic()
    print(f"Airflow home {stack.home}; store {store.durable_uri}")
    print("initialising the Airflow database ...", flush=True)
    stack.init()
    print(f"starting api-server, scheduler, dag-processor, triggerer on {stack.base_url} ...", flush=True)
    try:
        stack.start()
        print(f"Airflow is up ({time.monotonic() - started:.0f}s); UI at {stack.base_url} (admin/admin)", flush=True)
        states = run_epochs(stack.client(), dag_epoch_clock(), list(range(1, args.epochs + 1)),
                            progress=lambda m: print(m, flush=True))
    finally:
        print("stopping Airflow ...", flush=True)
        stack.stop()
    print()
    print(f"Ledger of {DAG_ID} ({store.ledger_uri}):")
    print(epoch_table(Ledger(store), DAG_ID, TASKS))
    failed = {e: s for e, s in states.items() if s != "success"}
    print(f"\n{len(states) - len(failed)} of {args.epochs} epochs succeeded in {time.monotonic() - started:.0f}s")
    if failed or len(states) != args.epochs:
        print(f"failed epochs: {failed}; task logs are under {stack.home / 'logs'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
