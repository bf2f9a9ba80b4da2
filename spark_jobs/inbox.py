"""An external input that keeps each epoch's batch until the pipeline acknowledges it.

Upstream systems drop one JSON-lines file per epoch into a landing directory
(``epoch-000001.jsonl``). The source task reads its epoch from there; the monitor
acknowledges epochs inside the source's low-watermark (Falkirk Wheel §4.3, inputs), and only
then does the inbox forget them, per its :class:`AckPolicy`:

* ``archive`` (the default): the file moves to ``_acknowledged/`` beside the batches;
* ``delete``: the file is removed.

The acknowledgement point is one small JSON file, replaced atomically, that never moves
backwards; it is written before any file moves, and every call sweeps all files at or below
it, so a crash halfway leaves nothing that a later call does not finish. Reading an
acknowledged epoch is an error: a premature acknowledgement shows up as a failed recovery,
never as silently different data.

>>> import tempfile
>>> inbox = Inbox(tempfile.mkdtemp(), policy="delete")
>>> _ = inbox.deliver(1, [{"kwh": 3, "meter": "m1"}]); _ = inbox.deliver(2, [])
>>> inbox.read(1), inbox.acknowledge(1), inbox.acknowledge(1), inbox.acknowledged, inbox.pending()
([{'kwh': 3, 'meter': 'm1'}], [1], [], 1, [2])
>>> inbox.read(1)
Traceback (most recent call last):
...
falkirk.spark_jobs.inbox.InboxError: epoch 1 of inbox ... was acknowledged (through epoch 1) and deleted; no recovery may ask for it
"""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path

INPUT_ACK_ENV = "FALKIRK_INPUT_ACK"
ARCHIVE_DIR = "_acknowledged"
POINT_FILE = "_acknowledged.json"


class InboxError(RuntimeError):
    """A batch the inbox cannot give: missing, or already acknowledged."""


class AckPolicy(str, enum.Enum):
    """What acknowledging an epoch does to its batch file."""

    ARCHIVE = "archive"
    DELETE = "delete"

    @classmethod
    def parse(cls, text: str | AckPolicy) -> AckPolicy:
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"{INPUT_ACK_ENV}={text!r}: choose one of {[p.value for p in cls]}") from None


class Inbox:
    """One landing directory of per-epoch batches (see the module docstring)."""

    def __init__(self, root: str | Path, policy: str | AckPolicy | None = None) -> None:
        self.root = Path(root)
        self.policy = AckPolicy.parse(policy or os.environ.get(INPUT_ACK_ENV) or AckPolicy.ARCHIVE)

    def path(self, epoch: int) -> Path:
        return self.root / f"epoch-{epoch:06d}.jsonl"

    def deliver(self, epoch: int, rows: list[dict[str, object]]) -> Path:
        """The upstream system's side: write (or replace) ``epoch``'s batch atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(epoch)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        tmp.replace(path)  # readers see the old batch or the new one, never half of one
        return path

    def read(self, epoch: int) -> list[dict[str, object]]:
        """``epoch``'s batch; an error once it is acknowledged or when it never arrived."""
        point = self.acknowledged
        if epoch <= point:
            raise InboxError(f"epoch {epoch} of inbox {self.root} was acknowledged (through epoch {point}) and "
                             f"{'archived' if self.policy is AckPolicy.ARCHIVE else 'deleted'}; "
                             f"no recovery may ask for it")
        path = self.path(epoch)
        if not path.is_file():
            raise InboxError(f"no batch for epoch {epoch} in inbox {self.root}: expected {path.name}")
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    @property
    def acknowledged(self) -> int:
        """The last epoch acknowledged (0: none)."""
        try:
            return int(json.loads((self.root / POINT_FILE).read_text())["acknowledged_through"])
        except FileNotFoundError:
            return 0

    def pending(self) -> list[int]:
        """The epochs whose batches the inbox still holds, in order."""
        if not self.root.is_dir():
            return []
        return sorted(int(p.name[6:12]) for p in self.root.glob("epoch-*.jsonl"))

    def acknowledge(self, through: int) -> list[int]:
        """Forget every epoch ``<= through`` per the policy; returns the epochs forgotten now.
        The point never moves backwards, and repeating a call changes nothing."""
        if through > self.acknowledged:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / (POINT_FILE + ".tmp")
            tmp.write_text(json.dumps({"acknowledged_through": through}))
            tmp.replace(self.root / POINT_FILE)
        point = self.acknowledged
        done = [e for e in self.pending() if e <= point]
        for epoch in done:
            path = self.path(epoch)
            if self.policy is AckPolicy.ARCHIVE:
                (self.root / ARCHIVE_DIR).mkdir(exist_ok=True)
                path.replace(self.root / ARCHIVE_DIR / path.name)
            else:
                path.unlink(missing_ok=True)
        return done
