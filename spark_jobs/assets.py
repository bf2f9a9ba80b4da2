"""The job's side of asset edges between DAGs: reading what a run consumed through an Asset.

A consumer DAG's run starts on asset events that a producer DAG's Falkirk task emitted, each
carrying the commit behind it (:mod:`falkirk.policies.asset_events`); the operator hands those
records to the job (``JobSpec.consumed``). :func:`read_asset` reads each producer epoch they
name at the incarnation the producer's ledger names as the job runs: after a recovery redid
the epoch, that is the redo, never the rows the event was emitted for. Each epoch read is
recorded in the consumer's ledger row (:class:`~falkirk.policies.store.ledger.AssetInput`),
so that a recovery in the producer's DAG finds the consumer runs it leaves stale
(:mod:`falkirk.policies.planning.assets`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from falkirk.policies.ids import CommitId
from falkirk.policies.store.ledger import AssetInput, LedgerSnapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from falkirk.spark_jobs.runtime import EpochContext


def read_asset(ctx: EpochContext, asset: str, output: str = "output") -> DataFrame:
    """Rows of ``output`` of every producer epoch this run consumed through ``asset``, in epoch order."""
    from falkirk.spark_jobs.runtime import JobError

    me = ctx.args.processor
    events = [e.committed for e in ctx.args.consumed if e.asset == asset]
    if not events:
        had = sorted({e.asset for e in ctx.args.consumed})
        raise JobError(f"{me}: this run consumed no Falkirk asset event of {asset!r}"
                       + (f"; it consumed {had}" if had else "; it was not started by asset events")
                       + f". Schedule {ctx.args.dag_id} on the Asset (schedule=PartitionedAssetTimetable(assets="
                         f"Asset({asset!r}))), whose producer task sets partition_outlets=True")
    # One read per producer epoch: a run may hold an epoch's first event and its replacement.
    wanted = sorted({CommitId(dag=c.dag_id, processor=c.processor, epoch=c.epoch) for c in events})
    frames = []
    for read in wanted:
        dag_id, task_id, map_index, epoch = read.dag, read.task, read.map_index, read.epoch
        producer = f"{dag_id}.{read.processor}"
        entry = producer_rows(ctx, dag_id).find(task_id, epoch, map_index)
        if entry is None:
            raise JobError(f"{me}: {producer} has no current commit of epoch {epoch}: a recovery rolled it back "
                           f"and has not redone it yet. This epoch can run once the redo is committed")
        frames.append(ctx.read_output(entry, output, repr(producer), repr(producer)))
        ctx.asset_inputs.append(AssetInput(asset=asset, dag_id=dag_id, task_id=task_id, output=output, epoch=epoch, incarnation=entry.incarnation, map_index=map_index))
    frame = frames[0]
    for more in frames[1:]:
        frame = frame.unionByName(more)
    return frame


def producer_rows(ctx: EpochContext, dag_id: str) -> LedgerSnapshot:
    """The producer DAG's ledger rows, read once per job."""
    if dag_id == ctx.args.dag_id:
        return ctx.rows
    if dag_id not in ctx.producer_snapshots:
        ctx.producer_snapshots[dag_id] = LedgerSnapshot(ctx.ledger, dag_id)
    return ctx.producer_snapshots[dag_id]
