"""Where ``deliver`` commits: the SQL table ``samples`` and the Delta table ``delivered``, one
transaction in each per batch the marker gate releases.

A row's key is (epoch, key): a batch replaces the rows it carries, so a retry or a
re-delivery after a recovery never adds a row twice; :meth:`SampleTargets.finish` then drops
an epoch's rows that the latest delivery did not carry (none, when the producer's
determinants were saved).

Each delivery of an epoch is named ``"incarnation.try"`` (``"0.1"``), and the newest one
fences the older ones off: an attempt that lives on after its worker was lost, or whose epoch
a recovery has redone since, has its next transaction refused (:class:`Superseded`) instead
of writing over the newer delivery's rows. A batch goes to Delta while its SQL transaction
holds the epoch's fence row, so a newer delivery begins either before the batch (which is then
refused) or after both targets have it.

>>> import tempfile, os
>>> root = tempfile.mkdtemp()
>>> targets = SampleTargets(SampleTable(os.path.join(root, "s.sqlite")), os.path.join(root, "delivered"))
>>> targets.commit(1, "0.1", [{"key": "1-3", "value": 3042, "chunk": 1}])
>>> targets.commit(1, "1.2", [{"key": "1-3", "value": 3042, "chunk": 1}, {"key": "1-5", "value": 5001, "chunk": 2}])
>>> targets.finish(1, "1.2", {"1-5"})
1
>>> targets.sql.rows(), sorted((r["key"], r["value"]) for r in targets.delta_rows())
([(1, '1-5', 5001, 2)], [('1-5', 5001)])
>>> try:
...     targets.commit(1, "0.1", [{"key": "1-3", "value": 3999, "chunk": 1}])  # the older delivery lives on
... except Superseded as refused:
...     print(refused)
delivery 0.1 of epoch 1 is refused: delivery 1.2 of that epoch has begun since (a retry, or a recovery's redo), \
and its rows stand
>>> targets.sql.rows(), sorted((r["key"], r["value"]) for r in targets.delta_rows())
([(1, '1-5', 5001, 2)], [('1-5', 5001)])
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from falkirk.policies.store.commits import open_table, retry_lost_races, scan
from falkirk.spark_jobs.sql_database import SqlDatabase, database_of_dag

DELTA = pa.schema([("epoch", pa.int64()), ("key", pa.string()), ("value", pa.int64()), ("chunk", pa.int64()),
                   ("delivery", pa.string()), ("committed_at", pa.float64())])


class Superseded(RuntimeError):
    """A newer delivery of the epoch has begun: this one's transactions are refused."""


def rank(delivery: str) -> tuple[int, int]:
    """(incarnation, try) of a delivery named ``"incarnation.try"``: later deliveries rank higher.

    >>> rank("0.3") < rank("1.2")
    True
    """
    incarnation, _, attempt = delivery.partition(".")
    if not incarnation.isdigit() or not attempt.isdigit():
        raise ValueError(f"delivery={delivery!r}: name it 'INCARNATION.TRY', e.g. '0.1'")
    return int(incarnation), int(attempt)


class SampleTable(SqlDatabase):
    """``samples`` (epoch, key, value, chunk, delivery, committed_at) and ``sample_transactions``
    (epoch, delivery, n, rows, committed_at): one row per transaction, ``delivery`` naming the
    task instance's incarnation and try (``"0.1"``), ``n`` counting its transactions."""

    def __init__(self, location: str, schema: str = "public") -> None:
        super().__init__(location, schema)
        i = self.integer
        self._create([
            f"CREATE TABLE IF NOT EXISTS {self._table('samples')} (epoch {i} NOT NULL, key TEXT NOT NULL, "
            f"value {i} NOT NULL, chunk {i} NOT NULL, delivery TEXT NOT NULL, committed_at DOUBLE PRECISION NOT NULL, "
            f"PRIMARY KEY (epoch, key))",
            f"CREATE TABLE IF NOT EXISTS {self._table('sample_transactions')} (epoch {i} NOT NULL, "
            f"delivery TEXT NOT NULL, n {i} NOT NULL, rows {i} NOT NULL, committed_at DOUBLE PRECISION NOT NULL, "
            f"PRIMARY KEY (epoch, delivery, n))",
            f"CREATE TABLE IF NOT EXISTS {self._table('sample_deliveries')} (epoch {i} NOT NULL PRIMARY KEY, "
            f"incarnation {i} NOT NULL, try_number {i} NOT NULL)",
        ])

    @classmethod
    def for_dag(cls, durable_uri: str, dag_id: str) -> SampleTable:
        """``$FALKIRK_QUERY_DB`` (:mod:`falkirk.spark_jobs.sql_database`), or
        ``{durable}/{dag_id}/samples.sqlite`` when the durable tier is a local path."""
        return cls(*database_of_dag(durable_uri, dag_id, "samples.sqlite", "the sampled rows (SQLite)"))

    @contextmanager
    def delivering(self, epoch: int, delivery: str) -> Iterator[Any]:
        """A transaction of ``delivery`` of epoch ``epoch`` (a cursor), which makes it the epoch's
        newest delivery, or raises :class:`Superseded` if a newer one has begun. It holds the
        epoch's fence row until it ends: a newer delivery waits for it to commit."""
        mine, m, fences = rank(delivery), self.mark, self._table("sample_deliveries")
        with self._transaction() as cursor:
            # Locks the row (PostgreSQL locks it even where the WHERE keeps a newer delivery's).
            cursor.execute(f"INSERT INTO {fences} (epoch, incarnation, try_number) VALUES ({m}, {m}, {m}) "
                           f"ON CONFLICT (epoch) DO UPDATE SET incarnation = excluded.incarnation, try_number = "
                           f"excluded.try_number WHERE (sample_deliveries.incarnation, sample_deliveries.try_number) "
                           f"< (excluded.incarnation, excluded.try_number)", (epoch, *mine))
            cursor.execute(f"SELECT incarnation, try_number FROM {fences} WHERE epoch = {m}", (epoch,))
            newest = tuple(cursor.fetchone())
            if newest > mine:
                raise Superseded(f"delivery {delivery} of epoch {epoch} is refused: delivery {newest[0]}.{newest[1]} "
                                 f"of that epoch has begun since (a retry, or a recovery's redo), and its rows stand")
            yield cursor

    def commit(self, epoch: int, delivery: str, n: int, rows: list[dict], at: float) -> None:
        """One transaction: ``rows`` replace those of the same keys, and the transaction's own row."""
        with self.delivering(epoch, delivery) as cursor:
            self.write(cursor, epoch, delivery, n, rows, at)

    def write(self, cursor: Any, epoch: int, delivery: str, n: int, rows: list[dict], at: float) -> None:
        """:meth:`commit`'s statements, in a transaction of :meth:`delivering`."""
        m = self.mark
        self._execute(cursor, [
            (f"INSERT INTO {self._table('samples')} (epoch, key, value, chunk, delivery, committed_at) VALUES "
             f"({m}, {m}, {m}, {m}, {m}, {m}) ON CONFLICT (epoch, key) DO UPDATE SET value = excluded.value, "
             f"chunk = excluded.chunk, delivery = excluded.delivery, committed_at = excluded.committed_at",
             [(epoch, r["key"], r["value"], r["chunk"], delivery, at) for r in rows]),
            (f"INSERT INTO {self._table('sample_transactions')} (epoch, delivery, n, rows, committed_at) VALUES "
             f"({m}, {m}, {m}, {m}, {m}) ON CONFLICT (epoch, delivery, n) DO NOTHING",
             [(epoch, delivery, n, len(rows), at)]),
        ])

    def keep_only(self, epoch: int, keys: set[str], delivery: str) -> int:
        """Delete epoch ``epoch``'s rows whose key is not in ``keys``, as ``delivery``; returns how many."""
        with self.delivering(epoch, delivery) as cursor:
            return self.drop_others(cursor, epoch, keys)

    def drop_others(self, cursor: Any, epoch: int, keys: set[str]) -> int:
        """:meth:`keep_only`'s statements, in a transaction of :meth:`delivering`."""
        cursor.execute(f"SELECT key FROM {self._table('samples')} WHERE epoch = {self.mark}", (epoch,))
        stale = [k for (k,) in cursor.fetchall() if k not in keys]
        self._execute(cursor, [(f"DELETE FROM {self._table('samples')} WHERE epoch = {self.mark} AND key = "
                                f"{self.mark}", [(epoch, k) for k in stale])])
        return len(stale)

    def rows(self, epoch: int | None = None) -> list[tuple]:
        """(epoch, key, value, chunk) in key order."""
        where = "" if epoch is None else f" WHERE epoch = {int(epoch)}"
        return self._query(f"SELECT epoch, key, value, chunk FROM {self._table('samples')}{where} ORDER BY epoch, key")

    def with_commit_times(self, epoch: int) -> list[tuple]:
        """(key, chunk, delivery, committed_at) of epoch ``epoch``'s rows."""
        return self._query(f"SELECT key, chunk, delivery, committed_at FROM {self._table('samples')} "
                           f"WHERE epoch = {int(epoch)} ORDER BY key")

    def transactions(self, epoch: int | None = None) -> list[tuple]:
        """(epoch, delivery, n, rows, committed_at) in commit order."""
        where = "" if epoch is None else f" WHERE epoch = {int(epoch)}"
        return self._query(f"SELECT epoch, delivery, n, rows, committed_at FROM "
                           f"{self._table('sample_transactions')}{where} ORDER BY committed_at")


class SampleTargets:
    """Both targets; each :meth:`commit` is one Delta commit inside one SQL transaction."""

    def __init__(self, sql: SampleTable, delta_uri: str) -> None:
        self.sql, self.delta_uri = sql, delta_uri
        self.counts: dict[tuple[int, str], int] = {}

    def commit(self, epoch: int, delivery: str, rows: list[dict]) -> None:
        n = self.counts[epoch, delivery] = self.counts.get((epoch, delivery), 0) + 1
        at = time.time()
        batch = pa.Table.from_pylist([{"epoch": epoch, "key": r["key"], "value": r["value"], "chunk": r["chunk"],
                                       "delivery": delivery, "committed_at": at} for r in rows], schema=DELTA)
        with self.sql.delivering(epoch, delivery) as cursor:
            self.sql.write(cursor, epoch, delivery, n, rows, at)
            # Another epoch's delivery may commit between this one's read and its commit: the
            # merge is an upsert by (epoch, key), so it is read and run again, as delta-rs asks.
            retry_lost_races(lambda: self._merge(batch), uri=self.delta_uri)

    def _merge(self, batch: pa.Table) -> None:
        table = open_table(self.delta_uri)
        if table is None:  # the first batch creates the table; a creation that lost a race merges
            write_deltalake(self.delta_uri, batch, mode="error")
            return
        (table.merge(batch, predicate="t.epoch = s.epoch AND t.key = s.key", source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())

    def finish(self, epoch: int, delivery: str, keys: set[str]) -> int:
        """Drop epoch ``epoch``'s rows ``delivery`` did not carry, from both targets."""
        with self.sql.delivering(epoch, delivery) as cursor:
            dropped = self.sql.drop_others(cursor, epoch, keys)
            stale = {r["key"] for r in self.delta_rows(epoch)} - keys
            if stale:
                quoted = ", ".join("'" + k.replace("'", "''") + "'" for k in sorted(stale))
                DeltaTable(self.delta_uri).delete(f"epoch = {int(epoch)} AND key IN ({quoted})")
        return dropped

    def delta_rows(self, epoch: int | None = None) -> list[dict]:
        table = open_table(self.delta_uri)
        if table is None:
            return []
        return scan(table, where={} if epoch is None else {"epoch": epoch}).to_pylist()
