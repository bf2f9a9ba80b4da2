"""The clicks pipeline's input: a batch of click events per epoch, from an inbox or generated.

With ``FALKIRK_INBOX`` set, epoch ``n`` of DAG ``d`` is the JSON list in
``$FALKIRK_INBOX/d/epoch-n.json`` (a landing zone that upstream systems fill, and where a
wrong delivery can be corrected); without it, the batch is generated deterministically.
Some quantities are zero or negative on purpose: ``clean`` drops them.

>>> rows = clicks_for_epoch(1)
>>> len(rows), rows[0]
(20, {'event_id': 1000, 'item': 'cap', 'qty': 2})
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ITEMS = ("boots", "cap", "gloves", "scarf", "tent", "torch")
EVENTS_PER_EPOCH = 20
INBOX_ENV = "FALKIRK_INBOX"


def clicks_for_epoch(epoch: int) -> list[dict[str, object]]:
    """The generated events of ``epoch``: ``event_id``, ``item`` and ``qty``."""
    return [
        {"event_id": epoch * 1000 + i, "item": ITEMS[(i * 5 + epoch) % len(ITEMS)], "qty": (i * 7 + epoch * 3) % 9 - 1}
        for i in range(EVENTS_PER_EPOCH)
    ]


def inbox_file(inbox: str | Path, dag_id: str, epoch: int) -> Path:
    return Path(inbox) / dag_id / f"epoch-{epoch}.json"


def deliver(inbox: str | Path, dag_id: str, epoch: int, rows: list[dict[str, object]]) -> Path:
    """Write (or replace) epoch ``epoch``'s batch for ``dag_id`` in the inbox."""
    path = inbox_file(inbox, dag_id, epoch)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows))
    tmp.replace(path)  # readers see the old batch or the new one, never half of one
    return path


def read_batch(dag_id: str, epoch: int) -> list[dict[str, object]]:
    """The batch the source reads for ``epoch``: the inbox's if configured, else the generated one."""
    inbox = os.environ.get(INBOX_ENV)
    if not inbox:
        return clicks_for_epoch(epoch)
    path = inbox_file(inbox, dag_id, epoch)
    if not path.is_file():
        raise FileNotFoundError(f"no batch for epoch {epoch} of {dag_id}: expected {path}")
    return json.loads(path.read_text())
