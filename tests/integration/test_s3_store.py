"""(c) The same pipeline with its durable Delta tables on an S3-compatible server
(``moto_server`` as a subprocess), run by Airflow (``airflow dags test``) and real Spark: its
epochs as clients of the session's Spark Connect server, then a trial run without a
``spark_default`` connection, on ``spark-submit`` and ``local[2]``."""

from __future__ import annotations

from pathlib import Path

from devstack.airflow import AirflowStack
from devstack.demo import DAG_ID, dag_epoch_clock
from devstack.s3 import MotoS3
from devstack.spark import SparkConnectServer
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.ledger import Ledger
from tests.oracle import canonical, expected_tables
from tests.tables import TABLES, snapshot, table_rows

EPOCHS = [1, 2, 3]


def test_pipeline_on_s3_produces_the_same_tables(s3: MotoS3, spark_connect: SparkConnectServer,
                                                  tmp_path: Path) -> None:
    s3.create_bucket("falkirk")
    store = StoreConfig("s3://falkirk/store", str(tmp_path / "scratch"), s3.storage_options())
    # The executors write every epoch's files (not the driver, as it does for small epochs).
    stack = AirflowStack(home=tmp_path / "airflow", store=store,
                         extra_env={**spark_connect.airflow_env(), "FALKIRK_DRIVER_WRITE_MAX_ROWS": "0",
                                    "FALKIRK_DAGS_TEST_STORE": "real"})
    stack.init()
    clock = dag_epoch_clock()
    try:
        for epoch in EPOCHS:
            stack.airflow("dags", "test", DAG_ID, clock.logical_date(epoch).isoformat())
    finally:
        stack.stop()  # no component was started: this stops the job host the tasks started

    expected = expected_tables(EPOCHS)
    for name in TABLES:
        assert canonical(table_rows(store, name)) == canonical(expected[name]), name
    keys = s3.client().list_objects_v2(Bucket="falkirk", Prefix="store/")["Contents"]
    assert any(k["Key"].startswith("store/falkirk_orders/aggregate/state/_delta_log/") for k in keys)
    assert len(Ledger(store).entries(DAG_ID)) == 9

    # Without FALKIRK_DAGS_TEST_STORE=real, `airflow dags test` writes a store of its own: the DAG's
    # store (its ledger, every table, their Delta versions) stays as it was. Without a spark_default
    # connection the tasks run on local[2].
    before = snapshot(store)
    trial = tmp_path / "trial"
    stack.airflow("dags", "test", DAG_ID, clock.logical_date(1).isoformat(),
                  env={"FALKIRK_DAGS_TEST_STORE": str(trial), "AIRFLOW_CONN_SPARK_DEFAULT": None})
    assert snapshot(store) == before
    trial_store = StoreConfig(str(trial / DAG_ID / "durable"), str(trial / DAG_ID / "scratch"))
    assert sorted((e.task_id, e.epoch) for e in Ledger(trial_store).entries(DAG_ID)) == [
        ("aggregate", 1), ("ingest", 1), ("publish", 1)]
    assert canonical(table_rows(trial_store, "publish/output")) == canonical(expected_tables([1])["publish/output"])


def test_twenty_races_of_two_attempts_committing_one_epoch_on_s3_double_nothing(s3: MotoS3) -> None:
    """Two attempts of one task (two drivers, as when Airflow starts a second attempt while the
    first still runs) commit the same epoch at the same instant, 20 times, on the S3-compatible
    server: both have checked that the epoch is not committed and then commit together. S3's
    conditional write lets one commit in; the other's lost race is checked again and skipped.
    Each epoch holds exactly one attempt's rows, committed once."""
    import threading

    import pyarrow as pa

    from falkirk.policies.store.commits import CommitKey, _write_rows, commit_once, open_table, scan

    s3.create_bucket("falkirk-races")
    store = StoreConfig("s3://falkirk-races/store", "/nonexistent-scratch", s3.storage_options())
    uri, options = "s3://falkirk-races/store/races/totals/output", s3.storage_options()
    trials, applied = 20, []
    for epoch in range(1, trials + 1):
        both_checked = threading.Barrier(2, timeout=60)

        def attempt(marker: int, epoch: int = epoch, both_checked: threading.Barrier = both_checked) -> None:
            rows = pa.table({"customer": ["a", "b"], "amount": [marker, marker], "epoch": [epoch, epoch]})

            first_try = [True]

            def write(table, properties) -> None:  # noqa: ANN001 - commit_epoch's own write, after a barrier
                if first_try.pop() if first_try else False:
                    both_checked.wait()  # both have passed the check; neither has committed
                _write_rows(uri, table, rows, properties, options, mode="overwrite", predicate=f"epoch = {epoch}",
                            partition_by=["epoch"])

            result = commit_once(uri, CommitKey(dag_id="races", task_id="totals", epoch=epoch), write, 2, options)
            applied.append((epoch, marker, result.applied))

        racers = [threading.Thread(target=attempt, args=(marker,)) for marker in (1, 2)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(120)
    table = open_table(uri, options)
    rows = scan(table).to_pylist()
    per_epoch = {e: sorted((r["customer"], r["amount"]) for r in rows if r["epoch"] == e) for e in range(1, trials + 1)}
    winners = {e: m for e, m, won in applied if won}
    assert sorted(e for e, _, won in applied if won) == list(range(1, trials + 1))  # one winner each
    assert len(applied) == 2 * trials
    assert per_epoch == {e: [("a", winners[e]), ("b", winners[e])] for e in per_epoch}
    assert len(rows) == 2 * trials
    assert len(table.history()) == trials  # one commit per epoch, the losers' none
    assert store.durable_uri.startswith("s3://")


def test_an_epoch_of_a_megabyte_or_more_on_s3_is_read_by_sparks_delta_reader_when_the_server_reaches_the_store(
        s3: MotoS3, spark_connect: SparkConnectServer, tmp_path: Path) -> None:
    """``read_frame`` with ``spark_reads`` (``FALKIRK_SPARK_READS_STORE``): a large epoch is read in
    the Spark server over ``s3a://``, its partition alone, at the version checked; a small one and
    the same large one without ``spark_reads`` are read by the job with pyarrow. The rows are the
    same either way."""
    import pyarrow as pa

    from falkirk.policies.regimes import Tier
    from falkirk.policies.store.commits import CommitKey, commit_epoch
    from falkirk.spark_jobs.delta_sink import SPARK_READ_MIN_BYTES, read_frame
    from tests.delta_interop import connect_session

    s3.create_bucket("falkirk-reads")
    store = StoreConfig("s3://falkirk-reads/store", str(tmp_path / "scratch"), s3.storage_options(), spark_reads=True)
    uri = store.table_uri(Tier.DURABLE, "reads", "aggregate", "output")
    sizes = {1: 2_000, 2: 60_000, 3: 2_000}  # epoch 2: about 1.3 MB of Parquet

    def rows(epoch: int) -> pa.Table:
        n = sizes[epoch]
        return pa.table({"item": [f"item-{i:08d}" for i in range(n)], "total": pa.array(range(epoch, epoch + n)),
                         "share": [i / n for i in range(n)], "epoch": pa.array([epoch] * n, pa.int64())})

    keys = {e: CommitKey(dag_id="reads", task_id="aggregate", epoch=e) for e in sizes}
    for epoch, key in keys.items():
        commit_epoch(uri, rows(epoch), key, store.options_for(uri))
    with connect_session(spark_connect.url) as spark:
        for name, value in store.spark_conf().items():  # the Spark server reaching the store, per session
            spark.conf.set(name.removeprefix("spark.hadoop."), value)

        def read(epoch: int, spark_reads: bool = True) -> tuple[list[str], list[tuple]]:
            frame = read_frame(spark, uri, keys[epoch], sizes[epoch], store.options_for(uri), spark_reads=spark_reads)
            return frame.inputFiles(), sorted(tuple(r) for r in frame.collect())

        expected = {e: sorted((r["item"], r["total"], r["share"]) for r in rows(e).to_pylist()) for e in sizes}
        files, got = read(2)
        assert files and all(f.startswith("s3a://falkirk-reads/store/") and "/epoch=2/" in f for f in files), files
        assert got == expected[2]
        assert read(2, spark_reads=False) == ([], expected[2])  # the job's pyarrow: a local relation
        assert read(1) == ([], expected[1]) and read(3) == ([], expected[3])  # under SPARK_READ_MIN_BYTES
    assert SPARK_READ_MIN_BYTES == 1024 * 1024
