"""Where ``deliver`` commits: the SQL table ``samples`` and the Delta table ``delivered``, one
transaction in each per batch the marker gate releases.

A row's key is (epoch, key): a batch replaces the rows it carries, so a retry or a
re-delivery after a recovery never adds a row twice; :meth:`SampleTargets.finish` then drops
an epoch's rows that the latest delivery did not carry (none, when the producer's
determinants were saved).

>>> import tempfile, os
>>> root = tempfile.mkdtemp()
>>> targets = SampleTargets(SampleTable(os.path.join(root, "s.sqlite")), os.path.join(root, "delivered"))
>>> targets.commit(1, "0.1", [{"key": "1-3", "value": 3042, "chunk": 1}])
>>> targets.commit(1, "0.1", [{"key": "1-3", "value": 3042, "chunk": 1}, {"key": "1-5", "value": 5001, "chunk": 2}])
>>> targets.finish(1, {"1-5"})
1
>>> targets.sql.rows(), sorted((r["key"], r["value"]) for r in targets.delta_rows())
([(1, '1-5', 5001, 2)], [('1-5', 5001)])
"""

from __future__ import annotations

import time

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from falkirk.policies.store.commits import open_table, retry_lost_races, scan
from falkirk.spark_jobs.sql_database import SqlDatabase, database_of_dag

DELTA = pa.schema([("epoch", pa.int64()), ("key", pa.string()), ("value", pa.int64()), ("chunk", pa.int64()),
                   ("delivery", pa.string()), ("committed_at", pa.float64())])


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
        ])

    @classmethod
    def for_dag(cls, durable_uri: str, dag_id: str) -> "SampleTable":
        """``$FALKIRK_QUERY_DB`` (:mod:`falkirk.spark_jobs.sql_database`), or
        ``{durable}/{dag_id}/samples.sqlite`` when the durable tier is a local path."""
        return cls(*database_of_dag(durable_uri, dag_id, "samples.sqlite", "the sampled rows (SQLite)"))

    def commit(self, epoch: int, delivery: str, n: int, rows: list[dict], at: float) -> None:
        """One transaction: ``rows`` replace those of the same keys, and the transaction's own row."""
        m = self.mark
        self._run([
            (f"INSERT INTO {self._table('samples')} (epoch, key, value, chunk, delivery, committed_at) VALUES "
             f"({m}, {m}, {m}, {m}, {m}, {m}) ON CONFLICT (epoch, key) DO UPDATE SET value = excluded.value, "
             f"chunk = excluded.chunk, delivery = excluded.delivery, committed_at = excluded.committed_at",
             [(epoch, r["key"], r["value"], r["chunk"], delivery, at) for r in rows]),
            (f"INSERT INTO {self._table('sample_transactions')} (epoch, delivery, n, rows, committed_at) VALUES "
             f"({m}, {m}, {m}, {m}, {m}) ON CONFLICT (epoch, delivery, n) DO NOTHING",
             [(epoch, delivery, n, len(rows), at)]),
        ])

    def keep_only(self, epoch: int, keys: set[str]) -> int:
        """Delete epoch ``epoch``'s rows whose key is not in ``keys``; returns how many."""
        stale = [k for (k,) in self._query(f"SELECT key FROM {self._table('samples')} WHERE epoch = {int(epoch)}")
                 if k not in keys]
        if stale:
            self._run([(f"DELETE FROM {self._table('samples')} WHERE epoch = {self.mark} AND key = {self.mark}",
                        [(epoch, k) for k in stale])])
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
    """Both targets; each :meth:`commit` is one SQL transaction, then one Delta commit."""

    def __init__(self, sql: SampleTable, delta_uri: str) -> None:
        self.sql, self.delta_uri = sql, delta_uri
        self.counts: dict[tuple[int, str], int] = {}

    def commit(self, epoch: int, delivery: str, rows: list[dict]) -> None:
        n = self.counts[epoch, delivery] = self.counts.get((epoch, delivery), 0) + 1
        at = time.time()
        self.sql.commit(epoch, delivery, n, rows, at)
        batch = pa.Table.from_pylist([{"epoch": epoch, "key": r["key"], "value": r["value"], "chunk": r["chunk"],
                                       "delivery": delivery, "committed_at": at} for r in rows], schema=DELTA)
        # Another delivery may commit between this one's read and its commit (an attempt whose
        # worker was lost still running, or another epoch's): the merge is an upsert by (epoch,
        # key), so it is read and run again, as delta-rs asks.
        retry_lost_races(lambda: self._merge(batch), uri=self.delta_uri)

    def _merge(self, batch: pa.Table) -> None:
        table = open_table(self.delta_uri)
        if table is None:  # the first batch creates the table; a creation that lost a race merges
            write_deltalake(self.delta_uri, batch, mode="error")
            return
        (table.merge(batch, predicate="t.epoch = s.epoch AND t.key = s.key", source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())

    def finish(self, epoch: int, keys: set[str]) -> int:
        """Drop epoch ``epoch``'s rows the latest delivery did not carry, from both targets."""
        dropped = self.sql.keep_only(epoch, keys)
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
