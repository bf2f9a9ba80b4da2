"""The clickstream's source: it keeps each epoch's events until they are acknowledged.

A real clickstream (a message queue, a landing bucket) cannot hold data for ever: once the
pipeline acknowledges an epoch, the source may forget it. Acknowledging too early loses
data a recovery needs; the events task therefore acknowledges only the epochs inside its
low-watermark, computed from the durable checkpoints in the ledger
(:func:`falkirk.policies.planning.monitor.acknowledged_inputs`): epochs that no failure can ever make the
pipeline read again. Reading an acknowledged epoch is an error, so a premature
acknowledgement shows up as a failed recovery, not as silently different data.

The acknowledged epoch is one small JSON file (``{durable}/{dag_id}/clickstream_source.json``),
replaced atomically, and it never moves backwards.

Upstream gets things wrong too: a batch can land incomplete (a tenth of its events missing)
and be delivered again whole later, after the pipeline has read it and moved on. The upstream
records both in a file of its own beside the acknowledgements (``*.deliveries.json``). A
recovery of that epoch as a bad epoch (``falkirk plan --bad-epoch events:E``) reads it again,
and the epochs after it (the stateful tasks roll back to before it) and some before it: the
window popularity reads, and more if a worker lost during the recovery takes rank's newer
states with it. A batch delivered again therefore re-opens the source, acknowledged or not, from
the epoch :func:`falkirk.policies.planning.monitor.inputs_to_reopen` names for ``E``, until
upstream is told the recovery has read it.

>>> import tempfile
>>> source = ClickstreamSource(tempfile.mkdtemp() + "/source.json")
>>> source.acknowledge(3), source.acknowledge(2), source.acknowledged
(3, 3, 3)
>>> source.check_available(4)
>>> source.check_available(3)
Traceback (most recent call last):
...
falkirk.spark_jobs.figure1.source.SourceError: clickstream epoch 3 was acknowledged (through epoch 3) and the source has forgotten it
>>> source.deliver_incomplete(3)
>>> source.incomplete(3)
True
>>> source.deliver_again(3, reopen_from=2)  # whole, and held again though acknowledged
>>> source.incomplete(3), source.check_available(3), source.check_available(2)
(False, None, None)
>>> source.check_available(1)
Traceback (most recent call last):
...
falkirk.spark_jobs.figure1.source.SourceError: clickstream epoch 1 was acknowledged (through epoch 3) and the source has forgotten it
>>> source.recovered()
>>> source.check_available(2)
Traceback (most recent call last):
...
falkirk.spark_jobs.figure1.source.SourceError: clickstream epoch 2 was acknowledged (through epoch 3) and the source has forgotten it
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from falkirk.spark_jobs.figure1 import local_file
from falkirk.spark_jobs.figure1.data import clickstream

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCE_ENV = "FALKIRK_CLICKSTREAM_ACKS"


class SourceError(RuntimeError):
    """The source no longer holds what was asked for."""


class ClickstreamSource:
    """The generated clickstream behind an acknowledgement point kept in ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def for_dag(cls, durable_uri: str, dag_id: str) -> ClickstreamSource:
        """``$FALKIRK_CLICKSTREAM_ACKS`` (``{dag_id}`` in it is replaced), or
        ``{durable}/{dag_id}/clickstream_source.json`` when the durable tier is a local path."""
        return cls(local_file(SOURCE_ENV, durable_uri, dag_id, "clickstream_source.json", "the clickstream's acknowledgements"))

    @property
    def acknowledged(self) -> int:
        """The last epoch acknowledged (0: none)."""
        try:
            with open(self.path) as f:
                return int(json.load(f)["acknowledged_through"])
        except FileNotFoundError:
            return 0

    def acknowledge(self, through: int) -> int:
        """Let the source forget epochs ``<= through``; never moves backwards. Returns the point."""
        if through <= self.acknowledged:
            return self.acknowledged
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"acknowledged_through": through}, f)
        os.replace(tmp, self.path)  # atomic: a reader sees the old point or the new one
        return through

    def check_available(self, epoch: int) -> None:
        point = self.acknowledged
        reopened = self._deliveries()["reopened_from"]
        if epoch <= point and not (reopened and epoch >= reopened):
            raise SourceError(f"clickstream epoch {epoch} was acknowledged (through epoch {point}) "
                              f"and the source has forgotten it")

    def read(self, spark: SparkSession, epoch: int) -> DataFrame:
        """Epoch ``epoch``'s raw events, if the source still holds them (as delivered)."""
        self.check_available(epoch)
        events = clickstream(spark, epoch)
        if self.incomplete(epoch):
            from pyspark.sql import functions as F

            events = events.where(F.pmod(F.col("event_id"), F.lit(10)) != 0)
        return events

    # --- what upstream delivered (written by upstream, never by the pipeline) ------------------

    @property
    def deliveries_path(self) -> str:
        return f"{os.path.splitext(self.path)[0]}.deliveries.json"

    def _deliveries(self) -> dict:
        try:
            with open(self.deliveries_path) as f:
                held = json.load(f)
        except FileNotFoundError:
            held = {}
        return {"incomplete": list(held.get("incomplete", [])), "reopened_from": held.get("reopened_from")}

    def _record(self, deliveries: dict) -> None:
        tmp = f"{self.deliveries_path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(deliveries, f)
        os.replace(tmp, self.deliveries_path)

    def incomplete(self, epoch: int) -> bool:
        """Whether epoch ``epoch``'s batch is, for now, delivered with a tenth of its events missing."""
        return epoch in self._deliveries()["incomplete"]

    def deliver_incomplete(self, epoch: int) -> None:
        """Upstream: epoch ``epoch``'s batch lands with a tenth of its events missing."""
        deliveries = self._deliveries()
        deliveries["incomplete"] = sorted({*deliveries["incomplete"], epoch})
        self._record(deliveries)

    def deliver_again(self, epoch: int, reopen_from: int) -> None:
        """Upstream: epoch ``epoch``'s batch is delivered again, whole, and the source holds every
        epoch from ``reopen_from`` on again, acknowledged or not."""
        deliveries = self._deliveries()
        deliveries["incomplete"] = [e for e in deliveries["incomplete"] if e != epoch]
        held = deliveries["reopened_from"]
        deliveries["reopened_from"] = min(reopen_from, held) if held else reopen_from
        self._record(deliveries)

    def recovered(self) -> None:
        """Upstream: the recovery of what was delivered again has read it; forget the acknowledged
        epochs again."""
        deliveries = self._deliveries()
        deliveries["reopened_from"] = None
        self._record(deliveries)
