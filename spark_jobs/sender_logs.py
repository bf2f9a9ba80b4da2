"""Rebuilding a state kept by no checkpoint, for a task under sender-side logs.

A :class:`~falkirk.policies.regimes.SenderLog` task keeps its state only in the scratch tier, as
a running process keeps it in memory. When that copy is gone (the worker or its scratch
directory lost, or the task now running elsewhere), the state after epoch ``t - 1`` is rebuilt
from empty by running the task's own job again over the blocks (epochs) its producers retain
after its release point ``r``: epochs ``r + 1 .. t - 1``, in order, each from the state the one
before left. What those replays output is discarded: the epochs were committed before, and
downstream read them then. No state is read from any checkpoint.

The blocks are retained because the garbage collector keeps a producer's output epoch while a
reader under sender-side logs has not released it (:mod:`falkirk.policies.planning.collector`).
A block that is gone all the same (deleted by hand, or lost with a producer declared volatile)
makes the rebuild refuse by name rather than produce a wrong state
(:class:`~falkirk.policies.sender_logs.rebuild.BlocksLost`).

Under ``log_durability="volatile"`` a task keeps the paper's guarantees, not Delta's: its log
lives as long as the process that wrote it. A new incarnation (an attempt after a failed one)
starts without its predecessor's memory: its state is rebuilt, and the blocks it retained for
its readers are dropped from its output tables (:func:`lose_volatile_log`), as the paper's
failed vertex loses its recovery log. A reader that then needs them is refused by name
(Smith & Watson, CS-TR-836 §IV.C: a log lost with a failed vertex).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from falkirk.policies.epochs import epoch_ranges
from falkirk.policies.ids import UNPARTITIONED
from falkirk.policies.regimes import SenderLog, Tier
from falkirk.policies.sender_logs.rebuild import BlocksLost, Rebuild, rebuild
from falkirk.policies.store.commits import open_table
from falkirk.policies.store.ledger import LedgerEntry
from falkirk.policies.store.readability import Readable, StoreReadability
from falkirk.spark_jobs.faults import crash_point
from falkirk.spark_jobs.job_log import say

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from falkirk.spark_jobs.runtime import EpochContext


def replay_plan(ctx: EpochContext, previous: LedgerEntry) -> Rebuild:
    """The blocks that rebuild the state after ``previous.epoch``: per input, every epoch after
    the task's release point, each checked to be still in its producer's output table."""
    regime = ctx.args.regime
    assert isinstance(regime, SenderLog)
    through = previous.epoch
    released = regime.released(through)
    readable = StoreReadability(ctx.store, entries=ctx.rows.entries)
    retained = {u: [e for e in range(r + 1, through + 1) if _block_held(ctx, readable, u, e)]
                for u, r in released.items()}
    return rebuild(ctx.args.processor, through, pruned=released, retained=retained)


@dataclass(frozen=True)
class Replaying:
    """What a replay of one retained epoch is given: the state the replay before it left, and
    per input the newest block released (a released block reads as no rows)."""

    state: DataFrame | None
    released: Mapping[str, int]
    running_epoch: int  # the epoch the job runs: its blocks are there, to read a released input's columns from


def rebuild_state(ctx: EpochContext, previous: LedgerEntry, why: str) -> DataFrame | None:
    """The state after ``previous.epoch`` rebuilt by replaying the retained blocks through the job
    (``ctx.compute``); raises :class:`BlocksLost` when one of them is gone."""
    from falkirk.spark_jobs.runtime import EpochContext, JobError

    a = ctx.args
    if ctx.compute is None:
        raise JobError(f"{a.processor}: its state must be rebuilt but the runtime was not given the job's compute")
    try:
        plan = replay_plan(ctx, previous)
    except BlocksLost as exc:
        raise BlocksLost(f"{exc}. If their producers can still compute them again, plan a recovery that redoes "
                         f"the task from its first epoch: falkirk plan --dag {a.dag_id} --bad-epoch "
                         f"{a.processor}:1") from None
    epochs = sorted({e for _, seqs in plan.replay for e in seqs})
    regime = a.regime
    assert isinstance(regime, SenderLog)  # only a task under sender-side logs rebuilds its state
    plan_released = regime.released(previous.epoch)
    blocks = "; ".join(f"{u} {epoch_ranges(seqs) if seqs else 'none'}" for u, seqs in plan.replay)
    say(f"{a.processor} epoch {a.epoch}: {why}; rebuilding the state of epoch {previous.epoch} with no checkpoint, "
        f"by replaying the blocks its producers retain: {blocks}")
    started = time.monotonic()
    state: DataFrame | None = None
    for epoch in epochs:
        replay = EpochContext(dataclasses.replace(a, epoch=epoch), ctx.store, ctx.ledger, ctx.spark,
                              snapshot=ctx.snapshot, compute=ctx.compute,
                              replaying=Replaying(state, plan_released, a.epoch))
        result = ctx.compute(replay)
        if result.state is None:
            raise JobError(f"{a.processor}: replaying epoch {epoch} returned no state; a task under "
                           f"{a.regime.spec()} returns EpochResult(state=df)")
        state = ctx.cache(result.state)
        state.count()  # computed now, from the state before it: each replay builds on a kept frame
        ctx.depends_on.update(replay.depends_on)
        crash_point(a.processor, a.epoch, f"replayed-{epoch}", dag_id=a.dag_id)
    say(f"{a.processor} epoch {a.epoch}: state rebuilt from {plan.blocks} blocks ({_rows(ctx, plan)} rows) in "
        f"{time.monotonic() - started:.1f}s")
    return state


def restarted_volatile(ctx: EpochContext) -> bool:
    """Whether this job is a new incarnation of a task whose log is volatile: an attempt after a
    failed one (a retry, or a task instance cleared by a recovery), which the paper's failed
    vertex starts without its memory or its log."""
    regime = ctx.args.regime
    return isinstance(regime, SenderLog) and regime.log_durability == "volatile" and ctx.args.try_number > 1


def lose_volatile_log(ctx: EpochContext) -> list[int]:
    """Drop, from this task's own output tables, every epoch before this one still held: the
    blocks a volatile log retained for its readers, lost with the incarnation that failed.
    Returns the epochs dropped; nothing is done unless :func:`restarted_volatile`."""
    if not restarted_volatile(ctx):
        return []
    a = ctx.args
    # only the task's own durable tables, whatever a ledger row names
    own = ctx.store.table_uri(Tier.DURABLE, a.dag_id, a.task_id, "output").rsplit("/", 1)[0] + "/"
    uris = sorted({ref.uri for e in ctx.rows.entries_and_invalidated(a.task_id)[0] if e.epoch < a.epoch
                   for ref in e.outputs if ref.uri.startswith(own) and "/" not in ref.uri[len(own):]})
    dropped: set[int] = set()
    for uri in uris:
        table = open_table(uri, ctx.store.options_for(uri))
        if table is None:
            continue
        held = {int(v) for v in pa.table(table.get_add_actions(flatten=True)).to_pydict().get("partition.epoch", [])}
        epochs = sorted(e for e in held if e < a.epoch)
        if epochs:
            table.delete(f"epoch IN ({', '.join(map(str, epochs))})")
            dropped.update(epochs)
    say(f"{a.processor} epoch {a.epoch}: attempt {a.try_number} follows a failed one; under log_durability=volatile "
        f"the failed incarnation's state and the blocks it retained went with it: dropped "
        f"{epoch_ranges(sorted(dropped)) if dropped else 'none'} from its output tables")
    return sorted(dropped)


def _rows(ctx: EpochContext, plan: Rebuild) -> int:
    """The rows the blocks of ``plan`` hold, as their producers' ledger rows recorded them."""
    entries = (ctx.rows.find(u, e, UNPARTITIONED, read_again=False) for u, seqs in plan.replay for e in seqs)
    return sum(ref.rows or 0 for entry in entries if entry is not None for ref in entry.outputs)


def _block_held(ctx: EpochContext, readable: Readable, task_id: str, epoch: int) -> bool:
    """Whether ``task_id``'s outputs of ``epoch`` are still in their tables, as its ledger row recorded them."""
    entry = ctx.rows.find(task_id, epoch, UNPARTITIONED, read_again=False)
    return entry is not None and all(readable(ref.uri, entry.key) for ref in entry.outputs)


__all__ = ["Replaying", "lose_volatile_log", "rebuild_state", "replay_plan", "restarted_volatile"]
