"""The query-statistics store: a SQL table its users query directly (SQLite or PostgreSQL).

Each epoch's statistics are delivered in one transaction that replaces that epoch's rows
and records the delivery in ``deliveries`` (epoch, incarnation, rows): a retry or a
re-run after a rollback replaces, never adds, so every epoch is in the table exactly once
and matches the answers last delivered.

Where it lives: ``FALKIRK_QUERY_DB``, either a file path (SQLite; ``{dag_id}`` in it is
replaced) or a ``postgresql://`` URL, where each DAG's tables are in a schema named after
the DAG. Without it, a SQLite file beside the DAG's tables when the durable tier is local.

>>> import tempfile, os
>>> store = QueryStatsStore(os.path.join(tempfile.mkdtemp(), "q.sqlite"))
>>> rows = [{"query_id": 1, "user": 7, "item": 3, "clicks": 5, "popularity_rank": 2, "page_rank": 9}]
>>> store.deliver(1, 0, rows); store.deliver(1, 0, rows); store.deliver(1, 1, rows)
>>> store.rows(), store.deliveries(), store.duplicates()
([(1, 1, 7, 3, 5, 2, 9)], [(1, 1, 1)], [])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from falkirk.spark_jobs.sql_database import DB_ENV, SqlDatabase, database_of_dag

__all__ = ["COLUMNS", "DB_ENV", "QueryStatsStore"]

COLUMNS = ("query_id", "user", "item", "clicks", "popularity_rank", "page_rank")
_QUOTED = ", ".join(f'"{c}"' for c in COLUMNS)  # "user" is a reserved word in PostgreSQL


class QueryStatsStore(SqlDatabase):
    """``query_stats`` (one row per answered query) and ``deliveries``: in one SQLite file at
    ``location``, or in schema ``schema`` of the PostgreSQL database a ``postgresql://`` URL names."""

    def __init__(self, location: str, schema: str = "public") -> None:
        super().__init__(location, schema)
        key = self.integer
        self._create([
            f"CREATE TABLE IF NOT EXISTS {self._table('query_stats')} (epoch {key} NOT NULL, query_id {key} NOT NULL, "
            f'"user" {key}, item {key}, clicks {key}, popularity_rank {key}, page_rank {key}, '
            f"PRIMARY KEY (epoch, query_id))",
            f"CREATE TABLE IF NOT EXISTS {self._table('deliveries')} (epoch {key} PRIMARY KEY, "
            f"incarnation {key} NOT NULL, rows {key} NOT NULL)",
        ])

    @classmethod
    def for_dag(cls, durable_uri: str, dag_id: str) -> QueryStatsStore:
        """``$FALKIRK_QUERY_DB`` (see the module docstring), or ``{durable}/{dag_id}/query_stats.sqlite``
        when the durable tier is a local path."""
        return cls(*database_of_dag(durable_uri, dag_id, "query_stats.sqlite", "the query statistics (SQLite)"))

    def deliver(self, epoch: int, incarnation: int, rows: Iterable[Mapping[str, int]]) -> None:
        """Replace epoch ``epoch``'s statistics with ``rows`` atomically."""
        values = [(epoch, *(r[c] for c in COLUMNS)) for r in rows]
        mark = "%s" if self.postgres else "?"
        upsert = (f"INSERT INTO {self._table('deliveries')} (epoch, incarnation, rows) VALUES ({mark}, {mark}, {mark}) "
                  f"ON CONFLICT (epoch) DO UPDATE SET incarnation = excluded.incarnation, rows = excluded.rows")
        self._run([(f"DELETE FROM {self._table('query_stats')} WHERE epoch = {mark}", [(epoch,)]),
                   (f"INSERT INTO {self._table('query_stats')} (epoch, {_QUOTED}) VALUES "
                    f"({', '.join([mark] * (len(COLUMNS) + 1))})", values),
                   (upsert, [(epoch, incarnation, len(values))])])

    def rows(self) -> list[tuple]:
        return self._query(f"SELECT epoch, {_QUOTED} FROM {self._table('query_stats')} ORDER BY epoch, query_id")

    def deliveries(self) -> list[tuple]:
        return self._query(f"SELECT epoch, incarnation, rows FROM {self._table('deliveries')} ORDER BY epoch")

    def duplicates(self) -> list[tuple]:
        """(epoch, query_id, count) of any statistic held more than once (none, by the primary key)."""
        return self._query(f"SELECT epoch, query_id, COUNT(*) FROM {self._table('query_stats')} "
                           f"GROUP BY epoch, query_id HAVING COUNT(*) > 1")
