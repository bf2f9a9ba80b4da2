"""A SQL database a job delivers to, SQLite or PostgreSQL, with each statement list run as one
transaction. The reference applications' SQL tables (query statistics, sampled rows) live in it.

Where it lives: ``FALKIRK_QUERY_DB``, either a file path (SQLite; ``{dag_id}`` in it is
replaced) or a ``postgresql://`` URL, where each DAG's tables are in a schema named after
the DAG. Without it, a SQLite file beside the DAG's tables when the durable tier is local.

>>> import tempfile, os
>>> db = SqlDatabase(os.path.join(tempfile.mkdtemp(), "x.sqlite"))
>>> db._run(["CREATE TABLE t (a INTEGER)", ("INSERT INTO t VALUES (?)", [(1,), (2,)])])
>>> db._query("SELECT SUM(a) FROM t")
[(3,)]
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from falkirk.spark_jobs.figure1 import local_file

DB_ENV = "FALKIRK_QUERY_DB"
_POSTGRES = ("postgresql://", "postgres://")


def database_of_dag(durable_uri: str, dag_id: str, file_name: str, holds: str) -> tuple[str, str]:
    """(location, schema) of DAG ``dag_id``'s database: ``$FALKIRK_QUERY_DB`` (see the module
    docstring), or ``{durable}/{dag_id}/{file_name}`` when the durable tier is a local path."""
    configured = os.environ.get(DB_ENV, "")
    if configured.startswith(_POSTGRES):
        return configured, dag_id
    return local_file(DB_ENV, durable_uri, dag_id, file_name, holds), "public"


class SqlDatabase:
    """One SQLite file at ``location``, or schema ``schema`` of the PostgreSQL database a
    ``postgresql://`` URL names."""

    def __init__(self, location: str, schema: str = "public") -> None:
        self.location = location
        self.postgres = location.startswith(_POSTGRES)
        if self.postgres and not schema.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"schema={schema!r}: name a PostgreSQL schema with letters, digits, '_' and '-'")
        self.schema = schema
        self.integer = "BIGINT" if self.postgres else "INTEGER"
        self.mark = "%s" if self.postgres else "?"  # a parameter in a statement

    @property
    def path(self) -> str:
        """The SQLite file (for a PostgreSQL database, its URL)."""
        return self.location

    def _create(self, tables: list[str]) -> None:
        """Run ``CREATE TABLE IF NOT EXISTS`` statements in one transaction, in this database's
        schema (created first on PostgreSQL)."""
        self._run([*([f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"'] if self.postgres else []), *tables])

    def _table(self, name: str) -> str:
        return f'"{self.schema}".{name}' if self.postgres else name

    def _connect(self) -> Any:
        if self.postgres:
            import psycopg2

            return psycopg2.connect(self.location)
        return sqlite3.connect(self.location, timeout=60, isolation_level=None)

    def _run(self, statements: list[str | tuple[str, list[tuple]]]) -> None:
        """Run ``statements`` (SQL, or SQL with rows of parameters) in one transaction."""
        with self._transaction() as cursor:
            self._execute(cursor, statements)

    @staticmethod
    def _execute(cursor: Any, statements: list[str | tuple[str, list[tuple]]]) -> None:
        for statement in statements:
            sql, params = (statement, None) if isinstance(statement, str) else statement
            if params is None:
                cursor.execute(sql)
            elif params:
                cursor.executemany(sql, params)

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """One transaction: a cursor, committed when the block ends and rolled back if it raises.
        On SQLite it holds the file's write lock throughout (``BEGIN IMMEDIATE``)."""
        db = self._connect()
        try:
            cursor = db.cursor()
            if not self.postgres:
                cursor.execute("BEGIN IMMEDIATE")
            yield cursor
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
