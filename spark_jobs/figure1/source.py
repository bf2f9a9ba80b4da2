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

>>> import tempfile
>>> source = ClickstreamSource(tempfile.mkdtemp() + "/source.json")
>>> source.acknowledge(3), source.acknowledge(2), source.acknowledged
(3, 3, 3)
>>> source.check_available(4)
>>> source.check_available(3)
Traceback (most recent call last):
...
falkirk.spark_jobs.figure1.source.SourceError: clickstream epoch 3 was acknowledged (through epoch 3) and the source has forgotten it
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
    def for_dag(cls, durable_uri: str, dag_id: str) -> "ClickstreamSource":
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
        if epoch <= point:
            raise SourceError(f"clickstream epoch {epoch} was acknowledged (through epoch {point}) "
                              f"and the source has forgotten it")

    def read(self, spark: "SparkSession", epoch: int) -> "DataFrame":
        """Epoch ``epoch``'s raw events, if the source still holds them."""
        self.check_available(epoch)
        return clickstream(spark, epoch)
