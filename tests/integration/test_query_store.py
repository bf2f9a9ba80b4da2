"""The reference applications' SQL tables on both backends: a file (SQLite) and a real PostgreSQL
server (Debian's, the session's). A delivery replaces its epoch in one transaction (the query
statistics) or its rows by key in transactions of a few rows (the sampled rows), so retries
and re-runs after a rollback never add rows, and the DAGs' tables stay apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.servers import PostgresServer
from falkirk.spark_jobs.figure1.query_store import QueryStatsStore
from falkirk.spark_jobs.sampled.targets import SampleTable, Superseded

pytestmark = pytest.mark.integration


def stats(epoch: int, n: int, marker: int) -> list[dict]:
    return [{"query_id": q, "user": q % 3, "item": q, "clicks": marker, "popularity_rank": q, "page_rank": q + 1}
            for q in range(epoch * 100, epoch * 100 + n)]


@pytest.fixture(scope="module")
def postgres_url(postgres: PostgresServer) -> str:
    postgres.create_database("queries")
    return postgres.url("queries", driver="postgresql")


def test_deliveries_replace_their_epoch_on_sqlite_and_postgres(tmp_path: Path, monkeypatch, postgres_url) -> None:
    monkeypatch.setenv("FALKIRK_QUERY_DB", postgres_url)
    stores = {"sqlite": QueryStatsStore(str(tmp_path / "q.sqlite")),
              "postgres": QueryStatsStore.for_dag("s3://lake/store", "falkirk_figure1")}
    other = QueryStatsStore.for_dag("s3://lake/store", "falkirk_figure1_reference")
    results = {}
    for name, store in stores.items():
        store.deliver(1, 0, stats(1, 3, marker=1))
        store.deliver(2, 0, stats(2, 2, marker=1))
        store.deliver(2, 0, stats(2, 2, marker=1))   # a retry of the same delivery
        store.deliver(2, 1, stats(2, 1, marker=2))   # a re-run after a rollback: replaces epoch 2
        with pytest.raises(Exception):               # a failed transaction leaves the epoch as it was
            store.deliver(1, 1, [*stats(1, 1, marker=3), {**stats(1, 1, marker=3)[0], "query_id": None}])
        results[name] = (store.rows(), store.deliveries(), store.duplicates())
    assert results["sqlite"] == results["postgres"]
    rows, deliveries, duplicates = results["postgres"]
    assert rows == [(1, q, q % 3, q, 1, q, q + 1) for q in (100, 101, 102)] + [(2, 200, 2, 200, 2, 200, 201)]
    assert deliveries == [(1, 0, 3), (2, 1, 1)] and duplicates == []
    assert other.rows() == []  # each DAG its own schema
    assert stores["postgres"].schema == "falkirk_figure1"


def test_sampled_rows_are_upserted_by_key_and_trimmed_to_the_latest_delivery_on_both(tmp_path: Path, monkeypatch,
                                                                                       postgres_url) -> None:
    monkeypatch.setenv("FALKIRK_QUERY_DB", postgres_url)
    tables = {"sqlite": SampleTable(str(tmp_path / "s.sqlite")),
              "postgres": SampleTable.for_dag("s3://lake/store", "falkirk_sampled")}
    results = {}
    for name, t in tables.items():
        t.commit(1, "0.1", 1, [{"key": "1-1", "value": 1001, "chunk": 1}, {"key": "1-2", "value": 2002, "chunk": 1}], 10.0)
        t.commit(1, "0.1", 1, [{"key": "1-1", "value": 1001, "chunk": 1}, {"key": "1-2", "value": 2002, "chunk": 1}], 10.0)
        t.commit(1, "1.1", 1, [{"key": "1-2", "value": 2002, "chunk": 1}], 20.0)  # a re-delivery
        assert t.keep_only(1, {"1-2"}, "1.1") == 1
        with pytest.raises(Superseded, match="delivery 0.1 of epoch 1 is refused: delivery 1.1"):
            t.commit(1, "0.1", 2, [{"key": "1-1", "value": 1001, "chunk": 1}], 30.0)  # the first lives on
        results[name] = (t.rows(), t.transactions(), t.with_commit_times(1))
    assert results["sqlite"] == results["postgres"]
    assert results["postgres"] == ([(1, "1-2", 2002, 1)], [(1, "0.1", 1, 2, 10.0), (1, "1.1", 1, 1, 20.0)],
                                   [("1-2", 1, "1.1", 20.0)])
    assert tables["postgres"].schema == "falkirk_sampled"
