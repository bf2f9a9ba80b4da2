"""The query-statistics store: a SQL table its users query directly (SQLite here).

Each epoch's statistics are delivered in one transaction that replaces that epoch's rows
and records the delivery in ``deliveries`` (epoch, incarnation, rows): a retry or a
re-run after a rollback replaces, never adds, so every epoch is in the table exactly once
and matches the answers last delivered.

>>> import tempfile, os
>>> store = QueryStatsStore(os.path.join(tempfile.mkdtemp(), "q.sqlite"))
>>> rows = [{"query_id": 1, "user": 7, "item": 3, "clicks": 5, "popularity_rank": 2, "page_rank": 9}]
>>> store.deliver(1, 0, rows); store.deliver(1, 0, rows); store.deliver(1, 1, rows)
>>> store.rows(), store.deliveries()
([(1, 1, 7, 3, 5, 2, 9)], [(1, 1, 1)])
"""

from __future__ import annotations

import sqlite3
from typing import Iterable, Mapping

from falkirk.spark_jobs.figure1 import local_file

DB_ENV = "FALKIRK_QUERY_DB"
COLUMNS = ("query_id", "user", "item", "clicks", "popularity_rank", "page_rank")


class QueryStatsStore:
    """``query_stats`` (one row per answered query) and ``deliveries`` in one SQLite file."""

    def __init__(self, path: str) -> None:
        self.path = path
        with self._connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS query_stats (epoch INTEGER NOT NULL, query_id INTEGER NOT NULL, "
                       "user INTEGER, item INTEGER, clicks INTEGER, popularity_rank INTEGER, page_rank INTEGER, "
                       "PRIMARY KEY (epoch, query_id))")
            db.execute("CREATE TABLE IF NOT EXISTS deliveries (epoch INTEGER PRIMARY KEY, incarnation INTEGER NOT NULL, "
                       "rows INTEGER NOT NULL)")

    @classmethod
    def for_dag(cls, durable_uri: str, dag_id: str) -> "QueryStatsStore":
        """``$FALKIRK_QUERY_DB`` (``{dag_id}`` in it is replaced), or ``{durable}/{dag_id}/query_stats.sqlite``
        when the durable tier is a local path."""
        return cls(local_file(DB_ENV, durable_uri, dag_id, "query_stats.sqlite", "the query statistics (SQLite)"))

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60, isolation_level=None)

    def deliver(self, epoch: int, incarnation: int, rows: Iterable[Mapping[str, int]]) -> None:
        """Replace epoch ``epoch``'s statistics with ``rows`` atomically."""
        values = [(epoch, *(r[c] for c in COLUMNS)) for r in rows]
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM query_stats WHERE epoch = ?", (epoch,))
            db.executemany(f"INSERT INTO query_stats (epoch, {', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?)", values)
            db.execute("INSERT OR REPLACE INTO deliveries (epoch, incarnation, rows) VALUES (?, ?, ?)",
                       (epoch, incarnation, len(values)))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def rows(self) -> list[tuple]:
        with self._connect() as db:
            return db.execute(f"SELECT epoch, {', '.join(COLUMNS)} FROM query_stats ORDER BY epoch, query_id").fetchall()

    def deliveries(self) -> list[tuple]:
        with self._connect() as db:
            return db.execute("SELECT epoch, incarnation, rows FROM deliveries ORDER BY epoch").fetchall()
