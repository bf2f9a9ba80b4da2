"""The control tables beside the ledger: invalidations, collections, deliveries and completions.

Each is an append-only Delta table under the store's ``_falkirk/`` folder, owned by one
class here; every append is idempotent (a repeated append records nothing twice):

* :class:`Invalidations`: the ledger rows recoveries rolled back. Readers of the ledger
  skip them, and the epoch is redone under the next incarnation.
* :class:`Collections`: how far garbage collection went per task (state at those epochs
  is gone; the ledger keeps the rows, so a task's chain has no gaps).
* :class:`Deliveries`: how far an external system has accepted what a task sent it
  (Falkirk Wheel §4.3, outputs).
* :class:`Completions`: the committed epochs whose Airflow task instance went on to finish,
  so that Airflow re-running one (Clear, a backfill that reprocesses) is told apart from a
  retry of an attempt that died after its commit.
* :class:`PairLayouts`: the layout of the DAG's process pairs (:mod:`falkirk.policies.pairs`),
  one record per change of a replica.

>>> import tempfile
>>> from falkirk.policies.store.config import StoreConfig
>>> root = tempfile.mkdtemp()
>>> collections = Collections(StoreConfig(durable_uri=root + "/store", scratch_uri=root + "/scratch"))
>>> collections.mark("orders", {"ingest": 3}), collections.mark("orders", {"ingest": 2})
({'ingest': 3}, {})
>>> collections.through("orders")
{'ingest': 3}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol, TypeVar

import pyarrow as pa

from falkirk.policies.ids import CommitId, ProcessorId
from falkirk.policies.store.commits import append_once, compact_every, open_table, scan
from falkirk.policies.store.config import StoreConfig

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from falkirk.policies.pairs import Layout

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

# A garbage collection's marks: the task's rows at epochs <= `through` are collected.
COLLECTION_SCHEMA = pa.schema(
    [
        pa.field("dag_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("through", pa.int64(), nullable=False),
        pa.field("collected_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

# The external system has accepted every record a task sent at epochs <= `through`. Until
# then those epochs are not the task's checkpoints, and the rest of the pipeline keeps what
# it needs to send them again.
DELIVERY_SCHEMA = pa.schema(
    [
        pa.field("dag_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("through", pa.int64(), nullable=False),
        pa.field("delivered_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

COMPLETION_SCHEMA = pa.schema(
    [
        pa.field("dag_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("map_index", pa.int32(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("incarnation", pa.int32(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("try_number", pa.int32(), nullable=False),
        pa.field("completed_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

class DeliveryError(ValueError):
    """A delivery that cannot have happened; the message names the field and the fix."""


@dataclass(frozen=True)
class _Once:
    """An idempotency key for a one-off append (see :func:`falkirk.policies.store.commits.append_once`)."""

    app_id: str
    incarnation: int = 0
    epoch: int = 0
    inputs: str = ""  # a one-off append is computed from nothing a recovery redoes

    @property
    def inputs_app_id(self) -> str:
        return self.app_id + "/inputs"


class CommittedRow(Protocol):
    """What names one commit of a (task, epoch): a ledger row has it (read-only)."""

    @property
    def dag_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def map_index(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def incarnation(self) -> int: ...


Row = TypeVar("Row", bound=CommittedRow)


class Invalidations:
    """The ledger rows recoveries rolled back (``_falkirk/invalidations``)."""

    # How often this process has read the rollbacks (a job reports it beside the ledger's reads).
    reads = 0

    def __init__(self, store: StoreConfig) -> None:
        self.store = store
        self.uri = store.control_uri("invalidations")

    def record(self, rows: Iterable[CommittedRow], plan_id: str) -> int:
        """Mark ``rows`` as rolled back by recovery ``plan_id``; returns how many were marked.

        One append per plan: executing the same plan again marks nothing twice.
        """
        rows = list(rows)
        if not rows:
            return 0
        now = datetime.now(UTC)
        records = [{"dag_id": e.dag_id, "task_id": e.task_id, "map_index": e.map_index, "epoch": e.epoch,
                    "incarnation": e.incarnation, "plan_id": plan_id, "invalidated_at": now} for e in rows]
        dags = sorted({e.dag_id for e in rows})
        key = _Once(f"falkirk-invalidate/{','.join(dags)}/{plan_id}")
        result = append_once(self.uri, pa.Table.from_pylist(records, schema=INVALIDATION_SCHEMA), key,
                             self.store.options_for(self.uri))
        return len(records) if result.applied else 0

    def keys(self, dag_id: str | None = None) -> set[CommitId]:
        """The commits recoveries rolled back."""
        return self.keys_and_version(dag_id)[0]

    def keys_and_version(self, dag_id: str | None = None) -> tuple[set[CommitId], int]:
        """:meth:`keys`, and the table version they were read at (-1: no rollback yet)."""
        rows, version = self.rows(dag_id)
        return keys_of(rows), version

    def rows(self, dag_id: str | None = None) -> tuple[pa.Table, int]:
        """The rollback rows (of ``dag_id`` if given), and the table version they were read at
        (-1: no rollback yet)."""
        Invalidations.reads += 1
        table = open_table(self.uri, self.store.options_for(self.uri))
        if table is None:
            return INVALIDATION_SCHEMA.empty_table(), -1
        return scan(table, where={"dag_id": dag_id} if dag_id else None), table.version()

    def version_of(self, dag_id: str, plan_id: str) -> int | None:
        """The table version at which recovery ``plan_id`` rolled back its rows of ``dag_id`` (``None``:
        it rolled back none, or the log no longer holds that commit). Read from the commits'
        own records: no clock is involved.

        >>> import tempfile
        >>> from types import SimpleNamespace
        >>> from falkirk.policies.store.config import StoreConfig
        >>> root = tempfile.mkdtemp()
        >>> inv = Invalidations(StoreConfig(root + "/store", root + "/scratch"))
        >>> row = SimpleNamespace(dag_id="d", task_id="t", map_index=-1, epoch=2, incarnation=0)
        >>> inv.record([row], "p1"), inv.record([row], "p2"), inv.version_of("d", "p2"), inv.version_of("d", "p3")
        (1, 1, 1, None)
        """
        return self._versions_by_plan(dag_id).get(plan_id)

    def _versions_by_plan(self, dag_id: str) -> dict[str, int]:
        """Per recovery (plan id) that rolled back rows of ``dag_id``, the table version of its
        commit, from the commits' own records (their app transaction ids)."""
        return versions_by_plan(open_table(self.uri, self.store.options_for(self.uri)), dag_id)

    def rolled_back_by(self, dag_id: str, plan_id: str) -> list[tuple[str, int, int, int | None]]:
        """The rows of ``dag_id`` that recovery ``plan_id`` and its sweeps of later DAG runs (records
        named ``<plan_id>+later:...``) rolled back: (task, map index, epoch, the table version that
        recorded it, ``None`` if the log no longer holds that commit).

        >>> import tempfile
        >>> from types import SimpleNamespace
        >>> from falkirk.policies.store.config import StoreConfig
        >>> root = tempfile.mkdtemp()
        >>> inv = Invalidations(StoreConfig(root + "/store", root + "/scratch"))
        >>> row = lambda t, e: SimpleNamespace(dag_id="d", task_id=t, map_index=-1, epoch=e, incarnation=0)
        >>> inv.record([row("a", 2)], "p1"), inv.record([row("b", 7)], "p1+later:x"), inv.record([row("c", 1)], "p2")
        (1, 1, 1)
        >>> inv.rolled_back_by("d", "p1")
        [('a', -1, 2, 0), ('b', -1, 7, 1)]
        """
        rows, _ = self.rows(dag_id)
        cols = rows.select(["task_id", "map_index", "epoch", "plan_id"]).to_pydict()
        mine = [i for i, p in enumerate(cols["plan_id"]) if p == plan_id or p.startswith(plan_id + "+later:")]
        if not mine:
            return []
        versions = self._versions_by_plan(dag_id)
        return sorted((cols["task_id"][i], cols["map_index"][i], cols["epoch"][i], versions.get(cols["plan_id"][i]))
                      for i in mine)

    def count(self, dag_id: str) -> int:
        """How many rows of ``dag_id`` recoveries have rolled back (each counted once per plan)."""
        table = open_table(self.uri, self.store.options_for(self.uri))
        return scan(table, where={"dag_id": dag_id}, columns=["epoch"]).num_rows if table is not None else 0

    def recorded_at(self, dag_id: str, plan_id: str) -> datetime | None:
        """When recovery ``plan_id`` rolled back its rows of ``dag_id`` (``None`` if it rolled back none)."""
        table = open_table(self.uri, self.store.options_for(self.uri))
        if table is None:
            return None
        times = scan(table, where={"dag_id": dag_id, "plan_id": plan_id}, columns=["invalidated_at"])
        return min(times.column("invalidated_at").to_pylist(), default=None)

    def next_incarnation(self, dag_id: str, task_id: str, epoch: int, map_index: int = -1) -> int:
        """The incarnation a new run of (task, epoch) commits under: one past the last rolled back."""
        processor = ProcessorId(task=task_id, map_index=map_index)
        gone = [c.incarnation for c in self.keys(dag_id) if (c.processor, c.epoch) == (processor, epoch)]
        return max(gone, default=-1) + 1


def versions_by_plan(table: DeltaTable | None, dag_id: str) -> dict[str, int]:
    """Per recovery (plan id) that rolled back rows of ``dag_id``, the version of the rollbacks
    table that recorded it, from the commits' own records (their app transaction ids)."""
    versions: dict[str, int] = {}
    for commit in table.history() if table is not None else []:
        prefix, _, plan = str(commit.get("falkirk.app_id", "")).rpartition("/")
        if prefix.startswith("falkirk-invalidate/") and dag_id in prefix[len("falkirk-invalidate/"):].split(","):
            versions.setdefault(plan, int(commit["version"]))
    return versions


def keys_of(rows: pa.Table) -> set[CommitId]:
    """The commits rollback rows name."""
    cols = rows.select(["dag_id", "task_id", "map_index", "epoch", "incarnation"]).to_pydict()
    return {CommitId(dag=d, processor=ProcessorId(task=t, map_index=m), epoch=e, incarnation=i)
            for d, t, m, e, i in zip(cols["dag_id"], cols["task_id"], cols["map_index"], cols["epoch"],
                                     cols["incarnation"])}


class Collections:
    """How far garbage collection went, per task (``_falkirk/collections``)."""

    def __init__(self, store: StoreConfig) -> None:
        self.store = store
        self.uri = store.control_uri("collections")

    def mark(self, dag_id: str, through: Mapping[str, int]) -> dict[str, int]:
        """Record that each task's rows at epochs <= ``through[task]`` are garbage-collected;
        returns the marks that raised a task's point (a mark at or below it changes nothing)."""
        now = self.through(dag_id)
        raised = {t: e for t, e in sorted(through.items()) if e > now.get(t, 0)}
        if not raised:
            return {}
        stamp = datetime.now(UTC)
        rows = [{"dag_id": dag_id, "task_id": t, "through": e, "collected_at": stamp} for t, e in raised.items()]
        key = _Once(f"falkirk-collect/{dag_id}/" + ",".join(f"{t}:{e}" for t, e in raised.items()))
        append_once(self.uri, pa.Table.from_pylist(rows, schema=COLLECTION_SCHEMA), key,
                    self.store.options_for(self.uri))
        return raised

    def through(self, dag_id: str) -> dict[str, int]:
        """Per task, the last epoch whose row is garbage-collected (tasks never collected are absent)."""
        return _highest_through(self.store, self.uri, dag_id)


class Deliveries:
    """How far external systems have accepted what tasks sent them (``_falkirk/deliveries``)."""

    def __init__(self, store: StoreConfig) -> None:
        self.store = store
        self.uri = store.control_uri("deliveries")

    def record(self, dag_id: str, task_id: str, through: int, senders: Mapping[str, int]) -> bool:
        """Record that the external system ``task_id`` sends to has accepted every record of its
        epochs ``<= through``; returns whether that raised the task's delivery point.

        ``senders``: per task of the DAG that sent records to an external system, its last
        committed epoch (:meth:`falkirk.policies.store.ledger.Ledger.external_senders`).
        Refused (nothing recorded) when ``task_id`` sent nothing external, or when ``through``
        is past its last committed epoch: the system cannot have accepted that yet.
        """
        if not isinstance(through, int) or isinstance(through, bool) or through < 1:
            raise DeliveryError(f"through={through!r}: give the last epoch the external system accepted (>= 1)")
        if task_id not in senders:
            raise DeliveryError(f"task {task_id!r} of DAG {dag_id!r} has sent nothing to an external system; "
                                f"tasks that do: {sorted(senders) or 'none'}")
        committed = senders[task_id]
        if through > committed:
            raise DeliveryError(f"through={through}: task {task_id!r} has committed epochs only through "
                                f"{committed}; an external system cannot have accepted epoch {through}")
        if through <= self.through(dag_id).get(task_id, 0):
            return False
        row = {"dag_id": dag_id, "task_id": task_id, "through": through, "delivered_at": datetime.now(UTC)}
        key = _Once(f"falkirk-deliver/{dag_id}/{task_id}:{through}")
        return append_once(self.uri, pa.Table.from_pylist([row], schema=DELIVERY_SCHEMA), key,
                           self.store.options_for(self.uri)).applied

    def through(self, dag_id: str) -> dict[str, int]:
        """Per task that sends to an external system, the last epoch it has accepted (absent: none)."""
        return _highest_through(self.store, self.uri, dag_id)


# One change of one replica of a paired task's partition (falkirk.policies.pairs.Replica).
LAYOUT_SCHEMA = pa.schema(
    [
        pa.field("dag_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("replica", pa.string(), nullable=False),
        pa.field("worker", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("version", pa.int64(), nullable=False),
        pa.field("generation", pa.int32(), nullable=False),
        pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


class PairLayouts:
    """The layout of each DAG's process pairs (``_falkirk/layout``): append-only, one record per
    change of a replica. The current record of a replica is the one with the highest generation,
    then the highest status rank (a take-over beats a concurrent fold-in of the same generation:
    ``DEAD`` over ``ACTIVE`` over ``STDBY``), then the highest version; so two processes that
    make the same change from the same read record it once, and conflicting ones resolve the
    same way for every reader.

    >>> import tempfile
    >>> from falkirk.policies.pairs import chained
    >>> root = tempfile.mkdtemp()
    >>> layouts = PairLayouts(StoreConfig(durable_uri=root + "/store", scratch_uri=root + "/scratch"))
    >>> start = chained({"t": 2}, ["w0", "w1"])
    >>> layouts.save("d", start), layouts.save("d", start.fail("w1"), before=start)
    (4, 2)
    >>> layouts.load("d") == start.fail("w1")
    True
    """

    RANK = {"STDBY": 0, "ACTIVE": 1, "DEAD": 2}
    # Versions between compactions. Every paired job loads the layout, each of its files (a few
    # requests apiece on S3), and changes are few: compacting soon keeps a load to a file or two.
    # In the process pairs benchmark reading the layout's files took 5,200 of 101,000 requests.
    COMPACT_EVERY = 5

    def __init__(self, store: StoreConfig) -> None:
        self.store = store
        self.uri = store.control_uri("layout")

    def save(self, dag_id: str, layout: Layout, before: Layout | None = None) -> int:
        """Record the replicas of ``layout`` that differ from ``before`` (all of them without it);
        returns how many records it appended (0: the same change was recorded already)."""
        old = set(before.replicas) if before is not None else set()
        changed = [r for r in layout.replicas if r not in old]
        if not changed:
            return 0
        stamp = datetime.now(UTC)
        rows = [{"dag_id": dag_id, "task_id": r.task, "partition": r.partition, "replica": r.replica,
                 "worker": r.worker, "status": r.status.value, "version": r.version, "generation": r.generation,
                 "recorded_at": stamp} for r in changed]
        key = _Once(f"falkirk-layout/{dag_id}/" + ",".join(
            f"{r.name}@{r.worker}:{r.status.value}:{r.version}:g{r.generation}" for r in changed))
        result = append_once(self.uri, pa.Table.from_pylist(rows, schema=LAYOUT_SCHEMA), key,
                             self.store.options_for(self.uri))
        compact_every(result, self.COMPACT_EVERY, self.store.options_for(self.uri), "layout")
        return len(rows) if result.applied else 0

    def load(self, dag_id: str) -> Layout | None:
        """The DAG's current layout (``None``: it has no paired task), replicas in
        (task, partition, replica) order."""
        table = open_table(self.uri, self.store.options_for(self.uri))
        if table is None:
            return None
        return self.current(scan(table, where={"dag_id": dag_id}).to_pylist())

    def current(self, records: list[dict]) -> Layout | None:
        """The layout the records of one DAG (:meth:`history`'s) make: the current record of each replica."""
        from falkirk.policies.pairs import Layout, Replica, Status

        best: dict[tuple[str, int, str], dict] = {}
        for row in records:
            key = (row["task_id"], row["partition"], row["replica"])
            rank = (row["generation"], self.RANK[row["status"]], row["version"])
            held = best.get(key)
            if held is None or rank > (held["generation"], self.RANK[held["status"]], held["version"]):
                best[key] = row
        if not best:
            return None
        return Layout(tuple(Replica(task=t, partition=p, replica=r, worker=row["worker"], status=Status(row["status"]), version=row["version"], generation=row["generation"])
                            for (t, p, r), row in sorted(best.items())))

    def history(self, dag_id: str) -> list[dict]:
        """Every record of the DAG's layout, oldest first (for :func:`falkirk.policies.pairs.layout_events`)."""
        table = open_table(self.uri, self.store.options_for(self.uri))
        if table is None:
            return []
        rows = scan(table, where={"dag_id": dag_id}).to_pylist()
        return sorted(rows, key=lambda r: (r["recorded_at"], r["generation"], self.RANK[r["status"]]))


class CompletedRow(CommittedRow, Protocol):
    @property
    def run_id(self) -> str: ...
    @property
    def try_number(self) -> int: ...


class Completions:
    """The committed (task, epoch, incarnation)s whose Airflow task instance finished after the
    commit (``_falkirk/completions``): the operator records one when its job has returned.

    Airflow re-running such an instance (Clear, a backfill that reprocesses completed runs,
    "mark failed" then clear) would find the epoch committed and change nothing, leaving its
    result, and everything built on it, as it was: the operator refuses it, pointing to a
    planned recovery. An attempt that died after its commit has no completion, so its retry
    stays an idempotent no-op.

    >>> import tempfile
    >>> from types import SimpleNamespace
    >>> from falkirk.policies.store.config import StoreConfig
    >>> root = tempfile.mkdtemp()
    >>> completions = Completions(StoreConfig(root + "/store", root + "/scratch"))
    >>> row = SimpleNamespace(dag_id="d", task_id="t", map_index=-1, epoch=2, incarnation=0, run_id="r", try_number=1)
    >>> completions.completed(row), completions.record(row), completions.record(row), completions.completed(row)
    (False, True, False, True)
    """

    def __init__(self, store: StoreConfig) -> None:
        self.store = store
        self.uri = store.control_uri("completions")

    def record(self, row: CompletedRow) -> bool:
        """Record that ``row``'s epoch completed in Airflow; ``False`` when already recorded."""
        record = {"dag_id": row.dag_id, "task_id": row.task_id, "map_index": row.map_index, "epoch": row.epoch,
                  "incarnation": row.incarnation, "run_id": row.run_id, "try_number": row.try_number,
                  "completed_at": datetime.now(UTC)}
        return append_once(self.uri, pa.Table.from_pylist([record], schema=COMPLETION_SCHEMA), self._key(row),
                           self.store.options_for(self.uri)).applied

    def completed(self, row: CommittedRow) -> bool:
        """Whether ``row``'s (task, epoch) completed in Airflow at this incarnation (or a later one).

        Read from the Delta log's transaction records: no data file is opened.
        """
        return bool(self.completed_among([row]))

    def completed_among(self, rows: Iterable[Row]) -> list[Row]:
        """The ``rows`` that completed in Airflow (see :meth:`completed`), from one read of the log."""
        table = open_table(self.uri, self.store.options_for(self.uri))
        if table is None:
            return []
        done = []
        for row in rows:
            recorded = table.transaction_version(self._key(row).app_id)
            if recorded is not None and recorded >= row.incarnation:
                done.append(row)
        return done

    @staticmethod
    def _key(row: CommittedRow) -> _Once:
        return _Once(f"falkirk-complete/{row.dag_id}/{row.task_id}/{row.map_index}/{row.epoch}", row.incarnation)


def _highest_through(store: StoreConfig, uri: str, dag_id: str) -> dict[str, int]:
    table = open_table(uri, store.options_for(uri))
    if table is None:
        return {}
    cols = scan(table, where={"dag_id": dag_id}).to_pydict()
    out: dict[str, int] = {}
    for task, through in zip(cols["task_id"], cols["through"]):
        out[task] = max(out.get(task, 0), through)
    return out
