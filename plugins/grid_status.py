"""What the ledger holds for each (task, epoch): the cells of the Falkirk view's grid.

Every task instance that committed through Falkirk has a ledger row; the row says where
its state and outputs went. :func:`grid_from_ledger` reduces each (task, epoch) to one
:class:`CheckpointStatus`, in this order of precedence:

* ``collected``: the checkpoint was garbage-collected (below the task's low-watermark);
* ``durable``: its state is checkpointed on the durable tier (it can be restored from);
* ``lost``: it was kept only on scratch, and the scratch files are gone (a deleted directory,
  a lost worker's disk): read with the same :class:`~falkirk.policies.store.readability.StoreReadability`
  the planner uses, so the grid shows what a plan will find;
* ``scratch``: its state, or its output with no state, is kept only on scratch;
* ``logged``: it keeps no state and its outputs are logged on the durable tier;
* ``invalidated``: a recovery rolled its row back and no re-run has committed since;
* ``missing``: no row (never ran, still running, or failed before committing).

Each task's statuses are encoded as one string with a letter per epoch, which keeps the
view's payload small for long histories. The grid is computed from the ledger's columns
(Arrow), not from :class:`~falkirk.policies.store.ledger.LedgerEntry` objects, so that 25,000 rows
take milliseconds.

>>> from falkirk.policies.store.ledger import LedgerEntry, OutputRef
>>> out = lambda tier: (OutputRef("output", "/t", tier, 1, 3),)
>>> rows = [LedgerEntry(dag_id="d", task_id="clean", epoch=1, regime="batch(log_outputs=true)", run_id="r1", try_number=1, outputs=out("durable")),
...         LedgerEntry(dag_id="d", task_id="clean", epoch=2, regime="batch(log_outputs=true)", run_id="r2", try_number=1, outputs=out("durable")),
...         LedgerEntry(dag_id="d", task_id="model", epoch=1, regime="lazy_checkpoint(every=2)", run_id="r1", try_number=1, state_tier="scratch"),
...         LedgerEntry(dag_id="d", task_id="model", epoch=2, regime="lazy_checkpoint(every=2)", run_id="r2", try_number=1, state_tier="durable")]
>>> grid = grid_from_rows(["clean", "model"], [r.to_row() for r in rows], invalidated={rows[1].commit_id},
...                       last_epoch=3)
>>> grid.status
{'clean': 'LI-', 'model': 'SD-'}
>>> grid.runs
{1: 'r1', 2: 'r2'}
>>> [CheckpointStatus.of_code(c).label for c in grid.status["model"]]
['scratch only', 'durable', 'missing']
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from enum import Enum
from typing import Any

from falkirk.policies.ids import CommitId, ProcessorId
from falkirk.policies.regimes import Tier
from falkirk.policies.store.commits import CommitKey
from falkirk.policies.store.ledger import Ledger, LedgerSnapshot
from falkirk.policies.store.readability import Readable


class CheckpointStatus(Enum):
    """One cell of the grid: ``(code, label)``; the code is one letter of the encoded row."""

    COLLECTED = ("G", "garbage-collected")
    DURABLE = ("D", "durable")
    SCRATCH = ("S", "scratch only")
    LOST = ("X", "lost (scratch files gone)")
    LOGGED = ("L", "logged outputs")
    INVALIDATED = ("I", "invalidated by a recovery")
    MISSING = ("-", "missing")

    @property
    def code(self) -> str:
        return self.value[0]

    @property
    def label(self) -> str:
        return self.value[1]

    @classmethod
    def of_code(cls, code: str) -> CheckpointStatus:
        for status in cls:
            if status.code == code:
                return status
        raise ValueError(f"status code {code!r} is not one of {[s.code for s in cls]}")

    @classmethod
    def of_row(cls, state_tier: str | None, outputs_json: str) -> CheckpointStatus:
        """The status of a current (not rolled back, not collected) ledger row."""
        if state_tier == "durable":
            return cls.DURABLE
        if state_tier is not None:
            return cls.SCRATCH
        tiers = {o["tier"] for o in json.loads(outputs_json or "[]")}
        return cls.LOGGED if tiers == {"durable"} else cls.SCRATCH


@dataclass(frozen=True)
class CheckpointGrid:
    """The grid of one DAG: per task a string of status codes for epochs 1..``last_epoch``,
    and the DAG run of each epoch that has a ledger row (or that :func:`with_runs` placed)."""

    status: dict[str, str]
    runs: dict[int, str]
    last_epoch: int


def with_runs(grid: CheckpointGrid, runs: Mapping[int, str]) -> CheckpointGrid:
    """``grid`` with more DAG runs at their epochs: runs that committed nothing (a run whose
    first task failed, say) get missing cells, and the grid grows to the newest of them.

    >>> grid = with_runs(CheckpointGrid({"a": "SS"}, {1: "r1", 2: "r2"}, 2), {4: "r4"})
    >>> grid.status, grid.runs, grid.last_epoch
    ({'a': 'SS--'}, {1: 'r1', 2: 'r2', 4: 'r4'}, 4)
    """
    added = {e: r for e, r in runs.items() if e >= 1 and e not in grid.runs}
    last = max([grid.last_epoch, *added])
    missing = CheckpointStatus.MISSING.code
    return CheckpointGrid({t: codes.ljust(last, missing) for t, codes in grid.status.items()},
                          {**grid.runs, **added}, last)


def current_epochs(grid: CheckpointGrid) -> set[int]:
    """The epochs where some task has a current row (a cell neither missing nor invalidated).

    >>> sorted(current_epochs(CheckpointGrid({"a": "DI-S", "b": "--I-"}, {}, 4)))
    [1, 4]
    """
    idle = (CheckpointStatus.MISSING.code, CheckpointStatus.INVALIDATED.code)
    return {i + 1 for codes in grid.status.values() for i, c in enumerate(codes) if c not in idle}


def trimmed(grid: CheckpointGrid, last_epoch: int) -> CheckpointGrid:
    """``grid`` without the epochs after ``last_epoch`` (unchanged if it has none).

    >>> trimmed(CheckpointGrid({"a": "DIII"}, {1: "r1", 4: "r4"}, 4), 1)
    CheckpointGrid(status={'a': 'D'}, runs={1: 'r1'}, last_epoch=1)
    """
    if last_epoch >= grid.last_epoch:
        return grid
    return CheckpointGrid({t: codes[:last_epoch] for t, codes in grid.status.items()},
                          {e: r for e, r in grid.runs.items() if e <= last_epoch}, last_epoch)


def grid_from_rows(
    tasks: Sequence[str],
    rows: Iterable[Mapping[str, Any]] | Mapping[str, list],
    invalidated: Set[CommitId] = frozenset(),
    last_epoch: int | None = None,
    collected_through: Mapping[str, int] | None = None,
    readable: Readable | None = None,
    collected: Callable[[str, CommitKey], bool] | None = None,
) -> CheckpointGrid:
    """The grid from ledger rows (dicts, or columns as from ``pyarrow.Table.to_pydict``).

    ``invalidated`` holds the commits recoveries rolled back; ``collected_through`` each task's last garbage-collected epoch. ``tasks`` are
    processors: a partition of a partitioned task has a row of its own, ``task[i]``. With
    ``readable`` (and the columns ``dag_id`` and ``state_uri``), a scratch-only cell whose
    scratch tables no longer hold its commit is ``lost``, unless ``collected`` says garbage
    collection deleted its epoch from each of them (an output no reader needs any more): then
    it is ``collected``.
    """
    cols = rows if isinstance(rows, Mapping) else _columns(list(rows))
    n = len(cols.get("task_id", ()))
    runs: dict[int, str] = {}
    # (task, epoch) -> (incarnation, code) of its latest current row; or "I" if only rolled back
    best: dict[tuple[ProcessorId, int], tuple[int, str]] = {}
    row_of: dict[tuple[ProcessorId, int], int] = {}
    for i in range(n):
        task = ProcessorId(task=cols["task_id"][i], map_index=cols["map_index"][i])
        epoch, inc = cols["epoch"][i], cols["incarnation"][i]
        runs[epoch] = cols["run_id"][i]
        if invalidated and CommitId(dag=cols["dag_id"][i], processor=task, epoch=epoch, incarnation=inc) in invalidated:
            best.setdefault((task, epoch), (-1, CheckpointStatus.INVALIDATED.code))
            continue
        if inc >= best.get((task, epoch), (-1, ""))[0]:
            best[task, epoch] = (inc, CheckpointStatus.of_row(cols["state_tier"][i], cols["outputs"][i]).code)
            row_of[task, epoch] = i
    last = last_epoch if last_epoch is not None else max(runs, default=0)
    if readable is not None:
        for cell, (inc, code) in best.items():
            if code == CheckpointStatus.SCRATCH.code:
                best[cell] = (inc, _scratch_status(cols, row_of[cell], readable, collected).code)
    cells = {t: [CheckpointStatus.MISSING.code] * last for t in tasks}
    for (processor, epoch), (_, code) in best.items():
        if processor in cells and 1 <= epoch <= last:
            cells[processor][epoch - 1] = code
    for name, through in (collected_through or {}).items():
        for epoch in range(1, min(through, last) + 1):
            if name in cells and cells[name][epoch - 1] != CheckpointStatus.MISSING.code:
                cells[name][epoch - 1] = CheckpointStatus.COLLECTED.code
    return CheckpointGrid({t: "".join(c) for t, c in cells.items()}, dict(sorted(runs.items())), last)


def grid_from_ledger(ledger: Ledger | LedgerSnapshot, dag_id: str, tasks: Sequence[str],
                     collected_through: Mapping[str, int] | None = None,
                     readable: Readable | None = None,
                     collected: Callable[[str, CommitKey], bool] | None = None) -> CheckpointGrid:
    """The grid of ``dag_id`` from one read of the ledger and one of its invalidations (none
    when given a snapshot of the DAG); with ``readable``, scratch-only cells whose files are
    gone show as lost."""
    snapshot = ledger if isinstance(ledger, LedgerSnapshot) else LedgerSnapshot(ledger, dag_id)
    cols = snapshot.rows.select(["dag_id", "task_id", "map_index", "epoch", "incarnation", "run_id", "state_tier",
                                 "state_uri", "outputs"]).to_pydict()
    return grid_from_rows(tasks, cols, snapshot.gone, collected_through=collected_through, readable=readable,
                          collected=collected)


def _scratch_status(cols: Mapping[str, list], i: int, readable: Readable,
                    collected: Callable[[str, CommitKey], bool] | None) -> CheckpointStatus:
    """Row ``i``'s scratch cell: ``scratch`` while its scratch tables hold its commit; else
    ``collected`` when garbage collection deleted it from each table that lost it, ``lost``
    when something else did (a deleted directory, a lost worker's disk)."""
    key = CommitKey(dag_id=cols["dag_id"][i], task_id=cols["task_id"][i], epoch=cols["epoch"][i], map_index=cols["map_index"][i],
                    incarnation=cols["incarnation"][i])
    uris = [o["uri"] for o in json.loads(cols["outputs"][i] or "[]") if o["tier"] == Tier.SCRATCH.value]
    if cols["state_tier"][i] == Tier.SCRATCH.value and cols["state_uri"][i]:
        uris.append(cols["state_uri"][i])
    gone = [uri for uri in uris if not readable(uri, key)]
    if not gone:
        return CheckpointStatus.SCRATCH
    if collected is not None and all(collected(uri, key) for uri in gone):
        return CheckpointStatus.COLLECTED
    return CheckpointStatus.LOST


_NOT_CHECKPOINTED = (CheckpointStatus.MISSING.code, CheckpointStatus.INVALIDATED.code)


def unrecorded(grid: CheckpointGrid, succeeded: Iterable[tuple[str, str]],
               collected_through: Mapping[str, int] | None = None) -> list[tuple[str, int, str]]:
    """The (task, epoch, run id) that Airflow reports succeeded but whose ledger row is missing
    or rolled back (grid cell ``-`` or ``I``).

    Every instance of a Falkirk task appends its ledger row before it succeeds, and a
    recovery clears the instances whose rows it rolls back; so, unless a recovery is running
    right now (its clears follow its invalidations), such an instance's row was lost (a
    deleted ``_delta_log`` entry of the ledger) or the instance was marked successful by hand
    without running. Either way the epoch is not checkpointed and the instance has to run
    again. ``succeeded`` holds (task, run id) pairs; runs the grid does not know (no task of
    the run has a ledger row) and garbage-collected epochs (``collected_through``) are left out.

    >>> grid = CheckpointGrid({"clean": "L-", "model": "SI"}, {1: "r1", 2: "r2"}, 2)
    >>> unrecorded(grid, [("clean", "r1"), ("clean", "r2"), ("model", "r2"), ("model", "r9")])
    [('clean', 2, 'r2'), ('model', 2, 'r2')]
    """
    epoch_of = {run: epoch for epoch, run in grid.runs.items()}
    found = {(task, epoch_of[run], run) for task, run in succeeded
             if task in grid.status and run in epoch_of and 1 <= epoch_of[run] <= grid.last_epoch
             and grid.status[task][epoch_of[run] - 1] in _NOT_CHECKPOINTED
             and epoch_of[run] > (collected_through or {}).get(task, 0)}
    return sorted(found, key=lambda f: (f[1], f[0]))


def _columns(rows: list[Mapping[str, Any]]) -> dict[str, list]:
    names = ("dag_id", "task_id", "map_index", "epoch", "incarnation", "run_id", "state_tier", "state_uri", "outputs")
    return {n: [r.get(n) for r in rows] for n in names}


__all__ = ["CheckpointGrid", "CheckpointStatus", "current_epochs", "grid_from_ledger", "grid_from_rows", "trimmed",
           "unrecorded"]
