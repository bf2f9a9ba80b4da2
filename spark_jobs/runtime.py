"""The job runtime: one epoch of one task, committed as its regime asks.

A job is a function from an :class:`EpochContext` to an :class:`EpochResult`. The
runtime parses the command line that the Airflow operator builds, skips the work if
this (task, epoch, incarnation) is already in the ledger, starts Spark, runs the job,
and commits in a fixed order that makes a crash at any point safe to retry:

1. each output table: one idempotent Delta commit replacing this epoch's rows;
2. the state table (stateful regimes): likewise;
3. the ledger row: the commit point. Until it exists the epoch is not checkpointed,
   and a re-run repeats only the steps whose Delta commits are missing.

Tables are written without Delta's Spark jars: the executors write an epoch's Parquet
files in parallel, and one delta-rs commit on the driver per table makes them visible
atomically (:mod:`spark_jobs.delta_sink`); no epoch is collected to the driver.

A job module looks like this (see ``spark_jobs/pipeline/`` for real ones)::

    from spark_jobs.runtime import EpochContext, EpochResult, run_job

    def compute(ctx: EpochContext) -> EpochResult:
        rows = ctx.read_input("ingest")
        return EpochResult(outputs={"output": rows.groupBy("customer").count()})

    if __name__ == "__main__":
        raise SystemExit(run_job(compute))
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import pyarrow as pa

from policies.epoch_tables import EPOCH, CommitKey, CommitResult, read_epoch
from policies.ledger import Ledger, LedgerEntry, OutputRef
from policies.job_spec import JobSpec
from policies.store import StoreConfig
from spark_jobs.delta_sink import commit_frame
from spark_jobs.faults import crash_point

if TYPE_CHECKING:  # Spark is imported lazily: an already-committed epoch never starts a JVM.
    from pyspark.sql import DataFrame, SparkSession


class JobError(RuntimeError):
    """A job cannot run or commit; the message says what is missing and what to do."""


@dataclass
class EpochResult:
    """What a job produced for its epoch: named output tables and, if stateful, its new state."""

    outputs: dict[str, "DataFrame"] = field(default_factory=dict)
    state: "DataFrame | None" = None


@dataclass
class EpochContext:
    """The epoch a job is running, with readers for its inputs and its previous state."""

    args: JobSpec
    store: StoreConfig
    ledger: Ledger
    spark: "SparkSession"

    @property
    def epoch(self) -> int:
        return self.args.epoch

    def read_input(self, task_id: str | None = None, output: str = "output") -> "DataFrame":
        """This epoch's rows of an upstream task's output, as the upstream's ledger row locates them."""
        if task_id is None:
            if len(self.args.inputs) != 1:
                raise JobError(f"{self.args.task_id}: name the input to read; this task reads {list(self.args.inputs)}")
            task_id = self.args.inputs[0]
        entry = self.ledger.find(self.args.dag_id, task_id, self.epoch)
        if entry is None:
            raise JobError(
                f"{self.args.task_id}: upstream task {task_id!r} has no checkpoint for epoch {self.epoch}; "
                f"run {task_id} for this epoch first"
            )
        ref = next((o for o in entry.outputs if o.name == output), None)
        if ref is None:
            names = [o.name for o in entry.outputs]
            raise JobError(f"{self.args.task_id}: task {task_id!r} has no output {output!r}; it has {names}")
        return self._to_spark(read_epoch(ref.uri, self.epoch, self.store.options_for(ref.uri)))

    def previous_state(self) -> "DataFrame | None":
        """The state as of this task's latest checkpoint before this epoch; ``None`` at the start (∅)."""
        if not self.args.regime.keeps_state:
            raise JobError(f"{self.args.task_id}: regime {self.args.regime.spec()} keeps no state to load")
        entry = self.ledger.latest(self.args.dag_id, self.args.task_id, self.epoch, self.args.map_index)
        if entry is None:
            return None
        if entry.state_uri is None:
            raise JobError(f"ledger row of {self.args.task_id} epoch {entry.epoch} records no state table")
        rows = read_epoch(entry.state_uri, entry.epoch, self.store.options_for(entry.state_uri))
        return self._to_spark(rows.drop_columns([EPOCH]))

    def _to_spark(self, table: pa.Table) -> "DataFrame":
        return self.spark.createDataFrame(table)


def run_job(compute: Callable[[EpochContext], EpochResult], argv: Sequence[str] | None = None) -> int:
    """Run ``compute`` for the epoch named on the command line and commit it; returns an exit code."""
    args = JobSpec.parse(argv)
    store = StoreConfig.from_env()
    ledger = Ledger(store)
    label = f"{args.dag_id}.{args.task_id} epoch {args.epoch}"
    done = ledger.find(args.dag_id, args.task_id, args.epoch, args.map_index)
    if done is not None and done.incarnation >= args.incarnation:
        _say(f"{label}: already committed (incarnation {done.incarnation}, run {done.run_id}); nothing to do")
        return 0
    started = time.monotonic()
    spark = _spark_session()
    try:
        ctx = EpochContext(args, store, ledger, spark)
        result = compute(ctx)
        entry = commit(ctx, result)
    finally:
        spark.stop()
    _say(f"{label}: committed {entry.output_rows} output rows"
         + (f", {entry.state_rows} state rows" if entry.state_uri else "")
         + f" in {time.monotonic() - started:.1f}s")
    return 0


def commit(ctx: EpochContext, result: EpochResult) -> LedgerEntry:
    """Write outputs, then state, then the ledger row, each idempotently (see the module docstring)."""
    args, store = ctx.args, ctx.store
    regime = args.regime
    if not result.outputs:
        raise JobError(f"{args.task_id}: the job returned no outputs; return EpochResult(outputs={{'output': df}})")
    if regime.keeps_state and result.state is None:
        raise JobError(f"{args.task_id}: regime {regime.spec()} keeps state; return EpochResult(state=df)")
    if not regime.keeps_state and result.state is not None:
        raise JobError(f"{args.task_id}: regime {regime.spec()} is stateless but the job returned state; "
                       f"drop it or use a checkpoint regime")
    key = CommitKey(args.dag_id, args.task_id, args.epoch, args.map_index, args.incarnation)

    crash_point(args.task_id, args.epoch, "before-commit")
    outputs = []
    for name, frame in sorted(result.outputs.items()):
        tier = regime.output_tier(args.epoch)
        written = _commit_frame(store, store.table_uri(tier, args.dag_id, args.task_id, name), frame, key)
        outputs.append(OutputRef(name, written.uri, tier.value, written.version, written.rows))
        _say(f"  output {name!r} -> {tier.value} {written.uri} (v{written.version}, {written.rows} rows"
             + ("" if written.applied else ", already there") + ")")
    crash_point(args.task_id, args.epoch, "after-outputs")

    state = None
    state_tier = regime.state_tier(args.epoch)
    if result.state is not None:
        for tier in regime.state_tiers(args.epoch):  # scratch first, the durable copy (if any) last
            uri = store.table_uri(tier, args.dag_id, args.task_id, "state")
            state = _commit_frame(store, uri, result.state, key)
            _say(f"  state -> {tier.value} {uri} (v{state.version}, {state.rows} rows"
                 + ("" if state.applied else ", already there") + ")")
    crash_point(args.task_id, args.epoch, "after-state")

    entry = LedgerEntry(
        dag_id=args.dag_id, task_id=args.task_id, epoch=args.epoch, regime=regime.spec(), run_id=args.run_id,
        try_number=args.try_number, map_index=args.map_index, incarnation=args.incarnation,
        state_uri=state.uri if state else None, state_tier=state_tier.value if state else None,
        state_version=state.version if state else None, state_rows=state.rows if state else None,
        outputs=tuple(outputs),
    )
    ctx.ledger.append(entry)
    return entry


def _commit_frame(store: StoreConfig, uri: str, frame: "DataFrame", key: CommitKey) -> CommitResult:
    # Executors write the files, the driver commits them (see spark_jobs.delta_sink).
    return commit_frame(frame, uri, key, store.options_for(uri))


def _spark_session() -> "SparkSession":
    from pyspark.sql import SparkSession

    # Master, application name and configuration come from spark-submit (the operator).
    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _say(message: str) -> None:
    print(f"[falkirk] {message}", file=sys.stderr, flush=True)
