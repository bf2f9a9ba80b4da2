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

import os
import sqlite3
from typing import Any, Iterable, Mapping

from falkirk.spark_jobs.figure1 import local_file

DB_ENV = "FALKIRK_QUERY_DB"
COLUMNS = ("query_id", "user", "item", "clicks", "popularity_rank", "page_rank")
_POSTGRES = ("postgresql://", "postgres://")
_QUOTED = ", ".join(f'"{c}"' for c in COLUMNS)  # "user" is a reserved word in PostgreSQL


class QueryStatsStore:
    """``query_stats`` (one row per answered query) and ``deliveries``: in one SQLite file at
    ``location``, or in schema ``schema`` of the PostgreSQL database a ``postgresql://`` URL names."""

    def __init__(self, location: str, schema: str = "public") -> None:
        self.location = location
        self.postgres = location.startswith(_POSTGRES)
        if self.postgres and not schema.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"schema={schema!r}: name a PostgreSQL schema with letters, digits, '_' and '-'")
        self.schema = schema
        key = "BIGINT" if self.postgres else "INTEGER"
        self._run([
            *([f'CREATE SCHEMA IF NOT EXISTS "{schema}"'] if self.postgres else []),
            f"CREATE TABLE IF NOT EXISTS {self._table('query_stats')} (epoch {key} NOT NULL, query_id {key} NOT NULL, "
            f'"user" {key}, item {key}, clicks {key}, popularity_rank {key}, page_rank {key}, '
            f"PRIMARY KEY (epoch, query_id))",
            f"CREATE TABLE IF NOT EXISTS {self._table('deliveries')} (epoch {key} PRIMARY KEY, "
            f"incarnation {key} NOT NULL, rows {key} NOT NULL)",
        ])

    @property
    def path(self) -> str:
        """The SQLite file (for a PostgreSQL store, its URL)."""
        return self.location

    @classmethod
    def for_dag(cls, durable_uri: str, dag_id: str) -> "QueryStatsStore":
        """``$FALKIRK_QUERY_DB`` (see the module docstring), or ``{durable}/{dag_id}/query_stats.sqlite``
        when the durable tier is a local path."""
        configured = os.environ.get(DB_ENV, "")
        if configured.startswith(_POSTGRES):
            return cls(configured, schema=dag_id)
        return cls(local_file(DB_ENV, durable_uri, dag_id, "query_stats.sqlite", "the query statistics (SQLite)"))

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

    def _table(self, name: str) -> str:
        return f'"{self.schema}".{name}' if self.postgres else name

    def _connect(self) -> Any:
        if self.postgres:
            import psycopg2

            return psycopg2.connect(self.location)
        return sqlite3.connect(self.location, timeout=60, isolation_level=None)

    def _run(self, statements: list[str | tuple[str, list[tuple]]]) -> None:
        """Run ``statements`` (SQL, or SQL with rows of parameters) in one transaction."""
        db = self._connect()
        try:
            cursor = db.cursor()
            if not self.postgres:
                cursor.execute("BEGIN IMMEDIATE")
            for statement in statements:
                sql, params = (statement, None) if isinstance(statement, str) else statement
                if params is None:
                    cursor.execute(sql)
                elif params:
                    cursor.executemany(sql, params)
            db.commit() if self.postgres else cursor.execute("COMMIT")
        except BaseException:
            db.rollback() if self.postgres else db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def _query(self, sql: str) -> list[tuple]:
        db = self._connect()
        try:
            cursor = db.cursor()
            cursor.execute(sql)
            return [tuple(r) for r in cursor.fetchall()]
        finally:
            db.close()
