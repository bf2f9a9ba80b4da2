"""The job's side of process pairs: which replica of a paired input to read, the generation
fence on a replica's commit, and the sink both final replicas write.

The decisions are :mod:`falkirk.policies.pairs`'s; this module applies them to the store:

* :func:`layout_for`: the DAG's layout, with this task's replicas added (chained over the
  workers) on its first epoch;
* :func:`read_from`: the map index of the replica a consumer reads a producer partition from:
  its own replica id while that one is active and has committed the epoch, else its twin
  (the take-over: nothing re-runs, the twin's output is already there); a partition with no
  active replica left stops the job, naming the durable path;
* :func:`fence`: a replica declared dead after it started (a zombie) commits nothing;
* :func:`write_sink`: the partition's rows of an egress table, written by both replicas of a
  final task under one key: the first commit wins, the second is a no-op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from falkirk.policies.ids import ReplicaId
from falkirk.policies.pairs import Layout, PairsError, Status, lost_partition_refusal, with_task
from falkirk.policies.store.commits import CommitKey, CommitResult, latest_version
from falkirk.policies.store.control import PairLayouts
from falkirk.policies.workers import pair_workers

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from falkirk.spark_jobs.runtime import EpochContext


class Fenced(RuntimeError):
    """A replica was declared dead while it ran: its commit would be a zombie's, and is not made."""


def layout_for(ctx: EpochContext) -> tuple[Layout, int | None]:
    """The DAG's layout as it is now, with this task's replicas recorded if it had none, and the
    layout table's version it was read at."""
    layouts = PairLayouts(ctx.store)
    a = ctx.args
    version = latest_version(layouts.uri, ctx.store.options_for(layouts.uri))
    current = layouts.load(a.dag_id)
    if a.replicas > 1 and a.partitions is not None:
        wanted = with_task(current, a.task_id, a.partitions, pair_workers())
        if wanted is not current:
            layouts.save(a.dag_id, wanted, before=current)
            version = latest_version(layouts.uri, ctx.store.options_for(layouts.uri))
            current = layouts.load(a.dag_id)  # another replica may have recorded it first: one answer
    if current is None:
        raise PairsError(f"{a.processor}: DAG {a.dag_id} has no process pairs recorded; its paired inputs "
                         f"{list(a.paired_inputs)} have not run yet")
    return current, version


def read_from(ctx: EpochContext, producer: str, partition: int, epoch: int) -> int:
    """The map index of the replica of ``producer[partition]`` that this job reads for ``epoch``."""
    layout = ctx.layout
    own = ReplicaId.of(task=ctx.args.task_id, map_index=ctx.args.map_index).replica if ctx.args.replicas > 1 \
        else ReplicaId.NAMES[0]
    order = [ReplicaId(task=producer, partition=partition, replica=own)]
    order.append(order[0].twin)
    active = [r for r in order if layout.replica(producer, partition, r.replica).status is Status.ACTIVE]
    if not active:
        raise PairsError(lost_partition_refusal(ctx.args.dag_id, ctx.args.processor, ctx.epoch, producer, partition,
                                                epoch))
    # The twin's output of an epoch is the same rows (replicas are deterministic): a replica that
    # is active but has not committed the epoch (failed, not yet declared dead) is read around.
    for r in active:
        if ctx.rows.find(producer, epoch, r.map_index) is not None:
            return r.map_index
    return active[0].map_index  # none committed: the reader names the first


def fence(ctx: EpochContext) -> None:
    """Refuse the commit of a replica declared dead (or replaced) since the job read the layout."""
    a = ctx.args
    if a.replicas < 2:
        return
    me = ReplicaId.of(task=a.task_id, map_index=a.map_index)
    partition, replica = me.partition, me.replica
    started = ctx.layout.replica(a.task_id, partition, replica)
    layouts = PairLayouts(ctx.store)
    if latest_version(layouts.uri, ctx.store.options_for(layouts.uri)) == ctx.layout_version:
        return  # no layout change since the job read it (a listing of its log, not a scan)
    now = layouts.load(a.dag_id)
    current = now.replica(a.task_id, partition, replica) if now is not None else started
    if current.status is Status.DEAD or current.generation != started.generation:
        raise Fenced(f"{a.replica} epoch {a.epoch}: declared {current.status.value} (generation "
                     f"{current.generation}, this run started under {started.generation}) while it ran; its twin "
                     f"took over, so this commit is not made")


def fold_in_if_caught_up(ctx: EpochContext, epoch: int) -> bool:
    """After a standby's commit of ``epoch``: make it active once it has caught up with its survivor
    (both have committed the same epochs); returns whether it did."""
    a = ctx.args
    if a.replicas < 2:
        return False
    rid = ReplicaId.of(task=a.task_id, map_index=a.map_index)
    partition, replica = rid.partition, rid.replica
    if ctx.layout.replica(a.task_id, partition, replica).status is not Status.STDBY:
        return False  # only a standby folds in (as this job read the layout; the fence checked it since)
    layouts = PairLayouts(ctx.store)
    before = layouts.load(a.dag_id)
    me = before.replica(a.task_id, partition, replica) if before is not None else None
    if before is None or me is None or me.status is not Status.STDBY:
        return False
    twin = next(r for r in before.pair(a.task_id, partition) if r.replica != replica)
    latest = max((e.epoch for e in ctx.ledger.entries(a.dag_id, a.task_id)
                  if e.map_index == twin.id.map_index), default=0)
    if latest > epoch:
        return False  # the survivor is ahead: this replica's next epochs replay the rest
    after = (before.advance(a.task_id, partition, replica, epoch, me.generation)
             .advance(a.task_id, partition, twin.replica, latest, twin.generation)
             .fold_in(a.task_id, partition))
    layouts.save(a.dag_id, after, before=before)
    return True


SINK = "sink"
"""The egress table's name, and the name of the ledger row's output that records it."""


def write_sink(ctx: EpochContext, frame: DataFrame, name: str = SINK) -> CommitResult:
    """Write this partition's rows of epoch ``ctx.epoch`` to the egress table ``name``, once for
    both replicas: they share the commit key (the partition, not the replica), so the first
    commit wins and the second writes nothing. A redone epoch (a higher incarnation) replaces it."""
    from falkirk.spark_jobs.delta_sink import commit_frame

    a = ctx.args
    partition = ctx.partition if ctx.partition is not None else -1
    uri = sink_uri(ctx.store, a.dag_id, a.task_id, partition, name)
    key = CommitKey(dag_id=a.dag_id, task_id=f"{a.task_id}/{name}", epoch=a.epoch, map_index=partition, incarnation=a.incarnation)
    return commit_frame(frame, uri, key, ctx.store.options_for(uri))


def sink_uri(store, dag_id: str, task_id: str, partition: int, name: str = SINK) -> str:  # noqa: ANN001
    """The egress table of one partition of a paired task (one table per partition: only a
    partition's two replicas ever race on it)."""
    return f"{store.durable_uri.rstrip('/')}/{dag_id}/{task_id}/{name}/partition={partition}"


__all__ = ["SINK", "Fenced", "fence", "fold_in_if_caught_up", "layout_for", "read_from", "sink_uri", "write_sink"]
