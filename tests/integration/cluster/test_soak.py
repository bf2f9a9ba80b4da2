"""A short seeded soak (``make soak`` for three minutes) on the package's servers.

``falkirk_figure1`` runs epoch after epoch on its own Celery-run Airflow while seed 37's schedule
lands: a worker killed, the scheduler killed, a worker lost with its disk, a job killed at a step
of its commit, S3 refusing connections for a while. Each failed DAG run is planned and replayed
as a user would; then every durable table and the SQL sink are compared with a failure-free run
of the same epochs. The long soak is ``make soak DURATION=60m``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.cluster import ClusterServers
from devstack.soak.pipelines import SOAK_DAGS
from devstack.soak.run import SoakReport, run_soak
from devstack.soak.schedule import FaultSchedule, Mix
from devstack.spark import SparkConnectServer

pytestmark = pytest.mark.integration

SEED, DURATION, MEAN_GAP = 37, 180, 25
MIX = Mix.parse("kill-worker,lose-worker,kill-job,kill-scheduler,kill-api-server,kill-replay,freeze-s3,refuse-s3,"
                "mistaken-trigger,gc")
SCHEDULE = FaultSchedule.draw(SEED, DURATION, MIX, mean_gap=MEAN_GAP)
# The durable tables of falkirk_figure1 (its ephemeral and scratch-tier tables are no one's record).
DURABLE = {f"falkirk_figure1: table {t}" for t in ("popularity/output", "rank/state", "stats/output", "stats/state")}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, cluster_servers: ClusterServers) -> SoakReport:
    return run_soak(Path(tmp_path_factory.mktemp("soak")) / "run", SCHEDULE, records=1_000, servers=cluster_servers,
                    progress=print, dags=[SOAK_DAGS["figure1"]])


def test_the_seed_draws_five_kinds_and_every_fault_landed(report: SoakReport) -> None:
    assert [(round(f.at), f.kind) for f in SCHEDULE.faults] == [
        (59, "kill-worker"), (84, "kill-scheduler"), (104, "lose-worker"), (127, "kill-job"), (147, "refuse-s3")]
    assert [i.fault for i in report.injected] == list(SCHEDULE.faults)
    assert not [i.line() for i in report.injected if i.hit.startswith("could not inject")]
    refused = report.injected[-1]
    assert refused.undone is not None and refused.undone - refused.landed == pytest.approx(refused.fault.hold, abs=3)


def test_every_failed_run_was_replayed_and_the_soak_caught_up(report: SoakReport) -> None:
    assert report.caught_up_in is not None, report.discrepancies
    assert report.recoveries, "the killed and the lost worker failed task instances: at least one plan"
    assert all(r.why.startswith("failed: ") and r.reruns > 0 and r.attempts >= 1 for r in report.recoveries)
    assert report.recoveries[-1].replayed_in is not None  # the last plan ran through: the runs succeeded
    assert all(i.caught_up_in is not None for i in report.injected), [i.line() for i in report.injected]
    assert report.epochs["falkirk_figure1"] >= 5


def test_every_durable_table_and_the_sql_sink_equal_the_failure_free_run(report: SoakReport) -> None:
    checks = {name: (ok, detail) for name, ok, detail in report.checks}
    assert DURABLE <= set(checks), sorted(checks)
    for name in [*DURABLE, *(f"falkirk_figure1: {c}" for c in (
            "the SQL sink equals the failure-free run's", "nothing delivered twice to the SQL sink",
            "no ledger row doubled", "no epoch missing", "no lease held",
            "nothing in the store outside what the ledger names"))]:
        assert checks[name][0], f"{name}: {checks[name][1]}"
    assert report.discrepancies == [] and report.ok


def test_every_table_opens_in_sparks_delta_reader_durable_through_s3a(
        report: SoakReport, cluster_servers: ClusterServers, spark_connect: SparkConnectServer) -> None:
    """Every table the soak left (its DAG's and the failure-free run's, the ledger and control
    tables too) read by Spark's Delta reader equals what delta-rs reads: the durable ones on the S3
    server through ``s3a://`` by the cluster's Spark Connect server, the worker disks' scratch
    tables by a local one (the cluster's Spark workers stand for other hosts and do not see them).
    Each table committed to by epoch travels back to its latest epoch commit."""
    from tests.delta_interop import compare, connect_session, tables_under

    store = report.store
    assert store is not None and cluster_servers.connect is not None
    durable = tables_under(store.durable_uri, dict(store.storage_options))
    scratch = tables_under(str(cluster_servers.scratch))
    assert all(uri.startswith("s3://") for uri in durable) and len(durable) >= 10 and scratch
    found = {}
    for server, uris in ((cluster_servers.connect, durable), (spark_connect, scratch)):
        with connect_session(server.url) as spark:
            found[server.url] = compare(spark, uris, store)
    assert {url: f.differing for url, f in found.items()} == {cluster_servers.connect.url: {}, spark_connect.url: {}}
    on_s3 = found[cluster_servers.connect.url]
    committed = {uri for uri, epochs in on_s3.epochs_in_history.items() if epochs}
    assert committed == set(on_s3.time_travelled) and committed
    assert any("/falkirk_figure1/rank/state" in uri for uri in committed)
