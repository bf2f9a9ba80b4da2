"""What a Falkirk task's asset event says: the commit behind it.

A Falkirk task with ``outlets=[Asset(...)]`` emits Airflow asset events as any task does, when
its task instance succeeds. The operator puts the commit behind the event in its ``extra``,
under the key ``"falkirk"``: the producer (DAG, task, partition), the epoch, its incarnation
and each output table's URI, Delta version and row count. Incarnation 0 is the epoch's first
commit; incarnation n is the n-th redo by a recovery, and its event is a *replacement*: it
supersedes every earlier event of the same epoch, whose rows the tables no longer hold.

A consumer DAG scheduled on the Asset finds these in its run's triggering asset events, and
records which producer epochs (and incarnations) each of its runs consumed.

The job prints the record as one line after its commit (:data:`COMMITTED_PREFIX` and JSON):
the operator learns it from the job's output, without reading the store itself.

>>> done = CommittedEpoch(dag_id="orders", task_id="publish", epoch=3, incarnation=1,
...                       outputs=(CommittedOutput("output", "/store/orders/publish/output", 7, 5),))
>>> CommittedEpoch.parse_line(done.line()) == done
True
>>> extra = done.extra()
>>> extra["falkirk"]["epoch"], extra["falkirk"]["replacement"], extra["falkirk"]["outputs"]["output"]["version"]
(3, True, 7)
>>> CommittedEpoch.from_extra(extra) == done
True
>>> CommittedEpoch.from_extra({"source": "a plain Airflow task"}) is None
True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from falkirk.policies.ids import OfCommit

if TYPE_CHECKING:
    from falkirk.policies.store.ledger import LedgerEntry

COMMITTED_PREFIX = "[falkirk] committed: "
"""The start of the line a job prints once its epoch is committed (or found committed)."""

EXTRA_KEY = "falkirk"
"""The key of the commit record in an asset event's ``extra``."""


class AssetEventError(ValueError):
    """An asset event's ``extra`` under :data:`EXTRA_KEY` is not a commit record; the message names the field."""


@dataclass(frozen=True)
class CommittedOutput:
    """One output table of a commit: where it is, the Delta version that holds the epoch, its rows."""

    name: str
    uri: str
    version: int
    rows: int


@dataclass(frozen=True, kw_only=True)
class CommittedEpoch(OfCommit):
    """A task's (or one partition's) commit of one epoch, as its asset events carry it."""

    dag_id: str
    task_id: str
    epoch: int
    incarnation: int = 0
    map_index: int = -1
    outputs: tuple[CommittedOutput, ...] = ()


    @property
    def replacement(self) -> bool:
        """Whether this commit redoes an epoch a recovery rolled back (it replaces earlier events).

        >>> CommittedEpoch(dag_id="d", task_id="t", epoch=2).replacement, CommittedEpoch(dag_id="d", task_id="t", epoch=2, incarnation=1).replacement
        (False, True)
        """
        return self.incarnation > 0

    @classmethod
    def from_entry(cls, entry: LedgerEntry) -> CommittedEpoch:
        """The record of a ledger row (its tables only: records sent outside the store are no table).

        >>> from falkirk.policies.store.ledger import LedgerEntry, OutputRef
        >>> row = LedgerEntry(dag_id="d", task_id="t", epoch=4, regime="eager_checkpoint", run_id="epoch-4", try_number=1, incarnation=2,
        ...                   outputs=(OutputRef("output", "/s/d/t/output", "durable", 9, 3),))
        >>> CommittedEpoch.from_entry(row).outputs
        (CommittedOutput(name='output', uri='/s/d/t/output', version=9, rows=3),)
        """
        from falkirk.policies.store.ledger import is_external

        return cls(dag_id=entry.dag_id, task_id=entry.task_id, epoch=entry.epoch, incarnation=entry.incarnation,
                   map_index=entry.map_index, outputs=tuple(CommittedOutput(o.name, o.uri, o.version, o.rows) for o in entry.outputs
                         if not is_external(o.uri)))

    def same_commit(self, other: CommittedEpoch | None) -> bool:
        """Whether ``other`` records the same commit: the same task instance, epoch and incarnation.

        >>> redo = CommittedEpoch(dag_id="d", task_id="t", epoch=2, incarnation=1)
        >>> redo.same_commit(CommittedEpoch(dag_id="d", task_id="t", epoch=2, incarnation=1)), redo.same_commit(CommittedEpoch(dag_id="d", task_id="t", epoch=2))
        (True, False)
        >>> redo.same_commit(None)
        False
        """
        return other is not None and (self.dag_id, self.task_id, self.map_index, self.epoch, self.incarnation) == (
            other.dag_id, other.task_id, other.map_index, other.epoch, other.incarnation)

    def to_json(self) -> dict[str, Any]:
        """The record as JSON values (what goes under :data:`EXTRA_KEY`)."""
        record: dict[str, Any] = {"dag_id": self.dag_id, "task_id": self.task_id, "epoch": self.epoch,
                                  "incarnation": self.incarnation, "replacement": self.replacement,
                                  "outputs": {o.name: {"uri": o.uri, "version": o.version, "rows": o.rows}
                                              for o in self.outputs}}
        if self.map_index >= 0:
            record["map_index"] = self.map_index
        return record

    def extra(self) -> dict[str, Any]:
        """The asset event's ``extra``: ``{"falkirk": record}``."""
        return {EXTRA_KEY: self.to_json()}

    def line(self) -> str:
        """The line the job prints (one line, so the operator reads it from the job's output)."""
        return COMMITTED_PREFIX + json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def parse_line(cls, line: str) -> CommittedEpoch | None:
        """The record a job's output line carries; ``None`` for any other line."""
        if not line.startswith(COMMITTED_PREFIX):
            return None
        return cls.from_json(json.loads(line[len(COMMITTED_PREFIX):]))

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> CommittedEpoch | None:
        """The record in an asset event's ``extra``; ``None`` when a task other than a Falkirk one emitted it.

        >>> CommittedEpoch.from_extra({"falkirk": {"dag_id": "d", "task_id": "t"}})
        Traceback (most recent call last):
        ...
        falkirk.policies.asset_events.AssetEventError: asset event extra["falkirk"]: no 'epoch'; a Falkirk operator writes {"dag_id", "task_id", "epoch", "incarnation", "outputs"}: was the extra edited by hand?
        """
        if not extra or EXTRA_KEY not in extra:
            return None
        return cls.from_json(extra[EXTRA_KEY])

    @classmethod
    def from_json(cls, record: Any) -> CommittedEpoch:
        where = f"asset event extra[\"{EXTRA_KEY}\"]"
        if not isinstance(record, Mapping):
            raise AssetEventError(f"{where} is {type(record).__name__}, not an object")
        for name, kind in (("dag_id", str), ("task_id", str), ("epoch", int), ("incarnation", int)):
            if name not in record:
                raise AssetEventError(f"{where}: no {name!r}; a Falkirk operator writes {{\"dag_id\", \"task_id\", "
                                      f"\"epoch\", \"incarnation\", \"outputs\"}}: was the extra edited by hand?")
            if not isinstance(record[name], kind) or isinstance(record[name], bool):
                raise AssetEventError(f"{where}: {name}={record[name]!r} is not a {kind.__name__}")
        map_index = record.get("map_index", -1)
        if not isinstance(map_index, int) or isinstance(map_index, bool):
            raise AssetEventError(f"{where}: map_index={map_index!r} is not a int (the partition; leave it out for "
                                  f"a task that is not partitioned)")
        outputs = record.get("outputs") or {}
        if not isinstance(outputs, Mapping):
            raise AssetEventError(f"{where}: outputs={outputs!r} is not an object of output name -> table")
        try:
            tables = tuple(CommittedOutput(name, str(o["uri"]), int(o["version"]), int(o["rows"]))
                           for name, o in sorted(outputs.items()))
        except (KeyError, TypeError, ValueError) as exc:
            raise AssetEventError(f"{where}: outputs: each needs uri, version and rows ({exc!r})") from exc
        return cls(dag_id=record["dag_id"], task_id=record["task_id"], epoch=record["epoch"],
                   incarnation=record["incarnation"], map_index=map_index, outputs=tables)


@dataclass(frozen=True)
class ConsumedEvent:
    """A commit record a consumer's run found among its triggering asset events, with the name
    of the Asset it came through: what the run consumed. The job reads the epoch it names at
    the incarnation the producer's ledger names when it runs (a newer one after a recovery's
    redo), not at the one the event carried.

    >>> event = ConsumedEvent("orders.ranking", CommittedEpoch(dag_id="orders", task_id="publish", epoch=2))
    >>> ConsumedEvent.from_json(event.to_json()) == event
    True
    >>> ConsumedEvent.from_json({"dag_id": "orders", "task_id": "publish", "epoch": 2, "incarnation": 0})
    Traceback (most recent call last):
    ...
    falkirk.policies.asset_events.AssetEventError: consumed event: no 'asset' (the name of the Asset it came through)
    """

    asset: str
    committed: CommittedEpoch

    def to_json(self) -> dict[str, Any]:
        return {"asset": self.asset, **self.committed.to_json()}

    @classmethod
    def from_json(cls, record: Any) -> ConsumedEvent:
        if not isinstance(record, Mapping) or not isinstance(record.get("asset"), str) or not record["asset"]:
            raise AssetEventError("consumed event: no 'asset' (the name of the Asset it came through)")
        return cls(record["asset"], CommittedEpoch.from_json({k: v for k, v in record.items() if k != "asset"}))


EPOCH_KEY_FORMAT = "%Y-%m-%dT%H:%M:%S"
"""The partition key a Falkirk task's asset events carry with ``partition_outlets=True``: its
epoch's logical date in UTC, as Airflow's temporal partition mappers read keys by default."""


def epoch_partition_key(logical_date: datetime) -> str:
    """The partition key of the epoch that starts at ``logical_date``.

    >>> epoch_partition_key(datetime(2026, 1, 2, 3, 0, tzinfo=UTC))
    '2026-01-02T03:00:00'
    """
    if logical_date.tzinfo is not None:
        logical_date = logical_date.astimezone(UTC)
    return logical_date.strftime(EPOCH_KEY_FORMAT)


def run_date(logical_date: datetime | None, partition_date: datetime | None = None,
             partition_key: str | None = None) -> datetime | None:
    """The date a DAG run's epoch is read from: its logical date; for a run Airflow started on
    asset events (which has none), the date of the partition it runs: ``partition_date`` (set
    by a temporal partition mapper), else the key itself when it is an epoch key (the identity
    mapper passes the producer's key on); ``None`` when the run has neither.

    >>> run_date(None, partition_key="2026-01-02T03:00:00")
    datetime.datetime(2026, 1, 2, 3, 0, tzinfo=datetime.timezone.utc)
    >>> run_date(None, partition_key="eu-west") is None
    True
    """
    if logical_date is not None:
        return logical_date
    if partition_date is not None:
        return partition_date
    if partition_key:
        try:
            return datetime.strptime(partition_key, EPOCH_KEY_FORMAT).replace(tzinfo=UTC)
        except ValueError:
            return None
    return None
