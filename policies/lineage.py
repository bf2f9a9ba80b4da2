"""What an epoch read, for lineage: the committed tables behind its inputs.

A job reads each input from the commit its ledger names (an upstream task's epoch, or another
DAG's through an Asset), at that commit's Delta version. After its own commit it prints the
tables it read as one line (:data:`READS_PREFIX` and JSON), beside its commit record
(:class:`~falkirk.policies.asset_events.CommittedEpoch`); the operator reads both from the
job's output and hands them to OpenLineage (:mod:`falkirk.plugins.lineage`) without reading
the store itself.

Tables are named as OpenLineage names datasets (:func:`dataset_name`): a table on S3 is
``s3://bucket`` + its key, a table on a local disk is ``file`` + its path.

>>> read = TableRead(dag_id="orders", task_id="aggregate", epoch=3, incarnation=1, output="output", uri="s3://lake/orders/aggregate/output", version=12)
>>> parse_reads_line(reads_line([read])) == (read,)
True
>>> read.producer
'orders.aggregate epoch 3 (incarnation 1)'
>>> dataset_name(read.uri)
('s3://lake', 'orders/aggregate/output')
>>> parse_reads_line("any other line of the job's output") is None
True
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from falkirk.policies.ids import OfCommit, ProcessorId

READS_PREFIX = "[falkirk] read: "
"""The start of the line a job prints, after its commit, naming the committed tables it read."""


@dataclass(frozen=True, kw_only=True)
class TableRead(OfCommit):
    """One output table of one commit that an epoch read: whose commit, where, at which Delta version."""

    dag_id: str
    task_id: str
    epoch: int
    incarnation: int
    output: str
    uri: str
    version: int
    map_index: int = -1

    @property
    def producer(self) -> str:
        """The commit read, as people name it.

        >>> TableRead(dag_id="d", task_id="tally", epoch=2, incarnation=0, output="output", uri="/s/t", version=4, map_index=1).producer
        'd.tally[1] epoch 2 (incarnation 0)'
        """
        return f"{self.dag_id}.{ProcessorId(task=self.task_id, map_index=self.map_index)} epoch {self.epoch} " \
               f"(incarnation {self.incarnation})"


def reads_line(reads: Iterable[TableRead]) -> str:
    """The line a job prints: every table it read, oldest commit first.

    >>> reads_line([])
    '[falkirk] read: []'
    """
    ordered = sorted(reads, key=lambda r: (r.dag_id, r.task_id, r.map_index, r.epoch, r.output))
    return READS_PREFIX + json.dumps([asdict(r) for r in ordered], sort_keys=True)


def parse_reads_line(line: str) -> tuple[TableRead, ...] | None:
    """The tables a job's output line names; ``None`` for any other line.

    >>> parse_reads_line('[falkirk] read: [{"dag_id": "d"}]')
    Traceback (most recent call last):
    ...
    ValueError: [falkirk] read: entry 0 is not a table read (missing 'epoch', 'incarnation', 'output', 'task_id', 'uri', 'version'): the line is written by the job runtime, not by hand
    """
    if not line.startswith(READS_PREFIX):
        return None
    found = []
    for i, record in enumerate(json.loads(line[len(READS_PREFIX):])):
        missing = sorted({"dag_id", "task_id", "epoch", "incarnation", "output", "uri", "version"} - set(record))
        if missing:
            raise ValueError(f"{READS_PREFIX.strip()} entry {i} is not a table read (missing "
                             f"{', '.join(repr(m) for m in missing)}): the line is written by the job runtime, "
                             f"not by hand")
        found.append(TableRead(**record))
    return tuple(found)


def dataset_name(uri: str) -> tuple[str, str]:
    """The OpenLineage ``(namespace, name)`` of the table at ``uri``.

    An object store's namespace is its scheme and bucket and the name is the key; a local
    table's namespace is ``file`` and its name is the absolute path.

    >>> dataset_name("/tmp/store/durable/orders/publish/output")
    ('file', '/tmp/store/durable/orders/publish/output')
    >>> dataset_name("file:///tmp/store/scratch/orders/ingest/output")
    ('file', '/tmp/store/scratch/orders/ingest/output')
    >>> dataset_name("s3a://lake/falkirk/orders/publish/output/")
    ('s3://lake', 'falkirk/orders/publish/output')
    """
    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        return "file", parts.path.rstrip("/") or "/"
    scheme = "s3" if parts.scheme in ("s3a", "s3n") else parts.scheme
    return f"{scheme}://{parts.netloc}", parts.path.strip("/")
