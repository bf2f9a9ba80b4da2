"""The checkpoint ledger: one row per committed (task, epoch), in a Delta table.

A ledger row is the commit point of a task's epoch. The job runtime writes the task's
outputs and state first (each an idempotent Delta commit, see
:mod:`falkirk.policies.epoch_tables`) and appends the ledger row last, so a (task, epoch) is
checkpointed exactly when its row exists. The row records what the Falkirk Wheel calls
Ξ(p, f): the regime, the frontier (all epochs up to and including this one), and where
the state and outputs were written, with their Delta versions and row counts.

The ledger is append-only. Appends are idempotent per (task, epoch, incarnation): a
second append of the same key changes nothing. A recovery never deletes a row: it
appends an *invalidation* of it to a second table (``_falkirk/invalidations``), after
which readers skip the row and the epoch is redone under the next incarnation.

>>> import tempfile
>>> from falkirk.policies.store import StoreConfig
>>> root = tempfile.mkdtemp()
>>> ledger = Ledger(StoreConfig(durable_uri=root + "/store", scratch_uri=root + "/scratch"))
>>> entry = LedgerEntry(dag_id="orders", task_id="ingest", epoch=1, regime="ephemeral",
...                     run_id="epoch-1", try_number=1)
>>> ledger.append(entry), ledger.append(entry)
(True, False)
>>> [(e.task_id, e.epoch) for e in ledger.entries("orders")]
[('ingest', 1)]
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
from deltalake.exceptions import CommitFailedError

from falkirk.policies.epoch_tables import CommitKey, append_once, open_table, scan
from falkirk.policies.regimes import Regime, RegimeError
from falkirk.policies.store import StoreConfig

log = logging.getLogger(__name__)

# Ledger versions between compactions (each task commit appends one version).
COMPACT_EVERY = 100

SCHEMA = pa.schema(
    [
        pa.field("dag_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("map_index", pa.int32(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("incarnation", pa.int32(), nullable=False),
        pa.field("regime", pa.string(), nullable=False),
        # The frontier this checkpoint restores to: every epoch <= `epoch` (spec §1.3 notation).
        pa.field("frontier", pa.string(), nullable=False),
        pa.field("state_uri", pa.string()),
        pa.field("state_tier", pa.string()),
        pa.field("state_version", pa.int64()),
        pa.field("state_rows", pa.int64()),
        # JSON list of {"name", "uri", "tier", "version", "rows", "discarded_through"}, one per output
        # table; "discarded_through" is D̄ as committed: the last epoch whose rows were not logged.
        pa.field("outputs", pa.string(), nullable=False),
        pa.field("output_rows", pa.int64(), nullable=False),
        # JSON list of {"task_id", "output", "through"[, "reads_back"]}: M̄ per input, the last
        # epoch consumed (and how far back before its own epoch the task read it).
        pa.field("inputs", pa.string(), nullable=False),
        # N̄: the last epoch whose completion this task acted on (null: none).
        pa.field("notified_through", pa.int64()),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("try_number", pa.int32(), nullable=False),
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


INVALIDATION_SCHEMA = pa.schema(
    [
        pa.field("dag_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("map_index", pa.int32(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("incarnation", pa.int32(), nullable=False),
        pa.field("plan_id", pa.string(), nullable=False),
        pa.field("invalidated_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


# A garbage collection's marks: the task's rows at epochs <= `through` are collected (their
# state is gone); the ledger keeps them, so a task's chain has no gaps.
COLLECTION_SCHEMA = pa.schema(
    [
        pa.field("dag_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("through", pa.int64(), nullable=False),
        pa.field("collected_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


# Deliveries to external systems (spec §4.2, output rule): the external system has accepted
# every record a task sent at epochs <= `through`. Until then those epochs are not the task's
# checkpoints, and the rest of the pipeline keeps what it needs to send them again.
DELIVERY_SCHEMA = pa.schema(
    [
        pa.field("dag_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("through", pa.int64(), nullable=False),
        pa.field("delivered_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

# An output a task sent to a system outside the store is recorded with this tier and its
# destination prefixed by EXTERNAL_SCHEME; it is no table, and no task of the DAG reads it.
EXTERNAL_TIER = "external"
EXTERNAL_SCHEME = "external:"


def external_uri(destination: str) -> str:
    """How the ledger names an external destination: ``external:`` + the destination."""
    return destination if destination.startswith(EXTERNAL_SCHEME) else EXTERNAL_SCHEME + destination


def is_external(uri: str) -> bool:
    return uri.startswith(EXTERNAL_SCHEME)


@dataclass(frozen=True)
class _Once:
    """An idempotency key for a one-off append (see :func:`falkirk.policies.epoch_tables.append_once`)."""

    app_id: str
    incarnation: int = 0
    epoch: int = 0


class LedgerError(ValueError):
    """A ledger row that is malformed; the message names the field and the fix."""


@dataclass(frozen=True)
class OutputRef:
    """Where one output table of a (task, epoch) was committed."""

    name: str
    uri: str
    tier: str
    version: int
    rows: int
    # D̄ as of this commit: the last epoch (<= this one) whose rows of this output went
    # only to scratch, i.e. were not logged; None when every epoch so far was logged.
    discarded_through: int | None = None


@dataclass(frozen=True)
class InputRef:
    """M̄ for one input: the last epoch of ``task_id``'s ``output`` this task has consumed.

    ``reads_back``: how many epochs before its own the task's epoch read (a window of three
    epochs reads back 2), so that a re-run still finds those epochs of the input.
    """

    task_id: str
    output: str
    through: int
    reads_back: int = 0


@dataclass(frozen=True)
class LedgerEntry:
    """One checkpoint of one task: the metadata of its (task, epoch) commit."""

    dag_id: str
    task_id: str
    epoch: int
    regime: str
    run_id: str
    try_number: int
    map_index: int = -1
    incarnation: int = 0
    state_uri: str | None = None
    state_tier: str | None = None
    state_version: int | None = None
    state_rows: int | None = None
    outputs: tuple[OutputRef, ...] = ()
    inputs: tuple[InputRef, ...] = ()
    notified_through: int | None = None
    committed_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def __post_init__(self) -> None:
        for name in ("dag_id", "task_id", "run_id"):
            if not getattr(self, name):
                raise LedgerError(f"ledger entry: {name} is empty")
        if not isinstance(self.epoch, int) or self.epoch < 0:
            raise LedgerError(f"ledger entry: epoch={self.epoch!r} must be a whole number >= 0")
        try:
            Regime.parse(self.regime)
        except RegimeError as exc:
            raise LedgerError(f"ledger entry: regime: {exc}") from exc

    @property
    def key(self) -> CommitKey:
        return CommitKey(self.dag_id, self.task_id, self.epoch, self.map_index, self.incarnation)

    @property
    def frontier(self) -> dict[str, int]:
        """The checkpoint's frontier in scenario-file notation: all epochs through this one."""
        return {"through": self.epoch}

    @property
    def output_rows(self) -> int:
        return sum(o.rows for o in self.outputs)

    def to_row(self) -> dict[str, Any]:
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        row["outputs"] = json.dumps([asdict(o) for o in self.outputs], sort_keys=True)
        # reads_back only when set: rows of tasks that read just their own epoch stay as they were.
        row["inputs"] = json.dumps([{k: v for k, v in asdict(i).items() if k != "reads_back" or v}
                                    for i in self.inputs], sort_keys=True)
        row["frontier"] = json.dumps(self.frontier)
        row["output_rows"] = self.output_rows
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "LedgerEntry":
        values = {k: row[k] for k in _ENTRY_FIELDS if k in row}
        values["outputs"] = tuple(OutputRef(**o) for o in json.loads(row["outputs"]))
        values["inputs"] = tuple(InputRef(**i) for i in json.loads(row.get("inputs") or "[]"))
        return cls(**values)


_ENTRY_FIELDS = tuple(f.name for f in fields(LedgerEntry))


class Ledger:
    """The ledger table of a store. Reads and appends go through delta-rs; no JVM."""

    def __init__(self, store: StoreConfig) -> None:
        self.store = store
        self.uri = store.ledger_uri
        self.invalidations_uri = store.control_uri("invalidations")
        self.collections_uri = store.control_uri("collections")
        self.deliveries_uri = store.control_uri("deliveries")

    def version(self) -> int | None:
        """The ledger table's Delta version (``None`` before the first row): plans record it."""
        table = open_table(self.uri, self.store.options_for(self.uri))
        return table.version() if table is not None else None

    def invalidate(self, entries: "list[LedgerEntry]", plan_id: str) -> int:
        """Mark ``entries`` as rolled back by recovery ``plan_id``; returns how many were marked.

        One append per plan: executing the same plan again marks nothing twice.
        """
        if not entries:
            return 0
        now = datetime.now(timezone.utc)
        rows = [{"dag_id": e.dag_id, "task_id": e.task_id, "map_index": e.map_index, "epoch": e.epoch,
                 "incarnation": e.incarnation, "plan_id": plan_id, "invalidated_at": now} for e in entries]
        dags = sorted({e.dag_id for e in entries})
        key = _Once(f"falkirk-invalidate/{','.join(dags)}/{plan_id}")
        uri = self.invalidations_uri
        result = append_once(uri, pa.Table.from_pylist(rows, schema=INVALIDATION_SCHEMA), key,
                             self.store.options_for(uri))
        return len(rows) if result.applied else 0

    def invalidated(self, dag_id: str | None = None) -> set[tuple[str, str, int, int, int]]:
        """Keys (dag, task, map index, epoch, incarnation) of the rows recoveries rolled back."""
        table = open_table(self.invalidations_uri, self.store.options_for(self.invalidations_uri))
        if table is None:
            return set()
        cols = scan(table, where={"dag_id": dag_id} if dag_id else None).to_pydict()
        return set(zip(cols["dag_id"], cols["task_id"], cols["map_index"], cols["epoch"], cols["incarnation"]))

    def invalidated_at(self, dag_id: str, plan_id: str) -> datetime | None:
        """When recovery ``plan_id`` rolled back its rows of ``dag_id`` (``None`` if it rolled back none)."""
        table = open_table(self.invalidations_uri, self.store.options_for(self.invalidations_uri))
        if table is None:
            return None
        times = scan(table, where={"dag_id": dag_id, "plan_id": plan_id}, columns=["invalidated_at"])
        return min(times.column("invalidated_at").to_pylist(), default=None)

    def mark_collected(self, dag_id: str, through: "dict[str, int]") -> dict[str, int]:
        """Record that each task's rows at epochs <= ``through[task]`` are garbage-collected;
        returns the marks that raised a task's point (a mark at or below it changes nothing)."""
        now = self.collected(dag_id)
        raised = {t: e for t, e in sorted(through.items()) if e > now.get(t, 0)}
        if not raised:
            return {}
        stamp = datetime.now(timezone.utc)
        rows = [{"dag_id": dag_id, "task_id": t, "through": e, "collected_at": stamp} for t, e in raised.items()]
        key = _Once(f"falkirk-collect/{dag_id}/" + ",".join(f"{t}:{e}" for t, e in raised.items()))
        append_once(self.collections_uri, pa.Table.from_pylist(rows, schema=COLLECTION_SCHEMA), key,
                    self.store.options_for(self.collections_uri))
        return raised

    def record_delivery(self, dag_id: str, task_id: str, through: int) -> bool:
        """Record that the external system ``task_id`` sends to has accepted every record of its
        epochs ``<= through``; returns whether that raised the task's delivery point.

        Refused (nothing recorded) when the task sent nothing external, or when ``through``
        is past the task's last committed epoch: the system cannot have accepted that yet.
        """
        if not isinstance(through, int) or through < 1:
            raise LedgerError(f"through={through!r}: give the last epoch the external system accepted (>= 1)")
        rows = self.entries(dag_id, task_id)
        senders = sorted({e.task_id for e in self.entries(dag_id) if any(is_external(o.uri) for o in e.outputs)})
        if not any(is_external(o.uri) for e in rows for o in e.outputs):
            raise LedgerError(f"task {task_id!r} of DAG {dag_id!r} has sent nothing to an external system; "
                              f"tasks that do: {senders or 'none'}")
        committed = max(e.epoch for e in rows)
        if through > committed:
            raise LedgerError(f"through={through}: task {task_id!r} has committed epochs only through "
                              f"{committed}; an external system cannot have accepted epoch {through}")
        if through <= self.delivered(dag_id).get(task_id, 0):
            return False
        row = {"dag_id": dag_id, "task_id": task_id, "through": through, "delivered_at": datetime.now(timezone.utc)}
        key = _Once(f"falkirk-deliver/{dag_id}/{task_id}:{through}")
        return append_once(self.deliveries_uri, pa.Table.from_pylist([row], schema=DELIVERY_SCHEMA), key,
                           self.store.options_for(self.deliveries_uri)).applied

    def delivered(self, dag_id: str) -> dict[str, int]:
        """Per task that sends to an external system, the last epoch it has accepted (absent: none)."""
        table = open_table(self.deliveries_uri, self.store.options_for(self.deliveries_uri))
        if table is None:
            return {}
        cols = scan(table, where={"dag_id": dag_id}).to_pydict()
        out: dict[str, int] = {}
        for task, through in zip(cols["task_id"], cols["through"]):
            out[task] = max(out.get(task, 0), through)
        return out

    def dags(self) -> list[str]:
        """Every DAG with a row in the ledger."""
        table = open_table(self.uri, self.store.options_for(self.uri))
        if table is None:
            return []
        return sorted(set(table.to_pyarrow_table(columns=["dag_id"]).column("dag_id").to_pylist()))

    def collected(self, dag_id: str) -> dict[str, int]:
        """Per task, the last epoch whose row is garbage-collected (tasks never collected are absent)."""
        table = open_table(self.collections_uri, self.store.options_for(self.collections_uri))
        if table is None:
            return {}
        cols = scan(table, where={"dag_id": dag_id}).to_pydict()
        out: dict[str, int] = {}
        for task, through in zip(cols["task_id"], cols["through"]):
            out[task] = max(out.get(task, 0), through)
        return out

    def next_incarnation(self, dag_id: str, task_id: str, epoch: int, map_index: int = -1) -> int:
        """The incarnation a new run of (task, epoch) commits under: one past the last rolled back."""
        gone = [inc for d, t, m, e, inc in self.invalidated(dag_id) if (t, m, e) == (task_id, map_index, epoch)]
        return max(gone, default=-1) + 1

    def append(self, entry: LedgerEntry) -> bool:
        """Record ``entry``; ``False`` when that (task, epoch, incarnation) is already recorded.

        Every :data:`COMPACT_EVERY` versions the appender also compacts the table.
        """
        table = pa.Table.from_pylist([entry.to_row()], schema=SCHEMA)
        result = append_once(self.uri, table, entry.key, self.store.options_for(self.uri))
        if result.applied and result.version and result.version % COMPACT_EVERY == 0:
            self._compact_quietly()
        return result.applied

    def compact(self) -> int:
        """Rewrite the ledger's small files (one per commit) into a few large ones; returns how
        many files were replaced. Rows, versions' meaning and idempotency records are unchanged.

        A read costs about one file open per file, so an uncompacted ledger of 25,000 commits
        takes seconds to read and a compacted one milliseconds. Losing a race with another
        compaction is harmless: the other one did the work.
        """
        table = open_table(self.uri, self.store.options_for(self.uri))
        if table is None:
            return 0
        try:
            metrics = table.optimize.compact()
        except CommitFailedError:
            return 0
        return int(metrics.get("numFilesRemoved", 0))

    def _compact_quietly(self) -> None:
        # Compaction only speeds reads up: it must never fail the commit that triggered it.
        try:
            self.compact()
        except Exception as exc:  # noqa: BLE001
            log.warning("ledger compaction of %s skipped: %s", self.uri, exc)

    def read(self, dag_id: str | None = None, task_id: str | None = None, map_index: int | None = None) -> pa.Table:
        """The ledger's rows (filtered by DAG, task, map index if given) as an Arrow table.

        >>> Ledger(StoreConfig("/nonexistent/store", "/nonexistent/scratch")).read().num_rows
        0
        """
        table = open_table(self.uri, self.store.options_for(self.uri))
        if table is None:
            return SCHEMA.empty_table()
        where = {k: v for k, v in (("dag_id", dag_id), ("task_id", task_id), ("map_index", map_index)) if v is not None}
        return scan(table, where=where or None)

    def entries(self, dag_id: str | None = None, task_id: str | None = None,
                map_index: int | None = None, include_invalidated: bool = False) -> list[LedgerEntry]:
        """The ledger's current rows (filtered as in :meth:`read`), ordered by epoch, then task and map index.

        Rows a recovery invalidated are left out unless ``include_invalidated``.
        """
        current, _ = self.entries_and_invalidated(dag_id, task_id, map_index,
                                                  read_invalidations=not include_invalidated)
        return current

    def entries_and_invalidated(self, dag_id: str | None = None, task_id: str | None = None,
                                map_index: int | None = None, read_invalidations: bool = True,
                                ) -> tuple[list[LedgerEntry], list[LedgerEntry]]:
        """The current rows and the rows recoveries rolled back, from one read of each table."""
        cols = self.read(dag_id, task_id, map_index).to_pydict()
        gone = self.invalidated(dag_id) if read_invalidations else set()
        names = [n for n in _ENTRY_FIELDS if n in cols]
        seen: dict[tuple, LedgerEntry] = {}
        rolled_back: list[LedgerEntry] = []
        # Two racing attempts may both append before either sees the other: keep the first.
        for i in sorted(range(len(cols["dag_id"])), key=cols["committed_at"].__getitem__):
            row = {n: cols[n][i] for n in names}
            entry = LedgerEntry.from_row(row)
            if (entry.dag_id, entry.task_id, entry.map_index, entry.epoch, entry.incarnation) in gone:
                rolled_back.append(entry)
                continue
            seen.setdefault((entry.key.app_id, entry.incarnation), entry)
        order = lambda e: (e.dag_id, e.epoch, e.task_id, e.map_index, e.incarnation)  # noqa: E731
        return sorted(seen.values(), key=order), sorted(rolled_back, key=order)

    def latest(self, dag_id: str, task_id: str, before_epoch: int, map_index: int = -1) -> LedgerEntry | None:
        """The checkpoint of ``task_id`` with the greatest epoch below ``before_epoch``."""
        candidates = [e for e in self.entries(dag_id, task_id, map_index) if e.epoch < before_epoch]
        return max(candidates, key=lambda e: (e.epoch, e.incarnation), default=None)

    def find(self, dag_id: str, task_id: str, epoch: int, map_index: int = -1) -> LedgerEntry | None:
        """The (latest incarnation's) checkpoint of ``task_id`` at exactly ``epoch``."""
        matches = [e for e in self.entries(dag_id, task_id, map_index) if e.epoch == epoch]
        return max(matches, key=lambda e: e.incarnation, default=None)
