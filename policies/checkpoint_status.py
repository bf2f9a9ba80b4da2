"""What the ledger holds for each (task, epoch): the cells of the Falkirk view's grid.

Every task instance that committed through Falkirk has a ledger row; the row says where
its state and outputs went. :func:`status_grid` reduces each (task, epoch) to one
:class:`CheckpointStatus`, in this order of precedence:

* ``collected``: the checkpoint was garbage-collected (below the task's low-watermark);
* ``durable``: its state is checkpointed on the durable tier (it can be restored from);
* ``scratch``: its state, or its output with no state, is kept only on scratch;
* ``logged``: it keeps no state and its outputs are logged on the durable tier;
* ``invalidated``: a recovery rolled its row back and no re-run has committed since;
* ``missing``: no row (never ran, still running, or failed before committing).

Each task's statuses are encoded as one string with a letter per epoch, which keeps the
view's payload small for long histories.

>>> from policies.ledger import LedgerEntry, OutputRef
>>> out = lambda tier: (OutputRef("output", "/t", tier, 1, 3),)
>>> rows = [LedgerEntry("d", "clean", 1, "batch(log_outputs=true)", "r1", 1, outputs=out("durable")),
...         LedgerEntry("d", "model", 1, "lazy_checkpoint(every=2)", "r1", 1, state_tier="scratch"),
...         LedgerEntry("d", "model", 2, "lazy_checkpoint(every=2)", "r2", 1, state_tier="durable")]
>>> grid = status_grid(["clean", "model"], rows, last_epoch=3,
...                    invalidated=[LedgerEntry("d", "clean", 2, "batch", "r2", 1)])
>>> grid
{'clean': 'LI-', 'model': 'SD-'}
>>> [CheckpointStatus.of_code(c).label for c in grid["model"]]
['scratch only', 'durable', 'missing']
"""

from __future__ import annotations

from enum import Enum
from typing import Iterable, Mapping, Sequence

from policies.ledger import LedgerEntry


class CheckpointStatus(Enum):
    """One cell of the grid: ``(code, label)``; the code is one letter of the encoded row."""

    COLLECTED = ("G", "garbage-collected")
    DURABLE = ("D", "durable")
    SCRATCH = ("S", "scratch only")
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
    def of_code(cls, code: str) -> "CheckpointStatus":
        for status in cls:
            if status.code == code:
                return status
        raise ValueError(f"status code {code!r} is not one of {[s.code for s in cls]}")

    @classmethod
    def of_entry(cls, entry: LedgerEntry) -> "CheckpointStatus":
        """The status of a current (not rolled back, not collected) ledger row."""
        if entry.state_tier == "durable":
            return cls.DURABLE
        if entry.state_tier is not None:
            return cls.SCRATCH
        if entry.outputs and all(o.tier == "durable" for o in entry.outputs):
            return cls.LOGGED
        return cls.SCRATCH


def status_grid(
    tasks: Sequence[str],
    entries: Iterable[LedgerEntry],
    last_epoch: int,
    invalidated: Iterable[LedgerEntry] = (),
    collected_through: Mapping[str, int] | None = None,
    first_epoch: int = 1,
) -> dict[str, str]:
    """Per task, its statuses for epochs ``first_epoch..last_epoch`` as one string (see the module docstring).

    ``entries`` are the ledger's current rows, ``invalidated`` the rows recoveries rolled
    back, ``collected_through`` each task's last garbage-collected epoch.
    """
    width = max(last_epoch - first_epoch + 1, 0)
    cells = {t: [CheckpointStatus.MISSING.code] * width for t in tasks}

    def put(task: str, epoch: int, status: CheckpointStatus) -> None:
        if task in cells and first_epoch <= epoch <= last_epoch:
            cells[task][epoch - first_epoch] = status.code

    for e in invalidated:
        put(e.task_id, e.epoch, CheckpointStatus.INVALIDATED)
    for e in entries:
        put(e.task_id, e.epoch, CheckpointStatus.of_entry(e))
    for task, through in (collected_through or {}).items():
        for epoch in range(first_epoch, min(through, last_epoch) + 1):
            if task in cells and cells[task][epoch - first_epoch] != CheckpointStatus.MISSING.code:
                put(task, epoch, CheckpointStatus.COLLECTED)
    return {t: "".join(c) for t, c in cells.items()}


__all__ = ["CheckpointStatus", "status_grid"]
