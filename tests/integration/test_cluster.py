"""The distributed shape (devstack.cluster) for real: Airflow on PostgreSQL with the
CeleryExecutor on Redis and two Celery workers, each with its own scratch root; a Spark
standalone master with two workers; the durable store on ``moto_server``."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.cluster import Cluster
from devstack.demo import run_id_of
from falkirk.policies.regimes import Tier
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger
from tests.oracle import canonical, expected_tables
from tests.tables import TABLES, table_rows

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
EPOCHS = (1,)


def test_each_celery_worker_runs_its_queue_with_its_own_scratch_disk_and_the_tables_are_exact(
        tmp_path: Path) -> None:
    with Cluster(tmp_path / "cluster", dags_folder=HERE / "cluster_dags") as cluster:
        client = cluster.airflow.client()
        from tests.integration.cluster_dags.orders_by_worker import EPOCHS as CLOCK

        for dag in ("orders_on_a", "orders_on_b"):
            client.wait_for_dag(dag)
            client.set_paused(dag, False)
        for epoch in EPOCHS:
            for dag in ("orders_on_a", "orders_on_b"):
                client.trigger(dag, run_id_of(epoch), CLOCK.logical_date(epoch))
            for dag in ("orders_on_a", "orders_on_b"):
                assert client.wait_for_run(dag, run_id_of(epoch), timeout=900, progress=print) == "success"
        # Airflow names the worker that ran each task instance; each copy ran on its own worker.
        ran = {dag: {ti["hostname"] for e in EPOCHS for ti in client.task_instances(dag, run_id_of(e)).values()}
               for dag in ("orders_on_a", "orders_on_b")}
        assert ran == {"orders_on_a": {"worker-a"}, "orders_on_b": {"worker-b"}}
        # every job ran on the Spark standalone cluster, whose two workers each ran executors
        assert sorted(cluster.spark.completed_apps()) == sorted(
            f"falkirk:{dag}.{t}:epoch-{e}" for dag in ("orders_on_a", "orders_on_b")
            for t in ("ingest", "aggregate", "publish") for e in EPOCHS)

        expected = expected_tables(list(EPOCHS))
        for dag, worker in (("orders_on_a", "worker-a"), ("orders_on_b", "worker-b")):
            # the worker's own disk holds the scratch tier; the durable tables are on S3
            store = StoreConfig(cluster.store.durable_uri, str(cluster.scratch_root(worker)),
                                cluster.store.storage_options)
            for name, tier in TABLES.items():
                assert canonical(table_rows(store, name, dag)) == canonical(expected[name]), (dag, name)
                if tier is Tier.SCRATCH:
                    assert store.table_uri(tier, dag, *name.split("/")).startswith(str(cluster.scratch_root(worker)))
            assert sorted((e.task_id, e.epoch) for e in Ledger(store).entries(dag)) == sorted(
                (t, e) for t in ("ingest", "aggregate", "publish") for e in EPOCHS)
        other = cluster.scratch_root("worker-b") / "orders_on_a"
        assert not other.exists()  # nothing of orders_on_a touched worker-b's disk
