"""Checkpoints inside an epoch, at lex times (epoch, step).

A long epoch (an iterative job, a large input processed in chunks) may checkpoint before it
ends. Its times are then pairs (epoch, step), ordered lexicographically (Falkirk Wheel §2.2): (3, 20)
comes after (3, 15) and before (4, 0). A **step checkpoint** is what the job carries at
(epoch, step): the ranks after iteration 20, or the result of chunk 4. Each is one Delta
commit to a table of its own (``steps-<kind>-<step>`` beside the task's other tables, the
epoch's rows replaced, the usual idempotent key) and then one row of ``_falkirk/steps``,
appended last: the commit point, as the ledger row is for a whole epoch.

Only the task's own next attempt uses them. A retry of the task instance, or a replay that
redoes the same incarnation, resumes after the latest step checkpoint that is still
*usable*: same epoch and incarnation, its table still holds its commit, and every ledger row
it was computed from (the previous state, the inputs read) is still current. Downstream never
sees a step: the epoch's ledger row is the egress projection (epoch, step) ↦ epoch, and a
reader waits for it as for any epoch. Once that row is committed the epoch's step
checkpoints are deleted: a consistent frontier inside an epoch whose result is committed
would need an input of that epoch to be rolled back, and every step read it.

>>> import tempfile
>>> from falkirk.policies.store.config import StoreConfig
>>> root = tempfile.mkdtemp()
>>> steps = StepLog(StoreConfig(root + "/store", root + "/scratch"))
>>> cp = StepCheckpoint(dag_id="d", task_id="rank", map_index=-1, epoch=3, incarnation=0, kind="iteration", step=10, of=30,
...                     uri=root + "/store/d/rank/steps-iteration-10", tier="durable", version=0, rows=5)
>>> steps.append(cp), steps.append(cp)
(True, False)
>>> [(c.time, c.progress) for c in steps.of_epoch("d", "rank", -1, 3, 0)]
[((3, 10), 'iteration 10 of 30')]
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa

from falkirk.policies.ids import CommitId, OfCommit, ProcessorId
from falkirk.policies.store.commits import CommitKey, append_once, compact_every, open_table, scan
from falkirk.policies.store.config import StoreConfig
from falkirk.policies.store.ledger import COMPACT_EVERY

SCHEMA = pa.schema(
    [
        pa.field("dag_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("map_index", pa.int32(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("incarnation", pa.int32(), nullable=False),
        # "iteration" or "chunk": what a step is; `step` of `of` are done at this checkpoint.
        pa.field("kind", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("of", pa.int64(), nullable=False),
        pa.field("uri", pa.string(), nullable=False),
        pa.field("tier", pa.string(), nullable=False),
        pa.field("version", pa.int64(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        # JSON list of [task_id, map_index, epoch, incarnation]: the ledger rows the step was computed from.
        pa.field("depends_on", pa.string(), nullable=False),
        pa.field("worker", pa.string()),
        pa.field("try_number", pa.int32(), nullable=False),
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

KINDS = ("iteration", "chunk")

@dataclass(frozen=True, kw_only=True)
class StepCheckpoint(OfCommit):
    """One checkpoint inside an epoch: ``step`` of ``of`` iterations (or chunks) done at lex time
    ``(epoch, step)``, its carried rows in the table at ``uri``."""

    dag_id: str
    task_id: str
    map_index: int
    epoch: int
    incarnation: int
    kind: str
    step: int
    of: int
    uri: str
    tier: str
    version: int
    rows: int
    depends_on: tuple[CommitId, ...] = ()
    worker: str | None = None
    try_number: int = 1
    committed_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"step checkpoint kind={self.kind!r}: one of {', '.join(KINDS)}")
        if not 1 <= self.step <= self.of:
            raise ValueError(f"step checkpoint step={self.step}: between 1 and of={self.of}")

    @property
    def time(self) -> tuple[int, int]:
        """The lex time (epoch, step) this checkpoint restores to."""
        return (self.epoch, self.step)


    @property
    def progress(self) -> str:
        """How far into its epoch the task got, for people: ``iteration 20 of 30``."""
        return f"{self.kind} {self.step} of {self.of}"

    @property
    def key(self) -> CommitKey:
        """The idempotency key of its table commit (one table per step: the epoch's key is enough)."""
        return CommitKey(dag_id=self.dag_id, task_id=self.task_id, epoch=self.epoch, map_index=self.map_index, incarnation=self.incarnation)


def table_name(kind: str, step: int) -> str:
    """The table a step checkpoint is committed to, beside the task's ``output`` and ``state``.

    >>> table_name("iteration", 20)
    'steps-iteration-20'
    """
    return f"steps-{kind}-{step}"


class StepLog:
    """The step checkpoints of every task (``_falkirk/steps``), append-only and idempotent."""

    def __init__(self, store: StoreConfig) -> None:
        self.store = store
        self.uri = store.control_uri("steps")

    def append(self, cp: StepCheckpoint) -> bool:
        """Record ``cp`` (its table commit is made); ``False`` when it was already recorded."""
        record = {**{f: getattr(cp, f) for f in SCHEMA.names if f != "depends_on"},
                  "depends_on": json.dumps([[d.task, d.map_index, d.epoch, d.incarnation] for d in cp.depends_on])}
        once = CommitKey(dag_id=cp.dag_id, task_id=f"steps/{cp.task_id}/{cp.kind}-{cp.step}", epoch=cp.epoch, map_index=cp.map_index, incarnation=cp.incarnation)
        result = append_once(self.uri, pa.Table.from_pylist([record], schema=SCHEMA), once,
                             self.store.options_for(self.uri))
        compact_every(result, COMPACT_EVERY, self.store.options_for(self.uri), "step log")
        return result.applied

    def of_epoch(self, dag_id: str, task_id: str, map_index: int, epoch: int,
                 incarnation: int | None = None) -> list[StepCheckpoint]:
        """The step checkpoints of one processor's epoch (one incarnation of it, if given), in lex order."""
        where: dict[str, int | str] = {"dag_id": dag_id, "task_id": task_id, "map_index": map_index, "epoch": epoch}
        if incarnation is not None:
            where["incarnation"] = incarnation
        return sorted(self._rows(where), key=lambda c: (c.incarnation, c.step))

    def of_task(self, dag_id: str, task_id: str, map_index: int, through: int) -> list[StepCheckpoint]:
        """The step checkpoints of one processor's epochs up to ``through``."""
        rows = self._rows({"dag_id": dag_id, "task_id": task_id, "map_index": map_index})
        return sorted((c for c in rows if c.epoch <= through), key=lambda c: (c.epoch, c.incarnation, c.step))

    def of_dag(self, dag_id: str) -> list[StepCheckpoint]:
        """Every step checkpoint of ``dag_id`` (for the view and the collector)."""
        return sorted(self._rows({"dag_id": dag_id}), key=lambda c: (c.task_id, c.map_index, c.epoch, c.step))

    def _rows(self, where: dict[str, int | str]) -> Iterable[StepCheckpoint]:
        table = open_table(self.uri, self.store.options_for(self.uri))
        if table is None:
            return []
        return [_from_record(r) for r in scan(table, where=where).to_pylist()]


def _from_record(r: dict) -> StepCheckpoint:
    deps = tuple(CommitId(dag=r["dag_id"], processor=ProcessorId(task=str(t), map_index=int(m)), epoch=int(e),
                          incarnation=int(i)) for t, m, e, i in json.loads(r["depends_on"]))
    return StepCheckpoint(**{**{k: v for k, v in r.items() if k != "depends_on"}, "depends_on": deps})


def latest_usable(checkpoints: Iterable[StepCheckpoint], kind: str, of: int,
                  invalidated: set[CommitId], current: set[CommitId]) -> list[StepCheckpoint]:
    """The checkpoints a new attempt may resume from, latest first: of this ``kind`` and count
    ``of``, computed only from ledger rows that are neither rolled back (``invalidated``) nor
    replaced by a newer incarnation (each is one of the ``current`` rows).

    >>> links = lambda incarnation: CommitId(dag="d", processor=ProcessorId(task="links"), epoch=2,
    ...                                      incarnation=incarnation)
    >>> cp = lambda step, deps: StepCheckpoint(dag_id="d", task_id="rank", map_index=-1, epoch=2, incarnation=0,
    ...                                        kind="iteration", step=step, of=9, uri="/t", tier="durable",
    ...                                        version=0, rows=1, depends_on=deps)
    >>> [c.step for c in latest_usable([cp(3, (links(0),)), cp(6, (links(1),))], "iteration", 9, set(), {links(0)})]
    [3]
    >>> latest_usable([cp(3, (links(0),))], "iteration", 9, {links(0)}, {links(0)})
    []
    """
    usable = []
    for c in checkpoints:
        if c.kind != kind or c.of != of:
            continue
        if any(d in invalidated or d not in current for d in c.depends_on):
            continue
        usable.append(c)
    return sorted(usable, key=lambda c: c.step, reverse=True)
