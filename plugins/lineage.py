"""OpenLineage facets of a Falkirk task instance: which epoch, which redo of it, what it read and wrote.

With Airflow's OpenLineage provider configured (a transport in ``[openlineage]``), each task
instance's run event carries what its job reported after its commit:

* a run facet ``falkirk`` (:func:`epoch_run_facet`): the DAG, task and partition, the epoch, its
  incarnation (0 for its first commit, n for the n-th redo by a recovery), whether it replaces
  earlier commits of the epoch, and the task's regime;
* its outputs: each output table of the commit, with the Delta version that holds the epoch
  (the ``version`` facet) and its row count (``outputStatistics``);
* its inputs: each committed table the job read, the upstream task's in its DAG or another
  DAG's through an Asset, at the Delta version of the commit read.

A recovery redoes an epoch by clearing its task instance, so the redo is a new run of the same
OpenLineage job (Airflow's next try), with ``incarnation`` one higher and
``replacement: true``; its readers' new runs name the redo's table version as their input.

Without a transport the provider is off and nothing here is imported. This module imports the
OpenLineage client: only the operator's ``get_openlineage_facets_on_*`` methods, which the
provider alone calls, import it.

Example (what the provider receives for a committed epoch)::

    >>> from falkirk.policies.asset_events import CommittedEpoch, CommittedOutput
    >>> from falkirk.policies.lineage import TableRead
    >>> done = CommittedEpoch(dag_id="orders", task_id="publish", epoch=3, incarnation=1,
    ...                       outputs=(CommittedOutput("output", "/lake/orders/publish/output", 9, 5),))
    >>> read = TableRead(dag_id="orders", task_id="aggregate", epoch=3, incarnation=1, output="output", uri="/lake/orders/aggregate/output", version=7)
    >>> lineage = operator_lineage("batch(log_outputs=True)", "orders", "publish", 3, committed=done, reads=(read,))
    >>> [(d.name, d.facets["version"].datasetVersion) for d in lineage.inputs]
    [('/lake/orders/aggregate/output', '7')]
    >>> [(d.name, d.outputFacets["outputStatistics"].rowCount) for d in lineage.outputs]
    [('/lake/orders/publish/output', 5)]
    >>> facet = lineage.run_facets["falkirk"]
    >>> facet.epoch, facet.incarnation, facet.replacement, facet.committed
    (3, 1, True, True)
    >>> operator_lineage("batch", "orders", "publish", 4, committed=None).run_facets["falkirk"].committed
    False
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.facet_v2 import (
    RunFacet,
    dataset_version_dataset,
    output_statistics_output_dataset,
    storage_dataset,
)
from openlineage.client.generated.base import InputDataset, OutputDataset

from falkirk.policies.asset_events import CommittedEpoch
from falkirk.policies.lineage import TableRead, dataset_name

RUN_FACET = "falkirk"
"""The key of :class:`EpochRunFacet` among a run event's run facets."""

SCHEMA_URL = "urn:falkirk:openlineage:EpochRunFacet:1"
"""The facet's schema, by name and version: its fields are documented in ``docs/howto/lineage.md``."""


@attr.define
class EpochRunFacet(RunFacet):
    """The Falkirk epoch a task instance ran: which commit of which epoch it made (or tried to)."""

    dag_id: str
    task_id: str
    epoch: int
    incarnation: int | None  # None: the task instance committed nothing
    regime: str
    replacement: bool
    committed: bool
    map_index: int = attr.field(default=-1)
    _additional_skip_redact: ClassVar[list[str]] = ["dag_id", "task_id", "epoch", "incarnation", "regime",
                                                   "replacement", "committed", "map_index"]

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL


def operator_lineage(regime: str, dag_id: str, task_id: str, epoch: int, map_index: int = -1, *,
                     committed: CommittedEpoch | None, reads: Sequence[TableRead] = ()) -> OperatorLineage:
    """What the task instance hands the OpenLineage provider: its inputs, outputs and run facet.

    ``committed`` is the commit the job made (or found made); ``None`` when it failed or was
    refused, and the facet then says ``committed: false``, with no incarnation.
    """
    incarnation = committed.incarnation if committed is not None else None
    facet = EpochRunFacet(dag_id=dag_id, task_id=task_id, epoch=epoch, incarnation=incarnation, regime=regime,
                          replacement=bool(incarnation), committed=committed is not None, map_index=map_index)
    inputs = [InputDataset(*dataset_name(r.uri), facets=_table_facets(r.version)) for r in reads]
    outputs = [OutputDataset(*dataset_name(o.uri), facets=_table_facets(o.version),
                             outputFacets={"outputStatistics": output_statistics_output_dataset
                                           .OutputStatisticsOutputDatasetFacet(rowCount=o.rows)})
               for o in (committed.outputs if committed is not None else ())]
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets={RUN_FACET: facet})


def _table_facets(version: int) -> dict[str, Any]:
    """A Delta table's dataset facets at the version a commit wrote or read."""
    return {"version": dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(version)),
            "storage": storage_dataset.StorageDatasetFacet(storageLayer="delta", fileFormat="parquet")}
