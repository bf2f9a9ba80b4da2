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
atomically (:mod:`falkirk.spark_jobs.delta_sink`). An epoch of at most
``FALKIRK_DRIVER_WRITE_MAX_ROWS`` rows (default 200,000; 0 turns it off) is written by
the driver instead, which saves starting the executors' Python workers.

A job module looks like this (see ``spark_jobs/pipeline/`` for real ones)::

    from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

    def compute(ctx: EpochContext) -> EpochResult:
        rows = ctx.read_input("ingest")
        return EpochResult(outputs={"output": rows.groupBy("customer").count()})

    if __name__ == "__main__":
        raise SystemExit(run_job(compute))
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from falkirk.policies.asset_events import CommittedEpoch
from falkirk.policies.ids import UNPARTITIONED, CommitId, ProcessorId, ReplicaId
from falkirk.policies.job_spec import (
    REFUSAL_PREFIX,
    REFUSED_EXIT_CODE,
    TAKEN_OVER_EXIT_CODE,
    JobSpec,
    completed_epoch_refusal,
    previous_epoch_refusal,
    replaced_input_refusal,
)
from falkirk.policies.lineage import TableRead, reads_line
from falkirk.policies.pairs import Layout, Status
from falkirk.policies.partitions import Broadcast, Repartition, Routing
from falkirk.policies.planning.from_ledger import compute_plan
from falkirk.policies.planning.recovery import BadEpoch, Failure, LostScratch, LostWorker
from falkirk.policies.regimes import Regime, SenderLog, Tier
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import (
    CommitKey,
    CommitResult,
    EpochTableError,
    FilesLost,
    computed_from_other_inputs,
    count_epoch,
    inputs_fingerprint,
)
from falkirk.policies.store.config import spark_uri
from falkirk.policies.store.control import Completions, Deliveries, Invalidations
from falkirk.policies.store.ledger import (
    EXTERNAL_TIER,
    AssetInput,
    DeltaSource,
    InputRef,
    Ledger,
    LedgerEntry,
    LedgerSnapshot,
    OutputRef,
    external_uri,
)
from falkirk.policies.workers import worker_name
from falkirk.spark_jobs import assets, pairs, sender_logs, steps
from falkirk.spark_jobs.delta_sink import StagedFiles, driver_write_max_rows, publish, read_frame, stage
from falkirk.spark_jobs.faults import crash_point
from falkirk.spark_jobs.job_log import say

if TYPE_CHECKING:  # Spark is imported lazily: an already-committed epoch never starts a JVM.
    from pyspark.sql import DataFrame, SparkSession


class JobError(RuntimeError):
    """A job cannot run or commit; the message says what is missing and what to do."""


class RolledBack(JobError):
    """A checkpoint this epoch depends on was rolled back by a recovery (or is missing): the
    epoch must not run from an older one. The recovery that rolled it back re-runs this epoch."""


class StateLost(JobError):
    """The checkpoint a stateful task must start from was in scratch and is gone.

    The task fails rather than start from empty state (which would silently drop every
    earlier epoch): recovery rolls it back to a checkpoint that still exists.
    """


@dataclass(frozen=True)
class Sent:
    """Records a job sent to a system outside the store (a warehouse, a topic, an outbox).

    The job sends them itself, before the commit; a crash before the ledger row means the
    epoch runs and sends again, so the destination must accept a repeated batch. The epoch
    becomes a checkpoint only once the destination has accepted it
    (:class:`falkirk.policies.store.control.Deliveries`). ``accepted=True`` says the job
    committed the records in the destination's own transactions (a SQL or Delta table): it
    accepted them then, and the runtime records the delivery right after the ledger row.
    """

    destination: str
    rows: int
    accepted: bool = False


@dataclass
class EpochResult:
    """What a job produced for its epoch: named output tables, records sent to external
    systems (:class:`Sent`) and, if stateful, its new state."""

    outputs: dict[str, DataFrame] = field(default_factory=dict)
    state: DataFrame | None = None
    sent: dict[str, Sent] = field(default_factory=dict)
    # A paired task's egress rows for this partition, written once for both replicas
    # (:func:`falkirk.spark_jobs.pairs.write_sink`).
    sink: DataFrame | None = None
    # The scratch tables this epoch was streamed through to a reader running beside the task
    # (:class:`~falkirk.spark_jobs.marker_edge.EdgeTables`): recorded in the ledger row, so
    # that garbage collection empties them on whichever worker's disk they were left.
    channels: tuple[str, ...] = ()


@dataclass
class EpochContext:
    """The epoch a job is running, with readers for its inputs and its previous state.

    The context remembers what the job read (the last epoch of each input), which becomes
    M̄ in the ledger row: recovery then knows exactly which upstream epochs this
    checkpoint depends on.
    """

    args: JobSpec
    store: StoreConfig
    ledger: Ledger
    spark: SparkSession
    # M̄ per (input task, output, producer partition): the last epoch consumed.
    consumed: dict[tuple[str, str, int], int] = field(default_factory=dict)
    reads_back: dict[tuple[str, str, int], int] = field(default_factory=dict)
    # The ledger rows this epoch was computed from: checked again around the commit point.
    depends_on: dict[tuple[str, int], LedgerEntry] = field(default_factory=dict)
    # The epochs of other DAGs' tasks read through Assets (read_asset), and their DAGs' rows.
    asset_inputs: list[AssetInput] = field(default_factory=list)
    # Every committed table read, for lineage (printed after the commit: falkirk.policies.lineage).
    reads: set[TableRead] = field(default_factory=set)
    # The Delta tables outside the store read (read_delta), at the versions read: the ledger row's.
    sources: set[DeltaSource] = field(default_factory=set)
    producer_snapshots: dict[str, LedgerSnapshot] = field(default_factory=dict, repr=False)
    # Whether the job checkpoints inside its epochs (iterate, chunks): only then does the
    # commit look for step checkpoints to delete.
    checkpoints_inside: bool = False
    # The DAG's ledger rows and rollbacks, read once for the questions the runtime asks (made on
    # first use when not given); ``ledger`` stays the live table, for appends and for jobs that poll.
    snapshot: LedgerSnapshot | None = None
    # The job itself: a task under sender-side logs runs it again over retained blocks to rebuild
    # a lost state (:mod:`falkirk.spark_jobs.sender_logs`), each replay given the state so far.
    compute: Callable[[EpochContext], EpochResult] | None = field(default=None, repr=False)
    replaying: sender_logs.Replaying | None = field(default=None, repr=False)
    _previous: LedgerEntry | None | bool = field(default=False, repr=False)
    _layout: Layout | None = field(default=None, repr=False)
    layout_version: int | None = field(default=None, repr=False)  # the layout table's, as first read
    _cached: list[DataFrame] = field(default_factory=list, repr=False)

    @property
    def rows(self) -> LedgerSnapshot:
        """The snapshot of the DAG's ledger this epoch runs from."""
        if self.snapshot is None:
            self.snapshot = LedgerSnapshot(self.ledger, self.args.dag_id)
        return self.snapshot

    @property
    def epoch(self) -> int:
        return self.args.epoch

    @property
    def partition(self) -> int | None:
        """This task instance's partition of a partitioned task (``None``: the task is not partitioned)."""
        return self.args.map_index // self.args.replicas if self.args.partitions is not None else None

    @property
    def replica(self) -> str | None:
        """This replica's name, ``"A"`` or ``"B"``, for a task under process pairs (``None`` otherwise)."""
        return self.args.replica.replica if self.args.replica is not None else None

    @property
    def layout(self) -> Layout:
        """The DAG's process-pair layout as this job read it first (:mod:`falkirk.spark_jobs.pairs`)."""
        if self._layout is None:
            self._layout, self.layout_version = pairs.layout_for(self)
        return self._layout

    @property
    def partitions(self) -> int | None:
        """The task's partition count (``None``: not partitioned)."""
        return self.args.partitions

    def cache(self, frame: DataFrame) -> DataFrame:
        """``frame``, kept by the executors once computed (memory, then disk) until this epoch's
        commit ends, then released: for a frame an iterative job reads many times.

        Unlike ``frame.cache()`` it is released, so a long-lived Spark Connect server does not
        keep every epoch's copy (whose weight slows every later query); unlike
        ``localCheckpoint()`` its lineage is kept, so a block lost with an executor is
        recomputed instead of failing the job.
        """
        self._cached.append(frame.persist())
        return frame

    def release_cached(self) -> None:
        """Release what :meth:`cache` kept (idempotent)."""
        while self._cached:
            self._cached.pop().unpersist()

    def read_input(self, task_id: str | None = None, output: str = "output", epoch: int | None = None,
                   routing: Routing | None = None) -> DataFrame:
        """Rows of an upstream task's output for this epoch (or an earlier ``epoch``), read by the executors.

        A partitioned input is read through ``routing`` (:mod:`falkirk.policies.partitions`):
        ``OneToOne()`` reads the same partition, ``Broadcast()`` every partition whole (the
        default for a task that is not partitioned itself), ``Repartition(key)`` this
        partition's slice of every partition, in partition order.
        """
        if task_id is None:
            if len(self.args.inputs) != 1:
                raise JobError(f"{self.args.processor}: name the input to read; this task reads {list(self.args.inputs)}")
            task_id = self.args.inputs[0]
        epoch = self.epoch if epoch is None else epoch
        if self.replaying is not None and epoch <= self.replaying.released.get(task_id, 0):
            # A block the task released: its state no longer depends on it, and it may be pruned.
            return self._read_partition(task_id, output, self.replaying.running_epoch, UNPARTITIONED).limit(0)
        if epoch > self.epoch:
            raise JobError(f"{self.args.processor}: cannot read epoch {epoch} of {task_id!r} while running epoch "
                           f"{self.epoch}; a task reads its own epoch or earlier ones")
        count = dict(self.args.input_partitions).get(task_id)
        if count is None:
            if routing is not None and not isinstance(routing, (Broadcast, Repartition)):
                raise JobError(f"{self.args.processor}: {task_id!r} is not partitioned; read it without routing=")
            frame = self._read_partition(task_id, output, epoch, UNPARTITIONED)
            return self._slice(frame, routing) if isinstance(routing, Repartition) else frame
        if routing is None:
            if self.partition is not None:
                raise JobError(f"{self.args.processor}: {task_id!r} has {count} partitions; say how partition "
                               f"{self.partition} reads them: read_input({task_id!r}, routing=OneToOne()), "
                               f"Broadcast() or Repartition(key=COLUMN)")
            routing = Broadcast()
        sources = routing.sources(self.partition or 0, count)
        if task_id in self.args.paired_inputs:  # each partition from one replica: its own id first
            sources = tuple(pairs.read_from(self, task_id, p, epoch) for p in sources)
        frames = [self._read_partition(task_id, output, epoch, p) for p in sources]
        frame = frames[0]
        for more in frames[1:]:
            frame = frame.unionByName(more)
        return self._slice(frame, routing) if isinstance(routing, Repartition) else frame

    def read_delta(self, uri: str) -> DataFrame:
        """A Delta table outside the store (a team's own source: a local path, ``s3://`` or
        ``s3a://``), read with Spark's Delta reader at its version as of now. The epoch's ledger
        row records the URI and that version, so that a later correction of the source (a newer
        version) can be told from what the epoch read (:class:`~falkirk.policies.store.ledger.DeltaSource`).

        The Spark server needs Delta's jars, and for S3 its ``s3a://`` settings (see the docs'
        "Layout and dependencies"). A source the epoch has read already is read at the same
        version again.
        """
        location = spark_uri(uri)
        quoted = location.replace("`", "``")
        known = {s.uri: s.version for s in self.sources}
        version = known.get(uri)
        if version is None:
            try:
                version = int(self.spark.sql(f"DESCRIBE HISTORY delta.`{quoted}` LIMIT 1").collect()[0]["version"])
            except Exception as exc:
                raise JobError(f"{self.args.processor}: cannot read the Delta table at {uri!r}: "
                               f"{type(exc).__name__}: {str(exc)[:300]}. Name a Delta table the Spark server "
                               f"reaches (with Delta's jars, and s3a:// settings for S3)") from exc
            self.sources.add(DeltaSource(uri=uri, version=version))
        return self.spark.read.format("delta").option("versionAsOf", version).load(location)

    def read_asset(self, asset: str, output: str = "output") -> DataFrame:
        """Rows of ``output`` of the producer epochs this run consumed through the Airflow Asset
        ``asset`` (a task of another DAG), each at the incarnation its DAG's ledger names now
        (:mod:`falkirk.spark_jobs.assets`)."""
        return assets.read_asset(self, asset, output)

    def iterate(self, step: Callable[[DataFrame, int], DataFrame], start: DataFrame, *, times: int,
                checkpoint_every: int) -> DataFrame:
        """``step(frame, i)`` for i = 1..``times`` from ``start``, checkpointing every
        ``checkpoint_every`` iterations at lex time (epoch, i); a new attempt resumes after the
        latest checkpoint (:mod:`falkirk.spark_jobs.steps`)."""
        self.checkpoints_inside = True
        return steps.iterate(self, step, start, times=times, checkpoint_every=checkpoint_every)

    def chunks(self, frame: DataFrame, process: Callable[[DataFrame, int], DataFrame], *, count: int,
               key: str, observer: steps.ChunkObserver | None = None) -> DataFrame:
        """The union of ``process(chunk, i)`` over ``count`` chunks of ``frame`` split by a hash of
        ``key``, each chunk's result checkpointed at lex time (epoch, i); a new attempt resumes
        after the latest (:mod:`falkirk.spark_jobs.steps`). ``observer`` hears of each chunk
        once it is saved (a :class:`~falkirk.spark_jobs.marker_edge.MarkerEdge`, for one)."""
        self.checkpoints_inside = True
        return steps.chunks(self, frame, process, count=count, key=key, observer=observer)

    def _slice(self, frame: DataFrame, routing: Repartition) -> DataFrame:
        """The rows of ``frame`` whose ``routing.key`` hashes to this partition (Spark's murmur3 hash:
        the same on every run, so a re-run reads the same slice)."""
        from pyspark.sql import functions as F

        if routing.key not in frame.columns:
            raise JobError(f"{self.args.processor}: Repartition(key={routing.key!r}): the input has no column "
                           f"{routing.key!r}; its columns are {frame.columns}")
        if self.partitions is None:
            return frame
        return frame.where(F.pmod(F.hash(F.col(routing.key)), F.lit(self.partitions)) == F.lit(self.partition))

    def _read_partition(self, task_id: str, output: str, epoch: int, map_index: int) -> DataFrame:
        """One producer partition's (or an unpartitioned producer's) output of ``epoch``."""
        producer = ProcessorId(task=task_id, map_index=map_index)
        entry = self.rows.find(task_id, epoch, map_index)
        if entry is None:
            raise JobError(
                f"{self.args.processor}: upstream task {producer!r} has no checkpoint for epoch {epoch}; "
                f"run {producer} for this epoch first"
            )
        frame = self.read_output(entry, output, repr(task_id), repr(producer))
        self.depends_on[producer, epoch] = entry
        key = (task_id, output, map_index)
        self.consumed[key] = max(self.consumed.get(key, epoch), epoch)
        self.reads_back[key] = max(self.reads_back.get(key, 0), self.epoch - epoch)
        return frame

    def read_output(self, entry: LedgerEntry, output: str, task: str, producer: str) -> DataFrame:
        """The rows of ``output`` that the commit ``entry`` holds, read where its tier keeps them;
        ``task`` and ``producer`` name the writer in errors (the task, and it or its partition)."""
        ref = next((o for o in entry.outputs if o.name == output), None)
        if ref is None:
            names = [o.name for o in entry.outputs]
            raise JobError(f"{self.args.processor}: task {task} has no output {output!r}; it has {names}")
        if ref.tier == EXTERNAL_TIER:
            raise JobError(f"{self.args.processor}: {task} sent {output!r} to {ref.uri[len('external:'):]}, "
                           f"outside the store; read one of its output tables instead")
        if ref.tier == Tier.SCRATCH.value:
            self._check_on_this_worker(entry, f"output {output!r} of {task}")
        self.reads.add(TableRead(dag_id=entry.dag_id, task_id=entry.task_id, epoch=entry.epoch, incarnation=entry.incarnation, output=output, uri=ref.uri,
                                 version=ref.version, map_index=entry.map_index))
        return self._read(ref.uri, entry, ref.rows, f"output {output!r} of {producer}")

    def previous_state(self) -> DataFrame | None:
        """The state as of this task's latest checkpoint before this epoch; ``None`` at the start (∅)."""
        if not self.args.regime.keeps_state:
            raise JobError(f"{self.args.processor}: regime {self.args.regime.spec()} keeps no state to load")
        if self.replaying is not None:  # a replay of retained blocks: the state its predecessor left
            return self.replaying.state
        entry = self.previous_checkpoint()
        if entry is None:
            return None
        if isinstance(self.args.regime, SenderLog):
            if sender_logs.restarted_volatile(self):
                return sender_logs.rebuild_state(self, entry, f"its state of epoch {entry.epoch} was lost with the "
                                                 f"failed incarnation (log_durability=volatile)")
            try:
                return self._restore(entry, advise=False)
            except StateLost as lost:
                # gone, on another worker's disk, or its data files gone with its log kept
                return sender_logs.rebuild_state(self, entry, f"its state of epoch {entry.epoch} " + (
                    f"cannot be read: {lost.__cause__}" if isinstance(lost.__cause__, FilesLost)
                    else "is not in scratch here"))
        return self._restore(entry)

    def _restore(self, entry: LedgerEntry, advise: bool = True) -> DataFrame:
        """The state checkpointed by ``entry``, or :class:`StateLost` if it was in scratch and is gone
        (naming the plan that recovers it, with its size, when ``advise``)."""
        if entry.state_uri is None:
            raise JobError(f"ledger row of {self.args.processor} epoch {entry.epoch} records no state table")
        self.depends_on[entry.processor, entry.epoch] = entry
        in_scratch = entry.state_tier == Tier.SCRATCH.value
        if in_scratch:
            self._check_on_this_worker(entry, "state", advise)
        _check_inside(self.store, entry.state_uri, entry, "state_uri")
        say(f"{self.args.processor} epoch {self.epoch}: restoring the state of epoch {entry.epoch} from "
            f"{entry.state_tier} ({entry.state_uri}" + (f" on {entry.worker}" if in_scratch and entry.worker else "")
            + ")")
        try:
            return read_frame(self.spark, entry.state_uri, entry.key, entry.state_rows,
                              self.store.options_for(entry.state_uri), on_driver=in_scratch,
                              spark_reads=self.store.spark_reads)
        except EpochTableError as exc:
            if in_scratch:
                # This worker is alive (the job runs on it): only the task's, or the partition's,
                # scratch directory is gone, and a plan for that directory is the smallest.
                where = entry.state_uri.rsplit('/', 1)[0]
                raise StateLost(
                    f"state lost: {self.args.processor}'s state of epoch {entry.epoch} was kept in scratch at "
                    f"{entry.state_uri}" + (f" on {entry.worker}" if entry.worker else "") + f" and is gone "
                    f"({exc}). Not starting from empty state. Recover with: "
                    f"falkirk plan --dag {self.args.dag_id} --lost-scratch {where}"
                    + (plan_size(self.store, self.rows, self.args, LostScratch(where), before_this_epoch=True)
                       if advise else "")) from exc
            raise JobError(f"{self.args.processor}: cannot restore the state of epoch {entry.epoch}: {exc}. "
                           f"Not starting from empty state. Plan a recovery: falkirk plan --dag "
                           f"{self.args.dag_id} --bad-epoch {self.args.processor}:{entry.epoch}") from exc

    def previous_checkpoint(self) -> LedgerEntry | None:
        """This task's checkpoint of the epoch just before this one (read once).

        ``None`` only when the task has no checkpoint before this epoch at all (its first
        epoch). A stateful task never restores across a gap: when the previous epoch's row is
        missing or was rolled back by a recovery (and not redone yet), this raises
        :class:`RolledBack` rather than fall back to an older checkpoint.
        """
        if self._previous is False:
            a = self.args
            current, rolled_back = self.rows.entries_and_invalidated(a.task_id, a.map_index)
            before = [e for e in current if e.epoch < a.epoch]
            previous = max((e for e in before if e.epoch == a.epoch - 1), key=lambda e: e.incarnation, default=None)
            earlier = [e.epoch for e in [*before, *rolled_back] if e.epoch < a.epoch]
            if previous is None and earlier and a.regime.keeps_state:
                gone = any(e.epoch == a.epoch - 1 for e in rolled_back)
                kept = max(e.epoch for e in before) if before else None
                raise RolledBack(previous_epoch_refusal(a.dag_id, a.processor, a.epoch, gone, kept))
            self._previous = previous if a.regime.keeps_state else (
                max(before, key=lambda e: (e.epoch, e.incarnation), default=None))
        return self._previous  # type: ignore[return-value]

    def _check_on_this_worker(self, entry: LedgerEntry, what: str, advise: bool = True) -> None:
        """Refuse to read scratch that another worker's disk holds: from here it is lost.

        Placement (:mod:`falkirk.plugins.placement`) runs a task where its scratch inputs are;
        it lands elsewhere when that worker is gone, or when nothing routes it.
        """
        here = worker_name()
        if entry.worker is None or entry.worker == here:
            return
        a = self.args
        raise StateLost(
            f"state lost: {a.processor} epoch {a.epoch} runs on {here}, but the {what} of {entry.processor} epoch "
            f"{entry.epoch} is kept in scratch on {entry.worker}'s local disk, which this worker cannot read. "
            f"Not starting without it. If {entry.worker} is gone, recover with: falkirk plan --dag {a.dag_id} "
            f"--lost-worker {entry.worker}"
            f"{plan_size(self.store, self.rows, a, LostWorker(entry.worker), True) if advise else ''}; if it is "
            f"alive, route the task to its queue (see the docs' "
            f"\"Scaling out\")")

    def _read(self, uri: str, entry: LedgerEntry, rows: int | None, what: str) -> DataFrame:
        _check_inside(self.store, uri, entry, "outputs[].uri")
        try:
            return read_frame(self.spark, uri, entry.key, rows, self.store.options_for(uri),
                              on_driver=self.store.is_scratch(uri), spark_reads=self.store.spark_reads)
        except EpochTableError as exc:
            raise JobError(f"{self.args.processor}: cannot read the {what} at epoch {entry.epoch}: {exc}. "
                           f"Plan a recovery that redoes it: falkirk plan --dag {entry.dag_id} "
                           f"--bad-epoch {entry.task_id}:{entry.epoch}") from exc


def run_job(compute: Callable[[EpochContext], EpochResult], argv: Sequence[str] | None = None) -> int:
    """Run ``compute`` for the epoch named on the command line and commit it; returns an exit code."""
    args = JobSpec.parse(argv)
    store = StoreConfig.from_env()
    ledger = Ledger(store)
    snapshot = LedgerSnapshot(ledger, args.dag_id)  # one read of the DAG's rows and rollbacks
    label = f"{args.dag_id}.{args.processor} epoch {args.epoch}"
    finished = already_committed(args, store, snapshot)
    if finished is not None:
        return finished
    # A recovery that rolled this epoch back invalidated its row: redo it as the next
    # incarnation, the only commit that replaces the rows already in its tables.
    incarnation = max(args.incarnation, snapshot.next_incarnation(args.task_id, args.epoch, args.map_index))
    if incarnation != args.incarnation:
        say(f"{label}: rolled back by a recovery; redoing it as incarnation {incarnation}")
        args = dataclasses.replace(args, incarnation=incarnation)
    # A replica reads the layout (the generation it runs under) before it computes anything, and
    # does nothing once its twin has taken over.
    paired = EpochContext(args, store, ledger, spark=None, snapshot=snapshot) if args.replicas > 1 else None  # type: ignore[arg-type]
    if paired is not None and (taken_over := _taken_over(paired)) is not None:
        return taken_over
    started = time.monotonic()
    spark = _spark_session()
    ctx = None
    try:
        ctx = EpochContext(args, store, ledger, spark, snapshot=snapshot, compute=compute)
        if paired is not None:
            ctx._layout, ctx.layout_version = paired.layout, paired.layout_version
        sender_logs.lose_volatile_log(ctx)  # a volatile log dies with the incarnation that failed
        result = compute(ctx)
        try:
            entry = commit(ctx, result)
        except pairs.Fenced as exc:
            print(REFUSAL_PREFIX + str(exc), flush=True)
            return TAKEN_OVER_EXIT_CODE
        try:
            if ctx.checkpoints_inside:
                steps.discard(ctx)
        except Exception as exc:  # noqa: BLE001 - the epoch is committed; its next one sweeps these too
            say(f"{label}: its checkpoints inside the epoch were not deleted ({exc}); the next epoch's "
                f"commit deletes them")
    finally:
        if ctx is not None:
            ctx.release_cached()  # a job that failed before its commit
        spark.stop()
    if args.task_instance:
        Completions(store).record(entry)
    crash_point(args.processor, args.epoch, "after-completion", dag_id=args.dag_id)
    print(reads_line(ctx.reads), flush=True)  # the task's lineage (falkirk.plugins.lineage)
    print(CommittedEpoch.from_entry(entry).line(), flush=True)  # what the task's asset events carry
    say(f"{label}: committed {entry.output_rows} output rows"
        + (f", {entry.state_rows} state rows" if entry.state_uri else "")
        + f" in {time.monotonic() - started:.1f}s (ledger read {Ledger.reads}x, rollbacks read "
        f"{Invalidations.reads}x, snapshot brought up to date {snapshot.refreshes}x)")
    return 0


def _taken_over(ctx: EpochContext) -> int | None:
    """:data:`TAKEN_OVER_EXIT_CODE` for a replica the layout has declared dead (its twin runs the
    partition until a catch-up recreates it on a spare); ``None`` when it runs."""
    args = ctx.args
    me = ReplicaId.of(task=args.task_id, map_index=args.map_index)
    partition, replica = me.partition, me.replica
    current = ctx.layout.replica(args.task_id, partition, replica)
    if current.status is not Status.DEAD:
        return None
    twin = next(r for r in ctx.layout.pair(args.task_id, partition) if r.replica != replica)
    print(REFUSAL_PREFIX + f"{args.replica} epoch {args.epoch}: this replica was declared dead (generation "
          f"{current.generation}) and its twin {twin.name} ({twin.status.value} on {twin.worker}) runs the "
          f"partition; nothing to do. Recreate it on a spare: falkirk pairs catch-up --dag {args.dag_id}", flush=True)
    return TAKEN_OVER_EXIT_CODE


def plan_size(store: StoreConfig, snapshot: LedgerSnapshot, args: JobSpec, failure: Failure,
              before_this_epoch: bool = False) -> str:
    """`` (re-runs N task instances, through epoch E)``: the size of the plan a message advises,
    computed as ``falkirk plan`` would from the ledger; empty if it cannot be computed here, as the
    advice stands without it. With ``before_this_epoch`` (a job that cannot run its epoch) the
    count stops before this epoch, whose other instances may still be running: those of earlier
    epochs are settled, so the count is the one ``falkirk plan`` shows for them."""
    try:
        rows = snapshot.entries()
        regimes = {e.processor: Regime.parse(e.regime) for e in rows}
        last = args.epoch - 1 if before_this_epoch else max([args.epoch, *(e.epoch for e in rows)])
        plan = compute_plan(args.dag_id, store, [failure], regimes, last_epoch=last, record=False, snapshot=snapshot)
    except Exception as exc:  # noqa: BLE001 (advice without its size rather than no advice)
        say(f"(the size of the advised plan could not be computed here: {type(exc).__name__}: {exc})")
        return ""
    if before_this_epoch:
        return f" (re-runs {len(plan.rerun_set())} task instances up to epoch {last}, then epoch {args.epoch} on)"
    return f" (re-runs {len(plan.rerun_set())} task instances, through epoch {last})"


def already_committed(args: JobSpec, store: StoreConfig, snapshot: LedgerSnapshot) -> int | None:
    """The exit code of a run whose epoch is already committed at its incarnation; ``None`` when
    the epoch has to run.

    Such a run changes nothing. A retry of an attempt that died after its commit is a no-op
    (exit 0), also when that attempt had recorded its completion before Airflow heard of it (the
    attempt was killed, or Airflow reset it as orphaned). An Airflow re-run of an epoch whose task
    instance went on to complete (a Clear, a backfill that reprocesses it) is refused with
    :data:`REFUSED_EXIT_CODE`: it would leave the epoch's result, and every result built on it,
    stale behind a green task instance; a planned recovery redoes it
    (:class:`~falkirk.policies.store.control.Completions`).
    """
    done = snapshot.find(args.task_id, args.epoch, args.map_index, read_again=False)
    if done is None or done.incarnation < args.incarnation:
        return None
    completions = Completions(store)
    retried = done.run_id == args.run_id and args.retries_attempt(done.try_number)
    if args.task_instance and not retried and completions.completed(done):
        if done.run_id != args.run_id and _reads_reflected(args, done):
            say(f"{args.dag_id}.{args.processor} epoch {args.epoch}: run {done.run_id} already read every asset "
                f"event of this run (at incarnation {done.incarnation}); nothing to do")
            print(CommittedEpoch.from_entry(done).line(), flush=True)
            return 0
        size = plan_size(store, snapshot, args, BadEpoch(args.processor, args.epoch))
        replaced = _replaced_read(args, done)
        refusal = (replaced_input_refusal(args, *replaced, size) if replaced is not None
                   else completed_epoch_refusal(args, done.run_id, done.try_number, size))
        for line in refusal.splitlines():
            print(REFUSAL_PREFIX + line, flush=True)  # a line each: the operator joins them
        return REFUSED_EXIT_CODE
    say(f"{args.dag_id}.{args.processor} epoch {args.epoch}: already committed (incarnation {done.incarnation}, "
        f"run {done.run_id}, try {done.try_number}); nothing to do")
    if args.task_instance:
        completions.record(done)
    print(CommittedEpoch.from_entry(done).line(), flush=True)  # the retried task instance's asset events carry it
    return 0


def _reads_reflected(args: JobSpec, done: LedgerEntry) -> bool:
    """Whether ``done`` read every producer epoch this run's asset events name, each at the
    event's incarnation or a later one: a second run Airflow started on an event the epoch's
    commit already reflects (a redo's event arriving after the consumer was redone too)."""
    read = {(r.dag_id, r.processor, r.epoch): r.incarnation for r in done.asset_inputs}
    return bool(args.consumed) and all(
        read.get((c.dag_id, c.processor, c.epoch), -1) >= c.incarnation
        for c in (event.committed for event in args.consumed))


def _replaced_read(args: JobSpec, done: LedgerEntry) -> tuple[str, int, int, int] | None:
    """(producer, epoch, incarnation read, incarnation now) for a producer epoch ``done`` read
    that one of this run's asset events replaces; ``None`` if none does."""
    for event in args.consumed:
        c = event.committed
        for read in done.asset_inputs:
            if (read.dag_id, read.processor, read.epoch) == (c.dag_id, c.processor, c.epoch) \
                    and c.incarnation > read.incarnation:
                return read.producer, read.epoch, read.incarnation, c.incarnation
    return None


def commit(ctx: EpochContext, result: EpochResult) -> LedgerEntry:
    """Write outputs, then state, then the ledger row, each idempotently (see the module docstring);
    then, committed or not, release what the job cached (:meth:`EpochContext.cache`)."""
    try:
        return _checked_commit(ctx, result)
    finally:
        ctx.release_cached()


def _checked_commit(ctx: EpochContext, result: EpochResult) -> LedgerEntry:
    args = ctx.args
    regime = args.regime
    if not result.outputs and not result.sent:
        raise JobError(f"{args.processor}: the job returned no outputs; return EpochResult(outputs={{'output': df}}) "
                       f"or, for records sent elsewhere, EpochResult(sent={{'name': Sent(destination, rows)}})")
    clash = sorted(set(result.outputs) & set(result.sent))
    if result.sink is not None and pairs.SINK in {*result.outputs, *result.sent}:
        clash.append(pairs.SINK)  # the name the ledger row gives the egress table
    if clash:
        raise JobError(f"{args.processor}: {clash} named both as an output table and as sent; give them different names")
    unknown = sorted(set(args.products) - set(result.outputs))
    if unknown:
        raise JobError(f"{args.processor}: products={unknown} names outputs the job did not return; it returned "
                       f"{sorted(result.outputs)}: name those in products=")
    if regime.keeps_state and result.state is None:
        raise JobError(f"{args.processor}: regime {regime.spec()} keeps state; return EpochResult(state=df)")
    if not regime.keeps_state and result.state is not None:
        raise JobError(f"{args.processor}: regime {regime.spec()} is stateless but the job returned state; "
                       f"drop it or use a checkpoint regime")
    key = CommitKey(dag_id=args.dag_id, task_id=args.task_id, epoch=args.epoch, map_index=args.map_index, incarnation=args.incarnation,
                    inputs=inputs_fingerprint(_reads_of(ctx)))
    # Outputs and state usually share lineage (state = previous state + this epoch's
    # outputs), and a checkpoint may go to two tiers: cache so each is computed once.
    frames = list(result.outputs.values()) if result.state is not None or len(result.outputs) > 1 else []
    if result.state is not None and len(regime.state_tiers(args.epoch)) > 1:
        frames.append(result.state)
    for frame in frames:
        frame.persist()
    try:
        return _commit(ctx, result, key)
    finally:
        for frame in frames:
            frame.unpersist()


def _commit(ctx: EpochContext, result: EpochResult, key: CommitKey) -> LedgerEntry:
    args, store, regime = ctx.args, ctx.store, ctx.args.regime
    crash_point(args.processor, args.epoch, "before-commit", dag_id=args.dag_id)
    out_tier = regime.output_tier(args.epoch)
    # (output name, or None for the state; table URI; frame)
    targets: list[tuple[str | None, str, DataFrame]] = [
        (name, store.table_uri(out_tier, args.dag_id, args.task_id, name, args.map_index), frame)
        for name, frame in sorted(result.outputs.items())]
    if result.state is not None:  # scratch first, the durable copy (if any) last
        targets += [(None, store.table_uri(tier, args.dag_id, args.task_id, "state", args.map_index), result.state)
                    for tier in regime.state_tiers(args.epoch)]
    # Every table's files are written at once (a small epoch by the driver, a large one by the
    # executors); the driver then commits them in order.
    small = driver_write_max_rows()
    # Scratch is this worker's local disk: only the driver, which runs here, may write it (an
    # executor on another host would write to its own disk, where no reader looks).
    with ThreadPoolExecutor(max_workers=max(len(targets), 1)) as pool:
        staged = list(pool.map(lambda t: stage(t[2], t[1], key, store.options_for(t[1]), small,
                                               on_driver=store.is_scratch(t[1])), targets))
    crash_point(args.processor, args.epoch, "after-files", dag_id=args.dag_id)
    staged = _settle_other_inputs(ctx, key, staged)

    previous = ctx.previous_checkpoint()
    before = {o.name: o.discarded_through for o in previous.outputs} if previous else {}
    outputs, state = [], None
    for (name, uri, _), files in zip(targets, staged):
        if name is None and state is None:
            crash_point(args.processor, args.epoch, "after-outputs", dag_id=args.dag_id)
        written = publish(files)
        say(f"  {'state' if name is None else f'output {name!r}'} -> {uri} (v{written.version}, "
            f"{written.rows} rows" + ("" if written.applied else ", already there") + ")")
        if name is None:
            state = written
        else:
            # D̄ as committed: an epoch sent only to scratch is not logged.
            discarded = args.epoch if out_tier is Tier.SCRATCH else before.get(name)
            outputs.append(OutputRef(name, written.uri, out_tier.value, written.version, written.rows, discarded,
                                     product=name in args.products))
    if state is None:
        crash_point(args.processor, args.epoch, "after-outputs", dag_id=args.dag_id)
    crash_point(args.processor, args.epoch, "after-state", dag_id=args.dag_id)

    pairs.fence(ctx)  # a replica declared dead meanwhile commits nothing
    sent = dict(result.sent)
    if result.sink is not None:
        written = pairs.write_sink(ctx, result.sink)
        say(f"  sink -> {written.uri} (v{written.version}, {written.rows} rows"
            + ("" if written.applied else ", already written by the twin") + ")")
        crash_point(args.processor, args.epoch, "after-sink", dag_id=args.dag_id)
        # Egress, read by no task: committed in its own transaction, so accepted as sent (a
        # redo replaces the epoch's rows under a higher incarnation).
        sent[pairs.SINK] = Sent(written.uri, written.rows, accepted=True)
    for name, sending in sorted(sent.items()):
        outputs.append(OutputRef(name, external_uri(sending.destination), EXTERNAL_TIER, 0, sending.rows))
    consumed = {(i.task_id, i.output, i.map_index): i.through for i in previous.inputs} if previous else {}
    for k, through in ctx.consumed.items():
        consumed[k] = max(consumed.get(k, through), through)
    state_tier = regime.state_tier(args.epoch)
    entry = LedgerEntry(
        dag_id=args.dag_id, task_id=args.task_id, epoch=args.epoch, regime=regime.spec(), run_id=args.run_id,
        try_number=args.try_number, map_index=args.map_index, incarnation=args.incarnation,
        state_uri=state.uri if state else None, state_tier=state_tier.value if state and state_tier else None,
        state_version=state.version if state else None, state_rows=state.rows if state else None,
        outputs=tuple(outputs),
        inputs=tuple(InputRef(task_id=t, output=o, through=through, reads_back=ctx.reads_back.get((t, o, p), 0), map_index=p)
                     for (t, o, p), through in sorted(consumed.items())),
        # Airflow starts a task's epoch only once its upstream epochs are complete: it acts
        # on the completion of every epoch up to this one.
        notified_through=args.epoch,
        worker=worker_name(),
        asset_inputs=tuple(ctx.asset_inputs),
        sources=tuple(sorted(ctx.sources)),
        channels=_own_channels(ctx, result.channels),
        partitions=args.partitions, replicas=args.replicas if args.partitions is not None else None,
    )
    entry = dataclasses.replace(entry, rollbacks_seen=_check_still_current(ctx, entry, appended=False))
    ctx.ledger.append(entry, snapshot=ctx.rows)  # through the handle the job read the ledger with
    _check_still_current(ctx, entry, appended=True)
    if args.replicas > 1:
        try:
            if pairs.fold_in_if_caught_up(ctx, args.epoch):
                say(f"  {args.replica} caught up with its twin at epoch {args.epoch}: active again")
        except Exception as exc:  # noqa: BLE001 - the epoch is committed; the next epoch's commit tries again
            say(f"  {args.replica}: not folded in yet ({type(exc).__name__}: {exc}); its next epoch tries again")
    if sent and all(s.accepted for s in sent.values()):
        _record_accepted(ctx)
    return entry


def _own_channels(ctx: EpochContext, uris: tuple[str, ...]) -> tuple[str, ...]:
    """``uris``, each checked to be one of this task's scratch tables on this worker."""
    a = ctx.args
    for uri in uris:
        name = uri.rstrip("/").rsplit("/", 1)[-1]
        if uri != ctx.store.table_uri(Tier.SCRATCH, a.dag_id, a.task_id, name, a.map_index):
            raise JobError(f"{a.processor} epoch {a.epoch}: EpochResult.channels names {uri!r}, which is not a scratch "
                           f"table of this task on this worker; name it store.table_uri(Tier.SCRATCH, dag_id, "
                           f"task_id, name)")
    return tuple(uris)


def _record_accepted(ctx: EpochContext) -> None:
    """Record that this task's destinations hold its epochs through the last one committed
    without a gap (a crash before this only leaves the epoch to be delivered again)."""
    a = ctx.args
    committed = {e.epoch for e in ctx.ledger.entries(a.dag_id, a.task_id)}
    through = 0
    while through + 1 in committed:
        through += 1
    if through:
        Deliveries(ctx.store).record(a.dag_id, a.task_id, through, ctx.ledger.external_senders(a.dag_id))


def _check_inside(store: StoreConfig, uri: str, entry: LedgerEntry, field_name: str) -> None:
    if not store.contains(uri):
        raise JobError(f"ledger row of {entry.processor} epoch {entry.epoch}: {field_name} {uri!r} is outside the "
                       f"store ({store.durable_uri}) and scratch ({store.scratch_uri}) roots; not reading it. "
                       f"The ledger is damaged: repair the row, or plan a recovery that redoes the epoch")


def _already_there(files: StagedFiles, key: CommitKey) -> CommitResult:
    """The commit ``files``' table already holds (it was staged against the table, so has one)."""
    table = files.table
    if table is None:
        raise JobError(f"{files.uri}: no table to find the commit of epoch {key.epoch} in")
    return CommitResult(files.uri, table.version(), count_epoch(table, key.epoch), applied=False)


def _check_still_current(ctx: EpochContext, entry: LedgerEntry | None, appended: bool) -> int | None:
    """Refuse a commit computed from a ledger row a recovery has rolled back meanwhile; returns
    the version of the rollbacks it checked against (recorded in the row, ``rollbacks_seen``).

    Checked just before the ledger append and again just after it: a recovery invalidates
    before it clears, and sweeps the rows whose check did not see its invalidation, so a row
    built on rolled-back data is either never appended or withdrawn here (invalidated in turn).
    Also checked before replacing tables another attempt of this epoch committed from other
    inputs (``entry`` ``None``: there is no row yet).
    """
    stale_reads = _stale_asset_reads(ctx)
    if not ctx.depends_on and not stale_reads:  # computed from nothing a recovery can roll back
        return ctx.rows.rollbacks_version
    version = ctx.rows.refresh_rollbacks() if ctx.depends_on else ctx.rows.rollbacks_version
    gone = ctx.rows.gone
    stale = [f"{t} epoch {e}" for t, e in sorted(key for key, row in ctx.depends_on.items() if row.commit_id in gone)]
    if not stale and not stale_reads:
        return version
    if appended and entry is not None:
        ctx.ledger.invalidations.record([entry], f"withdrawn:{entry.commit_id}")
    a = ctx.args
    if not stale:  # another DAG's recovery: it does not re-run this DAG's epochs
        raise RolledBack(f"{a.processor} epoch {a.epoch}: {', '.join(stale_reads)}, read through an Asset, "
                         f"was rolled back by a recovery in its DAG while this epoch ran; its commit is "
                         f"{'withdrawn' if appended else 'not made'}. Recover this DAG from this epoch once the "
                         f"redo is committed (falkirk plan --dag {a.dag_id} --bad-epoch "
                         f"{a.processor}:{a.epoch}), or plan that recovery with --consumers")
    raise RolledBack(f"{a.processor} epoch {a.epoch}: {', '.join(stale + stale_reads)} "
                     f"was rolled back by a recovery while this epoch ran; its commit is "
                     f"{'withdrawn' if appended else 'not made'}, and the recovery re-runs it")


def _settle_other_inputs(ctx: EpochContext, key: CommitKey, staged: list[StagedFiles]) -> list[StagedFiles]:
    """``staged``, settled for tables another attempt of this epoch committed from other inputs.

    If that attempt's ledger row is there, its commit is the epoch's: this one adopts it, as it
    would the same inputs' (a zombie changes nothing). If not, that attempt died before its
    ledger row, and a recovery has redone an input since: its tables are replaced, once this
    attempt's own inputs are checked to be still current (else it is the stale one, and stops).
    """
    a = ctx.args
    other = [files for files in staged if computed_from_other_inputs(files.table, key)]
    if not other:
        return staged
    row = ctx.rows.find(a.task_id, a.epoch, a.map_index)
    if row is not None and row.incarnation >= key.incarnation:
        return [dataclasses.replace(files, done=_already_there(files, key)) if any(files is o for o in other) else files
                for files in staged]
    _check_still_current(ctx, None, appended=False)
    say(f"  replacing {len(other)} table(s) an earlier attempt of this epoch committed from other inputs "
        f"(it died before its ledger row): {', '.join(files.uri for files in other)}")
    return staged


def _reads_of(ctx: EpochContext) -> list[CommitId]:
    """Every commit this epoch was computed from: the ledger rows it read (inputs, restored
    state) and the epochs read through Assets."""
    return [r.commit_id for r in ctx.depends_on.values()] + [r.commit_id for r in ctx.asset_inputs]


def _stale_asset_reads(ctx: EpochContext) -> list[str]:
    """The producer epochs this epoch read through an Asset that a recovery in the producer's
    DAG has rolled back since (each producer's rollbacks read again, only those committed since)."""
    if not ctx.asset_inputs:
        return []
    for producer in ctx.producer_snapshots.values():
        producer.refresh_rollbacks()
    stale = []
    for read in ctx.asset_inputs:
        snapshot = ctx.producer_snapshots.get(read.dag_id)
        if snapshot is not None and read.commit_id in snapshot.gone:
            stale.append(f"{read.producer} epoch {read.epoch}")
    return stale


def _spark_session() -> SparkSession:
    import os

    from pyspark.sql import SparkSession

    remote = os.environ.get("SPARK_REMOTE")
    if remote:  # a Spark Connect client: the operator passes the server's URL and the session's conf
        spark = SparkSession.builder.remote(remote).getOrCreate()
        for item in filter(None, os.environ.get("FALKIRK_SPARK_CONF", "").split(",")):
            key, _, value = item.partition("=")
            if key.startswith("spark.sql."):  # the only ones a Connect session may set
                spark.conf.set(key, value)
        return spark
    # Master, application name and configuration come from spark-submit (the operator).
    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
