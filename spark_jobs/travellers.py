"""A non-deterministic producer feeding a transactional sink inside one epoch, with marker pairs
(:mod:`falkirk.policies.marker_pairs` for the protocol; spec §6).

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
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from falkirk.policies.marker_pairs import Data, FastTraveller, MarkerGate, SlowTraveller
from falkirk.policies.store.commits import open_table
from falkirk.spark_jobs import channels
from falkirk.spark_jobs.faults import crash_point
from falkirk.spark_jobs.job_log import say

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CHUNKS = int(os.environ.get("FALKIRK_TRAVELLER_CHUNKS", "4"))
KEYS_PER_CHUNK = int(os.environ.get("FALKIRK_TRAVELLER_KEYS", "40"))
SEND_BATCH = int(os.environ.get("FALKIRK_TRAVELLER_BATCH", "5"))  # rows per in-band commit while a chunk is drawn
STALL_SECONDS = 20.0

EDGE = pa.schema([("epoch", pa.int64()), ("seq", pa.int64()), ("attempt", pa.int64()), ("kind", pa.string()),
                  ("chunk", pa.int64()), ("key", pa.string()), ("value", pa.int64()), ("sent_at", pa.float64())])
FAST = pa.schema([("epoch", pa.int64()), ("attempt", pa.int64()), ("kind", pa.string()), ("chunk", pa.int64()),
                  ("seq", pa.int64())])
DETERMINANTS = pa.schema([("epoch", pa.int64()), ("chunk", pa.int64()), ("key", pa.string()), ("value", pa.int64())])


class Stalled(RuntimeError):
    """The sink can neither commit nor take anything in: slow travellers behind a full transaction."""


@dataclass(frozen=True)
class Layout:
    root: str

    def table(self, name: str) -> str:
        return os.path.join(self.root, "travellers", name)

    @property
    def database(self) -> str:
        return os.path.join(self.root, "travellers", "sink.db")


# -- the producer -----------------------------------------------------------------------------------------

def draw(spark: "SparkSession", layout: Layout, epoch: int, markers: str = "pairs",
         deterministic: bool = False) -> None:
    """Draw epoch ``epoch`` chunk by chunk, streaming it to the edge; see the module docstring.

    ``deterministic=True`` is the mistake the protocol exists for: the task is treated as
    deterministic, so nothing is saved and a new attempt draws every chunk again.
    """
    from pyspark.sql import functions as F

    edge, fast = layout.table("edge"), layout.table("fast")
    determinants = channels.rows(layout.table("determinants"), epoch=epoch)
    saved = set() if deterministic else {r["chunk"] for r in determinants}
    logged = max((c for c in range(1, CHUNKS + 1) if all(k in saved for k in range(1, c + 1))), default=0)
    sent = channels.rows(edge, epoch=epoch)
    attempt = 1 + max((r["attempt"] for r in sent), default=0)
    seq = 1 + max((r["seq"] for r in sent), default=0)
    if sent:
        # A previous attempt died: keep what saved determinants vouch for, draw the rest again.
        fast_rows = [{"epoch": epoch, "attempt": attempt, "kind": "rewind", "chunk": logged, "seq": seq}]
        channels.append(fast, fast_rows, FAST)
        dropped = sum(1 for r in sent if r["chunk"] > logged)
        if dropped:
            open_table(edge).delete(f"epoch = {epoch} AND chunk > {logged}")
        replayed = f"replays chunks 1-{logged} from their determinants (already sent)" if logged else "has nothing saved"
        redrawn = f"draws chunks {logged + 1}-{CHUNKS} again" if logged < CHUNKS else "has nothing to draw"
        say(f"draw epoch {epoch}: attempt {attempt} {replayed} and {redrawn} ({dropped} unvouched rows withdrawn)")
        if logged and not any(r["kind"] == "st" and r["chunk"] == logged for r in sent):
            seq = _announce(layout, epoch, attempt, logged, seq, markers)
    elif logged:
        # The edge lost the epoch after its chunks were saved (a recovery): send them again, as saved.
        for chunk in range(1, logged + 1):
            rows = sorted(({"key": r["key"], "value": r["value"]} for r in determinants if r["chunk"] == chunk),
                          key=lambda r: r["key"])
            seq = _send(layout, epoch, attempt, chunk, rows, seq)
            seq = _announce(layout, epoch, attempt, chunk, seq, markers)
        say(f"draw epoch {epoch}: chunks 1-{logged} sent again from their determinants, as first drawn")
    for chunk in range(logged + 1, CHUNKS + 1):
        crash_point("draws", epoch, f"chunk-{chunk}")
        keys = spark.range(KEYS_PER_CHUNK).select(
            F.concat_ws("-", F.lit(str(epoch)), F.lit(str(chunk)), F.col("id").cast("string")).alias("key"),
            F.col("id"))
        drawn = keys.sample(fraction=0.5).select("key", (F.col("id") * 1000 + F.floor(F.rand() * 1000))
                                                 .cast("long").alias("value"))
        rows = sorted(drawn.toArrow().to_pylist(), key=lambda r: r["key"])
        seq = _send(layout, epoch, attempt, chunk, rows, seq)  # in band as soon as drawn, before it is saved
        crash_point("draws", epoch, f"chunk-{chunk}-after-files")
        if not deterministic:
            saved_rows = pa.Table.from_pylist([{"epoch": epoch, "chunk": chunk, **r} for r in rows], schema=DETERMINANTS)
            channels.replace(layout.table("determinants"), saved_rows, epoch=epoch, chunk=chunk)
        seq = _announce(layout, epoch, attempt, chunk, seq, markers)
    say(f"draw epoch {epoch}: done (attempt {attempt})")


def _send(layout: Layout, epoch: int, attempt: int, chunk: int, rows: list[dict], seq: int) -> int:
    """Chunk ``chunk``'s rows in band, SEND_BATCH rows per commit; returns the next seq."""
    for start in range(0, len(rows), SEND_BATCH):
        batch = rows[start:start + SEND_BATCH]
        channels.append(layout.table("edge"), [{"epoch": epoch, "seq": seq + i, "attempt": attempt, "kind": "data",
                                        "chunk": chunk, "key": r["key"], "value": r["value"], "sent_at": time.time()}
                                       for i, r in enumerate(batch)], EDGE)
        seq += len(batch)
    return seq


def _announce(layout: Layout, epoch: int, attempt: int, chunk: int, seq: int, markers: str) -> int:
    """Chunk ``chunk``'s determinants are saved: ft out of band (marker pairs), st in band
    (``markers="epoch"``: only after the last chunk, so the sink commits once per epoch)."""
    if markers == "epoch" and chunk < CHUNKS:
        return seq
    if markers == "pairs":
        channels.append(layout.table("fast"), [{"epoch": epoch, "attempt": attempt, "kind": "ft", "chunk": chunk, "seq": seq}],
                FAST)
    channels.append(layout.table("edge"), [{"epoch": epoch, "seq": seq, "attempt": attempt, "kind": "st", "chunk": chunk,
                                    "key": None, "value": None, "sent_at": time.time()}], EDGE)
    return seq + 1


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


def deliver(layout: Layout, epoch: int, capacity: int, markers: str = "pairs") -> int:
    """Commit epoch ``epoch``'s rows to SQLite in transactions of at most ``capacity`` rows, as
    the gate allows; returns the number of transactions. Raises :class:`Stalled`."""
    gate = MarkerGate(capacity, "pairs" if markers == "pairs" else "slow")
    db = open_sink(layout)
    rows_by_key: dict[str, dict] = {}
    pending: deque[dict] = deque()  # edge rows read but not taken in yet: still in the channel
    rewinds: list[tuple[int, int]] = []  # (attempt, last chunk it keeps) of every rewind read
    cursor, attempt, fast_seen, transactions = 0, 1, 0, 0
    idle_since = time.monotonic()
    while True:
        fast = sorted(channels.rows(layout.table("fast"), epoch=epoch),
                      key=lambda r: (r["attempt"], r["kind"] != "rewind", r["chunk"]))
        for r in fast[fast_seen:]:
            if r["kind"] == "rewind" and r["attempt"] > attempt:
                dropped = gate.forget_after(r["chunk"])
                attempt = r["attempt"]
                rewinds.append((attempt, r["chunk"]))
                pending.clear()  # read the edge again: the dead attempt's unsaved rows are gone from it
                say(f"deliver epoch {epoch}: attempt {attempt} of draw replays through chunk {r['chunk']}; "
                    f"{dropped} buffered rows of later chunks forgotten")
            elif r["kind"] == "ft":
                gate.fast(FastTraveller(r["chunk"]))
        fast_seen = len(fast)
        if not pending:
            pending.extend(sorted((r for r in channels.rows(layout.table("edge"), epoch=epoch) if r["seq"] > cursor),
                                  key=lambda r: r["seq"]))
        moved = False
        while True:  # take in what fits, commit what may be committed, again while either moves
            took = 0
            while pending and pending[0]["attempt"] <= attempt:  # a newer attempt's rows wait for its rewind
                r = pending[0]
                if any(r["attempt"] < a and r["chunk"] > kept for a, kept in rewinds):
                    # withdrawn by a later attempt; a snapshot read before the producer deleted it
                    pending.popleft()
                    cursor = r["seq"]
                    continue
                if not gate.offer(SlowTraveller(r["chunk"]) if r["kind"] == "st" else Data(r["key"], r["chunk"])):
                    break
                pending.popleft()
                if r["kind"] == "data":
                    rows_by_key[r["key"]] = r
                cursor, took = r["seq"], took + 1
            done = gate.commit()
            if done:
                transactions += 1
                _commit(db, epoch, done, rows_by_key)
            if not took and not done:
                break
            moved = True
        if gate.last_st >= CHUNKS and not gate.buffer:  # the last chunk's st is in and all before it committed
            say(f"deliver epoch {epoch}: {transactions} transactions of at most {capacity} rows")
            return transactions
        if moved:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > STALL_SECONDS:
            held = sorted({d.origin for d in gate.buffer if isinstance(d, Data)})
            raise Stalled(f"deliver epoch {epoch}: stalled: the open transaction holds {len(gate.buffer)} of "
                          f"{capacity} rows (chunks {held}) and may commit none of them until the slow "
                          f"traveller of chunk {held[0] if held else '?'} arrives, which waits behind them")
        time.sleep(0.05)


def _commit(db: sqlite3.Connection, epoch: int, done: list[Data], rows_by_key: dict[str, dict]) -> None:
    """One transaction: ``done``'s rows and the transaction's own row."""
    with db:
        txn = db.execute("SELECT COALESCE(MAX(txn), 0) + 1 FROM transactions").fetchone()[0]
        db.executemany("INSERT OR REPLACE INTO delivered VALUES (?, ?, ?, ?, ?, ?)",
                       [(epoch, d.name, rows_by_key[d.name]["value"], d.origin, txn, rows_by_key[d.name]["sent_at"])
                        for d in done])
        db.execute("INSERT INTO transactions VALUES (?, ?, ?, ?)", (txn, epoch, len(done), time.time()))


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
