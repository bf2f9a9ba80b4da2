"""A non-deterministic producer feeding a transactional sink inside one epoch, with marker pairs
(:mod:`falkirk.policies.marker_pairs` for the protocol, :mod:`falkirk.spark_jobs.marker_edge` for the
edge; Fast Travellers). It runs outside Airflow; ``dags/falkirk_sampled.py`` runs the same protocol as two tasks.

``draw`` samples its epoch chunk by chunk (Spark's ``sample`` and ``rand`` without a seed: a
second run draws other rows) and streams each chunk's rows to the sink as it goes, in band,
in small commits to the **edge** table (rows in order, ``seq``). After a chunk's rows are sent
it saves them, the chunk's determinants, to the **determinants** table (one commit), and then
announces it twice: a fast traveller ``ft_i`` out of band (a row of the **fast** table, which
the sink polls) and a slow traveller ``st_i`` in band (an edge row after the chunk's data).

``deliver`` reads the edge in order into a :class:`~falkirk.policies.marker_pairs.MarkerGate`
whose capacity is the largest transaction it may make, and commits to a SQLite table
whatever the gate allows, as soon as it allows it: with marker pairs, a chunk's rows once its
``ft`` arrived, long before the epoch ends; with slow travellers only, a chunk larger than a
transaction can never be committed (the gate fills before its ``st`` can enter), and the
sink reports the stall and what it holds.

A ``draw`` attempt that dies is followed by one that replays: chunks whose determinants are
saved are not drawn again (their rows and markers are already in the edge, exactly as first
sent); the rest are. Before sending, the new attempt deletes from the edge the rows of
chunks it will draw again and says so out of band (a ``rewind`` row); the sink then forgets
those rows if it buffered them. It never committed them: no marker covered them.

Run with ``python -m falkirk.spark_jobs.travellers draw|deliver --root DIR --epoch N``
(``SPARK_REMOTE`` for a Spark Connect server). Local directories only.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from falkirk.spark_jobs import channels
from falkirk.spark_jobs.faults import crash_point
from falkirk.spark_jobs.job_log import say
from falkirk.spark_jobs.marker_edge import EdgeTables, MarkerEdge, Markers, Stalled, receive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CHUNKS = int(os.environ.get("FALKIRK_TRAVELLER_CHUNKS", "4"))
KEYS_PER_CHUNK = int(os.environ.get("FALKIRK_TRAVELLER_KEYS", "40"))
DETERMINANTS = pa.schema([("epoch", pa.int64()), ("chunk", pa.int64()), ("key", pa.string()), ("value", pa.int64())])


@dataclass(frozen=True)
class Layout:
    root: str

    def table(self, name: str) -> str:
        return os.path.join(self.root, "travellers", name)

    @property
    def edge(self) -> EdgeTables:
        return EdgeTables(self.table("edge"), self.table("fast"))

    @property
    def database(self) -> str:
        return os.path.join(self.root, "travellers", "sink.db")


# -- the producer -----------------------------------------------------------------------------------------

def draw(spark: SparkSession, layout: Layout, epoch: int, markers: Markers = "pairs",
         deterministic: bool = False) -> None:
    """Draw epoch ``epoch`` chunk by chunk, streaming it to the edge; see the module docstring.

    ``deterministic=True`` is the mistake the protocol exists for: the task is treated as
    deterministic, so nothing is saved and a new attempt draws every chunk again.
    """
    from pyspark.sql import functions as F

    determinants = [] if deterministic else channels.rows(layout.table("determinants"), epoch=epoch)
    saved = {r["chunk"] for r in determinants}
    logged = max((c for c in range(1, CHUNKS + 1) if all(k in saved for k in range(1, c + 1))), default=0)
    edge = MarkerEdge(layout.edge, epoch, CHUNKS, markers)
    edge.start([[r for r in determinants if r["chunk"] == c] for c in range(1, logged + 1)])
    if logged:
        say(f"draw epoch {epoch}: attempt {edge.attempt} replays chunks 1-{logged} from their determinants")
    for chunk in range(logged + 1, CHUNKS + 1):
        crash_point("draws", epoch, f"chunk-{chunk}")
        keys = spark.range(KEYS_PER_CHUNK).select(
            F.concat_ws("-", F.lit(str(epoch)), F.lit(str(chunk)), F.col("id").cast("string")).alias("key"),
            F.col("id"))
        drawn = keys.sample(fraction=0.5).select("key", (F.col("id") * 1000 + F.floor(F.rand() * 1000))
                                                 .cast("long").alias("value"))
        rows = sorted(drawn.toArrow().to_pylist(), key=lambda r: r["key"])
        edge.send(chunk, rows)  # in band as soon as drawn, before it is saved
        crash_point("draws", epoch, f"chunk-{chunk}-after-files")
        if not deterministic:
            saved_rows = pa.Table.from_pylist([{"epoch": epoch, "chunk": chunk, **r} for r in rows], schema=DETERMINANTS)
            channels.replace(layout.table("determinants"), saved_rows, epoch=epoch, chunk=chunk)
        edge.saved(chunk)
    say(f"draw epoch {epoch}: done (attempt {edge.attempt})")


# -- the sink ---------------------------------------------------------------------------------------------

def open_sink(layout: Layout) -> sqlite3.Connection:
    os.makedirs(os.path.dirname(layout.database), exist_ok=True)
    db = sqlite3.connect(layout.database, timeout=30)
    db.executescript("""
        CREATE TABLE IF NOT EXISTS delivered (epoch INTEGER, key TEXT, value INTEGER, chunk INTEGER,
                                              txn INTEGER, sent_at REAL, PRIMARY KEY (epoch, key));
        CREATE TABLE IF NOT EXISTS transactions (txn INTEGER PRIMARY KEY, epoch INTEGER, rows INTEGER,
                                                 committed_at REAL);
    """)
    return db


def deliver(layout: Layout, epoch: int, capacity: int, markers: Markers = "pairs") -> int:
    """Commit epoch ``epoch``'s rows to SQLite in transactions of at most ``capacity`` rows, as
    the gate allows; returns the number of transactions. Raises :class:`Stalled`."""
    db = open_sink(layout)

    def commit(rows: list[dict]) -> None:  # one transaction: the rows and the transaction's own row
        with db:
            txn = db.execute("SELECT COALESCE(MAX(txn), 0) + 1 FROM transactions").fetchone()[0]
            db.executemany("INSERT OR REPLACE INTO delivered VALUES (?, ?, ?, ?, ?, ?)",
                           [(epoch, r["key"], r["value"], r["chunk"], txn, r["sent_at"]) for r in rows])
            db.execute("INSERT INTO transactions VALUES (?, ?, ?, ?)", (txn, epoch, len(rows), time.time()))

    return receive(layout.edge, epoch, CHUNKS, capacity, commit, markers, who="deliver")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m falkirk.spark_jobs.travellers")
    parser.add_argument("role", choices=["draw", "deliver"])
    parser.add_argument("--root", required=True)
    parser.add_argument("--epoch", type=int, required=True)
    parser.add_argument("--markers", choices=["pairs", "slow", "epoch"], default="pairs",
                        help="pairs (ft and st per chunk), slow (st per chunk), epoch (one st per epoch)")
    parser.add_argument("--capacity", type=int, default=8, help="deliver: the largest transaction, in rows")
    parser.add_argument("--assume-deterministic", action="store_true",
                        help="draw: save no determinants (wrong for this task: a negative control)")
    args = parser.parse_args(argv)
    layout = Layout(args.root)
    if args.role == "draw":
        draw(channels.spark_session(), layout, args.epoch, args.markers, args.assume_deterministic)
        return 0
    try:
        deliver(layout, args.epoch, args.capacity, args.markers)
    except Stalled as exc:
        say(str(exc))
        return 3
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())
