"""Time inside an epoch: iterations and chunks that checkpoint as they go, and resume where
an attempt died (:mod:`falkirk.policies.store.steps` for the checkpoints and the rule).

A job reaches these through its context::

    ranks = ctx.iterate(pagerank_step, start=ranks, times=30, checkpoint_every=5)
    scored = ctx.chunks(pages, score_chunk, count=8, key="url")

``iterate`` runs ``step(frame, i)`` for i = 1..times, committing the frame after every
``checkpoint_every``-th iteration; ``chunks`` splits a frame into ``count`` chunks by a hash
of ``key`` (the same split on every run) and runs ``process(chunk, i)`` on each in order,
committing each result. A new attempt of the same task instance starts after the latest
usable checkpoint: the iterations or chunks before it are read back, not recomputed.

Each checkpoint is written with the epoch commit's protocol (files, then one Delta commit,
then the step-log row: a crash at any point leaves either the checkpoint or nothing), in the
tier the regime gives the epoch's own checkpoint (:meth:`~falkirk.policies.regimes.Regime.step_tier`),
and always durably for a task declared non-deterministic: its chunks are then the log of its
determinants, which a sink may rely on before the epoch ends (``observer``, below).

A :class:`ChunkObserver` passed to ``chunks`` hears of each chunk once it is saved: first of
the chunks a new attempt reads back instead of computing (``started``), then of each chunk as
its checkpoint commits (``saved``). :class:`~falkirk.spark_jobs.marker_edge.MarkerEdge` is
one: it announces saved chunks to a sink that runs beside the task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from falkirk.policies.regimes import Tier
from falkirk.policies.store.commits import EpochTableError, epoch_rows, open_table
from falkirk.policies.store.steps import StepCheckpoint, StepLog, latest_usable, table_name
from falkirk.policies.workers import worker_name
from falkirk.spark_jobs.delta_sink import driver_write_max_rows, publish, read_frame, stage
from falkirk.spark_jobs.faults import crash_point
from falkirk.spark_jobs.job_log import say

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from falkirk.spark_jobs.runtime import EpochContext


class StepError(ValueError):
    """Iterations or chunks asked for wrongly; the message names the argument and the fix."""


class ChunkObserver(Protocol):
    """Hears which chunks of an epoch are saved (see the module docstring)."""

    def started(self, saved: Sequence[DataFrame]) -> None:
        """An attempt begins with chunks ``1..len(saved)`` saved already (their frames, read back)."""

    def saved(self, chunk: int, frame: DataFrame) -> None:
        """Chunk ``chunk``'s checkpoint is committed; ``frame`` is its result, read back."""


def iterate(ctx: EpochContext, step: Callable[[DataFrame, int], DataFrame], start: DataFrame, *,
            times: int, checkpoint_every: int) -> DataFrame:
    """The frame after ``times`` iterations of ``step`` from ``start``; see the module docstring."""
    _check_count("times", times)
    _check_count("checkpoint_every", checkpoint_every)
    resumed = _resume(ctx, "iteration", times)
    frame, done = start, 0
    if resumed is not None:
        frame, done, _ = resumed
    for i in range(done + 1, times + 1):
        crash_point(ctx.args.processor, ctx.epoch, f"iteration-{i}", dag_id=ctx.args.dag_id)
        frame = step(frame, i)
        if i % checkpoint_every == 0 and i < times:  # the last iteration's result is the epoch's commit
            frame = _checkpoint(ctx, "iteration", i, times, frame)
    return frame


def chunks(ctx: EpochContext, frame: DataFrame, process: Callable[[DataFrame, int], DataFrame], *,
           count: int, key: str, observer: ChunkObserver | None = None) -> DataFrame:
    """The union of ``process(chunk, i)`` over the ``count`` chunks of ``frame``; see the module docstring."""
    from pyspark.sql import functions as F

    _check_count("count", count)
    if key not in frame.columns:
        raise StepError(f"{ctx.args.processor}: chunks(key={key!r}): the frame has no column {key!r}; "
                        f"its columns are {frame.columns}")
    resumed = _resume(ctx, "chunk", count)
    done = resumed[1] if resumed is not None else 0
    results = list(resumed[2]) if resumed is not None else []
    if observer is not None:
        observer.started(results)
    for i in range(done + 1, count + 1):
        crash_point(ctx.args.processor, ctx.epoch, f"chunk-{i}", dag_id=ctx.args.dag_id)
        chunk = frame.where(F.pmod(F.hash(F.col(key)), F.lit(count)) == F.lit(i - 1))
        results.append(_checkpoint(ctx, "chunk", i, count, process(chunk, i)))
        if observer is not None:
            observer.saved(i, results[-1])
    union = results[0]
    for more in results[1:]:
        union = union.unionByName(more)
    return union


def discard(ctx: EpochContext) -> int:
    """Delete the step checkpoints of this processor's committed epochs up to this one (no
    attempt resumes from them); returns how many tables lost rows.

    An epoch without a ledger row keeps its own: the epochs of a stateless task run side by
    side, and an earlier one may still be running.
    """
    a, store = ctx.args, ctx.store
    tables = {c.uri for c in StepLog(store).of_task(a.dag_id, a.task_id, a.map_index, through=a.epoch)}
    if not tables:
        return 0
    committed = {r.epoch for r in ctx.ledger.entries_and_invalidated(a.dag_id, a.task_id, a.map_index)[0]}
    cleared = 0
    for uri in sorted(tables):
        if not store.contains(uri):  # a damaged row: never delete outside the roots
            continue
        table = open_table(uri, store.options_for(uri))
        done = sorted(e for e in (epoch_rows(table) if table is not None else {})
                      if e <= a.epoch and (e == a.epoch or e in committed))
        if done and table is not None:
            table.delete(f"epoch IN ({', '.join(str(int(e)) for e in done)})")
            cleared += 1
    return cleared


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise StepError(f"{name}={value!r}: give a whole number >= 1")


def _resume(ctx: EpochContext, kind: str, of: int):
    """(frame, steps done, chunk frames) from the latest usable checkpoint, or ``None``: start over."""
    a, store = ctx.args, ctx.store
    found = StepLog(store).of_epoch(a.dag_id, a.task_id, a.map_index, a.epoch, a.incarnation)
    if not found:
        return None
    current = {r.commit_id for r in ctx.depends_on.values()}
    known = {(c.processor, c.epoch) for c in current}
    for dep in {d for c in found for d in c.depends_on}:
        if (dep.processor, dep.epoch) not in known:
            row = ctx.ledger.find(a.dag_id, dep.task, dep.epoch, dep.map_index)
            if row is not None:
                current.add(row.commit_id)
    usable = latest_usable(found, kind, of, ctx.ledger.invalidations.keys(a.dag_id), current)
    by_step = {c.step: c for c in usable}
    for cp in usable:
        try:
            if kind == "chunk":  # every chunk up to this one must still be there
                frames = [_load(ctx, by_step[i]) for i in range(1, cp.step + 1)]
                frame = frames[-1]
            else:
                frames, frame = [], _load(ctx, cp)
        except (KeyError, EpochTableError) as exc:
            say(f"{a.processor} epoch {a.epoch}: not resuming at {cp.progress}: {exc}")
            continue
        say(f"{a.processor} epoch {a.epoch}: resuming at {cp.progress} from its checkpoint ({cp.uri}, "
            f"committed by try {cp.try_number}); skipping {cp.step} {kind}s")
        return frame, cp.step, frames
    return None


def _load(ctx: EpochContext, cp: StepCheckpoint) -> DataFrame:
    scratch = ctx.store.is_scratch(cp.uri)
    if scratch and cp.worker not in (None, worker_name()):
        raise EpochTableError(f"it is in scratch on {cp.worker}, and this attempt runs on {worker_name()}")
    return read_frame(ctx.spark, cp.uri, cp.key, cp.rows, ctx.store.options_for(cp.uri), on_driver=scratch,
                      spark_reads=ctx.store.spark_reads)


def _checkpoint(ctx: EpochContext, kind: str, step: int, of: int, frame: DataFrame) -> DataFrame:
    """Commit ``frame`` as the checkpoint at (epoch, step) and return it read back (which also
    cuts its lineage: the next steps build on the committed rows)."""
    a, store = ctx.args, ctx.store
    # A non-deterministic task's steps are its determinants: a sink may commit what they vouch for.
    tier = a.regime.step_tier(a.epoch) if a.deterministic else Tier.DURABLE
    uri = store.table_uri(tier, a.dag_id, a.task_id, table_name(kind, step), a.map_index)
    scratch = store.is_scratch(uri)
    cp = StepCheckpoint(dag_id=a.dag_id, task_id=a.task_id, map_index=a.map_index, epoch=a.epoch, incarnation=a.incarnation, kind=kind, step=step, of=of, uri=uri,
                        tier=tier.value, version=0, rows=0, try_number=a.try_number)
    staged = stage(frame, uri, cp.key, store.options_for(uri), driver_write_max_rows(), on_driver=scratch)
    if kind == "chunk":
        crash_point(a.processor, a.epoch, f"chunk-{step}-after-files", dag_id=a.dag_id)
    written = publish(staged)
    deps = tuple(sorted(r.commit_id for r in ctx.depends_on.values()))
    cp = replace(cp, version=written.version, rows=written.rows, depends_on=deps, worker=worker_name())
    StepLog(store).append(cp)
    say(f"{a.processor} epoch {a.epoch}: checkpoint at {cp.progress} -> {uri} (v{written.version}, "
        f"{written.rows} rows)")
    return read_frame(ctx.spark, uri, cp.key, written.rows, store.options_for(uri), on_driver=scratch,
                      spark_reads=store.spark_reads)

