"""An external destination that accepts batches by receipt, and the report of what it accepted.

A sink task sends each epoch's records to a system outside the store. Here that system is
an outbox directory: one JSON-lines batch per epoch (``epoch-000001.jsonl``), which its
reader (a loader, a partner's import job) accepts by writing a receipt
(``epoch-000001.accepted``). Sending an epoch again replaces its batch and withdraws its
receipt: after a rollback the sink re-sends, and only the new batch may be accepted.

The sink's epoch is a checkpoint only once accepted (Falkirk Wheel §4.3, outputs):
:func:`report_deliveries` records in the ledger the longest run of accepted epochs from
the first, after which the monitor lets the rest of the pipeline forget what it kept to
send them again.

>>> import tempfile
>>> outbox = Outbox(tempfile.mkdtemp())
>>> outbox.send(1, [{"meter": "m1", "kwh": 3}]).rows, outbox.send(2, []).rows
(1, 0)
>>> outbox.accept(2); outbox.accepted_through()   # epoch 1 is still waiting
0
>>> outbox.accept(1); outbox.accepted_through()
2
"""

from __future__ import annotations

import json
from pathlib import Path

from falkirk.policies.store.control import Deliveries
from falkirk.policies.store.ledger import Ledger
from falkirk.spark_jobs.runtime import Sent


class Outbox:
    """The destination's directory (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def destination(self) -> str:
        return f"outbox:{self.root}"

    def path(self, epoch: int) -> Path:
        return self.root / f"epoch-{epoch:06d}.jsonl"

    def _receipt(self, epoch: int) -> Path:
        return self.root / f"epoch-{epoch:06d}.accepted"

    def send(self, epoch: int, rows: list[dict[str, object]]) -> Sent:
        """The sink's side: (re)place ``epoch``'s batch atomically; any earlier receipt is withdrawn."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._receipt(epoch).unlink(missing_ok=True)
        path = self.path(epoch)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        tmp.replace(path)
        return Sent(self.destination, len(rows))

    def batch(self, epoch: int) -> list[dict[str, object]]:
        """What the destination holds for ``epoch`` (the reader's view)."""
        path = self.path(epoch)
        return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []

    def accept(self, epoch: int) -> None:
        """The reader's side: it has loaded ``epoch``'s batch and will not need it again."""
        if not self.path(epoch).is_file():
            raise FileNotFoundError(f"outbox {self.root} holds no batch for epoch {epoch} to accept")
        self._receipt(epoch).write_text("")

    def accepted_through(self) -> int:
        """The last epoch of the longest run of accepted epochs from epoch 1 (0: none)."""
        epoch = 0
        while self._receipt(epoch + 1).is_file():
            epoch += 1
        return epoch


def report_deliveries(ledger: Ledger, dag_id: str, task_id: str, outbox: Outbox) -> int:
    """Record in the ledger what ``outbox`` has accepted of ``task_id``'s epochs; returns the
    task's delivery point. Epochs the task has not committed yet are not reported."""
    deliveries = Deliveries(ledger.store)
    committed = {e.epoch for e in ledger.entries(dag_id, task_id)}
    through = 0
    while through + 1 in committed and through + 1 <= outbox.accepted_through():
        through += 1
    if through:
        deliveries.record(dag_id, task_id, through, ledger.external_senders(dag_id))
    return deliveries.through(dag_id).get(task_id, 0)
