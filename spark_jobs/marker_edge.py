"""An edge with marker pairs: a non-deterministic producer streams its epoch, chunk by chunk,
to a transactional sink that runs beside it (:mod:`falkirk.policies.marker_pairs` for the
protocol; Fast Travellers).

Two Delta tables carry one edge (:class:`EdgeTables`):

* **edge**, in band and in order (``seq``): the data rows of each chunk as they are drawn,
  then the chunk's slow traveller ``st`` once its determinants are saved;
* **control**, out of band: the chunk's fast traveller ``ft`` (written just before its
  ``st``), and a ``rewind`` row when a new attempt of the producer takes over.

The producer's side is :class:`MarkerEdge`; the sink's is :func:`receive`, which feeds a
:class:`~falkirk.policies.marker_pairs.MarkerGate` and hands each transaction the gate allows
to a ``commit`` callback.

A producer attempt that dies leaves rows in the edge that no saved determinant vouches for.
The next attempt (``MarkerEdge.start``) keeps what its saved chunks vouch for, withdraws the
rest and says so out of band (``rewind``); the sink then forgets those rows if it buffered
them (it never committed them: no marker covered them). If the edge was lost after chunks
were saved (scratch lost), the attempt sends the saved chunks again, as saved.

>>> import tempfile
>>> tables = EdgeTables.at(tempfile.mkdtemp())
>>> edge = MarkerEdge(tables, epoch=1, chunks=1); edge.start([])
>>> edge.send(1, [{"key": "a", "value": 1}, {"key": "b", "value": 2}]); edge.saved(1)
>>> got = []
>>> receive(tables, epoch=1, chunks=1, capacity=2, commit=got.append)
2
>>> [[r["key"] for r in t] for t in got]
[['a'], ['b']]

A sink whose edge stays silent while the producer commits the epoch elsewhere stops waiting:

>>> receive(EdgeTables.at(tempfile.mkdtemp()), epoch=1, chunks=1, capacity=2, commit=got.append,
...         finished=lambda: True)
0
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from falkirk.policies.marker_pairs import Data, FastTraveller, MarkerGate, SlowTraveller
from falkirk.policies.store.commits import open_table
from falkirk.spark_jobs import channels
from falkirk.spark_jobs.job_log import say

Markers = Literal["pairs", "slow", "epoch"]
"""``pairs``: an ft and an st per chunk; ``slow``: an st per chunk; ``epoch``: one st per epoch."""

# Rows per in-band commit while a chunk is sent.
SEND_BATCH = int(os.environ.get("FALKIRK_EDGE_BATCH", "5"))
STALL_SECONDS = float(os.environ.get("FALKIRK_EDGE_STALL_SECONDS", "20"))
WAIT_SECONDS = float(os.environ.get("FALKIRK_EDGE_WAIT_SECONDS", "900"))

EDGE = pa.schema([("epoch", pa.int64()), ("seq", pa.int64()), ("attempt", pa.int64()), ("kind", pa.string()),
                  ("chunk", pa.int64()), ("key", pa.string()), ("value", pa.int64()), ("sent_at", pa.float64())])
CONTROL = pa.schema([("epoch", pa.int64()), ("attempt", pa.int64()), ("kind", pa.string()), ("chunk", pa.int64()),
                     ("seq", pa.int64())])


class Stalled(RuntimeError):
    """The sink can neither commit nor take anything in: slow travellers behind a full transaction."""


class ProducerSilent(TimeoutError):
    """Nothing arrived from the producer for ``FALKIRK_EDGE_WAIT_SECONDS``."""


@dataclass(frozen=True)
class EdgeTables:
    """The two tables of one edge (local directories)."""

    edge: str
    control: str

    @classmethod
    def at(cls, directory: str) -> EdgeTables:
        return cls(os.path.join(directory, "edge"), os.path.join(directory, "edge-control"))


class MarkerEdge:
    """The producer's side of an edge for one epoch of ``chunks`` chunks: call :meth:`start`
    once, then for each new chunk :meth:`send` its rows and, once its determinants are saved,
    :meth:`saved`. It is a :class:`~falkirk.spark_jobs.steps.ChunkObserver`: a job gives it to
    ``ctx.chunks(..., observer=edge)``, which calls :meth:`started` and :meth:`saved` for it."""

    def __init__(self, tables: EdgeTables, epoch: int, chunks: int, markers: Markers = "pairs") -> None:
        if markers not in ("pairs", "slow", "epoch"):
            raise ValueError(f"markers={markers!r}: 'pairs', 'slow' or 'epoch'")
        self.tables, self.epoch, self.chunks, self.markers = tables, epoch, chunks, markers
        self.attempt, self.seq = 1, 1

    def start(self, saved: Sequence[Sequence[dict]]) -> None:
        """Begin an attempt whose chunks ``1..len(saved)`` are saved already (``saved[i-1]``:
        chunk i's rows, read back from its determinants)."""
        sent = channels.rows(self.tables.edge, epoch=self.epoch)
        self.attempt = 1 + max((r["attempt"] for r in sent), default=0)
        self.seq = 1 + max((r["seq"] for r in sent), default=0)
        logged = len(saved)
        if sent:
            # A previous attempt died: keep what saved determinants vouch for, withdraw the rest.
            # The rewind goes out first: the sink then ignores the withdrawn rows even if it reads
            # them from a snapshot taken before the delete.
            channels.append(self.tables.control, [self._control("rewind", logged)], CONTROL)
            dropped = sum(1 for r in sent if r["chunk"] > logged)
            edge = open_table(self.tables.edge) if dropped else None
            if edge is not None:
                edge.delete(f"epoch = {self.epoch} AND chunk > {logged}")
            say(f"edge epoch {self.epoch}: attempt {self.attempt} keeps chunks 1-{logged} as sent and withdraws "
                f"{dropped} rows no saved determinant vouches for" if logged else
                f"edge epoch {self.epoch}: attempt {self.attempt} withdraws all {dropped} rows sent before")
            if logged and not any(r["kind"] == "st" and r["chunk"] == logged for r in sent):
                self._announce(logged)
        elif logged:
            # The edge lost the epoch after its chunks were saved: send them again, as saved.
            for chunk, rows in enumerate(saved, start=1):
                self.send(chunk, rows)
                self._announce(chunk)
            say(f"edge epoch {self.epoch}: chunks 1-{logged} sent again from their determinants, as first drawn")

    def started(self, saved: Sequence[Any]) -> None:
        """:meth:`start` with the saved chunks as Spark frames (``ctx.chunks`` reads them back)."""
        self.start([frame.toArrow().to_pylist() for frame in saved])

    def send(self, chunk: int, rows: Sequence[dict]) -> None:
        """Chunk ``chunk``'s rows (``key``, ``value``) in band, in order, ``SEND_BATCH`` rows per commit."""
        ordered = sorted(rows, key=lambda r: r["key"])
        for start in range(0, len(ordered), SEND_BATCH):
            batch = ordered[start:start + SEND_BATCH]
            now = time.time()
            channels.append(self.tables.edge, [
                {"epoch": self.epoch, "seq": self.seq + i, "attempt": self.attempt, "kind": "data", "chunk": chunk,
                 "key": r["key"], "value": r["value"], "sent_at": now} for i, r in enumerate(batch)], EDGE)
            self.seq += len(batch)

    def saved(self, chunk: int, frame: Any = None) -> None:
        """Chunk ``chunk``'s determinants are saved: announce it (ft out of band, then st in band)."""
        if self.markers == "epoch" and chunk < self.chunks:
            return
        self._announce(chunk)

    def _announce(self, chunk: int) -> None:
        if self.markers == "pairs":
            channels.append(self.tables.control, [self._control("ft", chunk)], CONTROL)
        channels.append(self.tables.edge, [{"epoch": self.epoch, "seq": self.seq, "attempt": self.attempt,
                                            "kind": "st", "chunk": chunk, "key": None, "value": None,
                                            "sent_at": time.time()}], EDGE)
        self.seq += 1

    def _control(self, kind: str, chunk: int) -> dict:
        return {"epoch": self.epoch, "attempt": self.attempt, "kind": kind, "chunk": chunk, "seq": self.seq}


def receive(tables: EdgeTables, epoch: int, chunks: int, capacity: int, commit: Callable[[list[dict]], None],
            markers: Markers = "pairs", who: str = "sink", finished: Callable[[], bool] | None = None) -> int:
    """Read epoch ``epoch`` of the edge in order and call ``commit(rows)`` for each transaction
    (at most ``capacity`` rows) the gate allows, as soon as it allows it; returns the number
    of transactions once the last chunk's st is in and everything before it is committed.

    ``finished`` says whether the producer has committed the whole epoch elsewhere (its logged
    output): asked once a second while the edge brings nothing, it ends the wait early (the
    edge is not where this sink reads it, or the rest of it was lost); the caller delivers
    the rest from there. It is not asked while the open transaction is full and blocked.

    Raises :class:`Stalled` when the open transaction is full and may commit nothing for
    ``FALKIRK_EDGE_STALL_SECONDS`` (slow travellers only), :class:`ProducerSilent` when nothing
    moves for ``FALKIRK_EDGE_WAIT_SECONDS``.
    """
    gate = MarkerGate(capacity, "pairs" if markers == "pairs" else "slow")
    rows_by_key: dict[str, dict] = {}
    pending: deque[dict] = deque()  # edge rows read but not taken in yet: still in the channel
    rewinds: list[tuple[int, int]] = []  # (attempt, last chunk it keeps) of every rewind read
    cursor, attempt, control_seen, transactions = 0, 1, 0, 0
    idle_since = asked = time.monotonic()
    while True:
        control = sorted(channels.rows(tables.control, epoch=epoch),
                         key=lambda r: (r["attempt"], r["kind"] != "rewind", r["chunk"]))
        for r in control[control_seen:]:
            if r["kind"] == "rewind" and r["attempt"] > attempt:
                dropped = gate.forget_after(r["chunk"])
                attempt = r["attempt"]
                rewinds.append((attempt, r["chunk"]))
                pending.clear()  # read the edge again: the dead attempt's unsaved rows are gone from it
                say(f"{who} epoch {epoch}: attempt {attempt} of the producer keeps chunks 1-{r['chunk']}; "
                    f"{dropped} buffered rows of later chunks forgotten")
            elif r["kind"] == "ft":
                gate.fast(FastTraveller(r["chunk"]))
        control_seen = len(control)
        if not pending:
            pending.extend(sorted((r for r in channels.rows(tables.edge, epoch=epoch) if r["seq"] > cursor),
                                  key=lambda r: r["seq"]))
        moved = blocked = False
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
                commit([rows_by_key.pop(d.name) for d in done])
            if not took and not done:
                blocked = bool(pending) and gate.room <= 0
                break
            moved = True
        if gate.last_st >= chunks and not gate.buffer:  # the last chunk's st is in and all before it committed
            say(f"{who} epoch {epoch}: {transactions} transactions of at most {capacity} rows")
            return transactions
        if moved:
            idle_since = time.monotonic()
        elif not blocked and finished is not None and time.monotonic() - asked > 1.0:
            asked = time.monotonic()
            if finished():
                say(f"{who} epoch {epoch}: the producer committed the epoch before its edge arrived here; "
                    f"{transactions} transactions from the edge")
                return transactions
        elif blocked and time.monotonic() - idle_since > STALL_SECONDS:
            held = sorted({d.origin for d in gate.buffer if isinstance(d, Data)})
            raise Stalled(f"{who} epoch {epoch}: stalled: the open transaction holds {len(gate.buffer)} of "
                          f"{capacity} rows (chunks {held}) and may commit none of them until the slow "
                          f"traveller of chunk {held[0] if held else '?'} arrives, which waits behind them")
        elif time.monotonic() - idle_since > WAIT_SECONDS:
            raise ProducerSilent(f"{who} epoch {epoch}: nothing arrived on {tables.edge} for {WAIT_SECONDS:.0f} s "
                                 f"(set FALKIRK_EDGE_WAIT_SECONDS to wait longer); the producer is not running")
        time.sleep(0.05)


def clear(tables: EdgeTables, through: int) -> None:
    """Delete the epochs up to ``through`` from both tables: the sink has delivered each (it
    runs its epochs in order), and a re-run reads the producer's logged output, not the edge.
    An earlier epoch's rows that an attempt killed mid-epoch left on this worker go too."""
    for uri in (tables.edge, tables.control):
        table = open_table(uri)
        if table is not None:
            table.delete(f"epoch <= {int(through)}")
