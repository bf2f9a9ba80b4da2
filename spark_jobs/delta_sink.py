"""One epoch of a Delta table as a Spark DataFrame: files on the executors, one commit on the driver.

Writing is two steps, so that a job can write all its tables' files at once and still
commit them in a fixed order: :func:`stage` and :func:`publish` (:func:`commit_frame`
does both). Reading (:func:`read_frame`) is the mirror image: the driver reads only the
Delta log and the executors read the files.

A large epoch is never collected to the driver. Each executor writes its partition as a
Parquet file into the table's ``epoch=<t>/`` directory (with pyarrow, to a local path or
S3-compatible storage) and returns only the file's path, size and row count. The driver
then makes all the files visible in **one** Delta commit (delta-rs) that replaces exactly
that epoch's partition and records the (task, epoch) app transaction, as
:func:`falkirk.policies.store.commits.commit_epoch` does for data it holds itself.

A small epoch (at most ``driver_write_max_rows`` rows, found by fetching one row more
than that) is fetched as Arrow and written by the driver as one file instead: the
executors' Python workers cost seconds to start, far more than writing a few thousand
rows. The commit is the same either way.

Files written by an attempt that dies before the commit are never referenced by the
Delta log, so readers never see them (a later ``vacuum`` deletes them); the next attempt
writes new files and commits those.
"""

from __future__ import annotations

import enum
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Schema
from deltalake.transaction import AddAction, create_table_with_add_actions

from falkirk.policies.store.commits import (
    EPOCH,
    TABLE_PROPERTIES,
    CommitKey,
    CommitResult,
    EpochTableError,
    FilesLost,
    already_committed,
    commit_once,
    count_epoch,
    filesystem,
    lost_files,
    missing_commit,
    open_table,
    scan,
)
from falkirk.policies.store.config import spark_uri

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

FILES_SCHEMA = "path string, size long, rows long"


@dataclass(frozen=True)
class StagedFiles:
    """An epoch's data files, written by the executors and not yet visible to any reader."""

    uri: str
    key: CommitKey
    schema: pa.Schema  # with the epoch column
    files: tuple[tuple[str, int, int], ...]  # (path relative to the table, size, rows)
    storage_options: dict[str, str] | None
    done: CommitResult | None = None  # set when the table already holds this commit
    table: DeltaTable | None = None  # the table as staging saw it; publish brings it up to date

    @property
    def rows(self) -> int:
        return sum(f[2] for f in self.files)


def commit_frame(frame: DataFrame, uri: str, key: CommitKey,
                 storage_options: dict[str, str] | None = None) -> CommitResult:
    """Replace epoch ``key.epoch`` of the table at ``uri`` with ``frame``'s rows, at most once per key."""
    return publish(stage(frame, uri, key, storage_options))


DRIVER_WRITE_MAX_ROWS = 200_000


def driver_write_max_rows() -> int:
    """``FALKIRK_DRIVER_WRITE_MAX_ROWS``: the largest epoch the driver writes itself (0: never).

    >>> import os
    >>> _ = os.environ.pop("FALKIRK_DRIVER_WRITE_MAX_ROWS", None)
    >>> driver_write_max_rows()
    200000
    """
    import os

    raw = os.environ.get("FALKIRK_DRIVER_WRITE_MAX_ROWS", "")
    try:
        value = int(raw) if raw else DRIVER_WRITE_MAX_ROWS
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"FALKIRK_DRIVER_WRITE_MAX_ROWS={raw!r}: give a row count, 0 to have the executors "
                         f"write every epoch (default {DRIVER_WRITE_MAX_ROWS})")
    return value


def stage(frame: DataFrame, uri: str, key: CommitKey,
          storage_options: dict[str, str] | None = None,
          driver_write_max_rows: int = DRIVER_WRITE_MAX_ROWS, on_driver: bool = False) -> StagedFiles:
    """Write ``frame`` as this epoch's data files, not yet visible (skipped if already committed):
    on the driver if it has at most ``driver_write_max_rows`` rows or ``on_driver`` (a table on
    the driver's local disk), else on the executors."""
    table = open_table(uri, storage_options)
    if table is not None and already_committed(table, key):
        done = CommitResult(uri, table.version(), count_epoch(table, key.epoch), applied=False)
        return StagedFiles(uri, key, pa.schema([]), (), storage_options, done)
    from pyspark.sql.pandas.types import to_arrow_schema

    data = frame.drop(EPOCH) if EPOCH in frame.columns else frame
    schema = to_arrow_schema(data.schema)  # Spark's Arrow types, fixed on the driver
    write = _file_writer(uri, key.epoch, schema, storage_options)
    if on_driver:
        small = data.toArrow()
    else:
        small = data.limit(driver_write_max_rows + 1).toArrow() if driver_write_max_rows > 0 else None
    if small is not None and (on_driver or small.num_rows <= driver_write_max_rows):
        written = write(iter(small.to_batches()), 0)
        files = [tuple(r.values()) for b in written for r in b.to_pylist()]
    else:
        files = [(f.path, f.size, f.rows) for f in data.mapInArrow(
            lambda batches: write(batches, _partition_id()), FILES_SCHEMA).collect()]
    return StagedFiles(uri, key, schema.append(pa.field(EPOCH, pa.int64())), tuple(files), storage_options,
                       table=table)


def publish(staged: StagedFiles, attempts: int | None = None) -> CommitResult:
    """Make staged files visible in one Delta commit on the driver, unless the key is already there.

    The commit goes through :func:`falkirk.policies.store.commits.commit_once`, which checks
    the key again against the table as it is now, so that an attempt that staged its files
    before another attempt committed (a zombie) changes nothing. A commit racing this one
    is caught by Delta's own conflict check, and the loser tries again on the table as it
    is then (at most ``attempts`` times): if the winner committed the same key, the loser
    writes nothing. Epochs that run side by side all find no table at first and race to
    create it; the losers commit into the winner's table.
    """
    if staged.done is not None:
        return staged.done
    key, options = staged.key, staged.storage_options
    now = int(time.time() * 1000)
    actions = [AddAction(path, size, {EPOCH: str(key.epoch)}, now, True, json.dumps({"numRecords": rows}))
               for path, size, rows in staged.files]

    def write(table: DeltaTable | None, properties: CommitProperties) -> None:
        if table is None:
            create_table_with_add_actions(staged.uri, Schema.from_arrow(staged.schema), actions, mode="error",
                                          partition_by=[EPOCH], configuration=TABLE_PROPERTIES,
                                          storage_options=options,
                                          commit_properties=properties)
        else:
            table.create_write_transaction(list(actions), mode="overwrite", schema=staged.schema, partition_by=[EPOCH],
                                           partition_filters=[(EPOCH, "=", str(key.epoch))],
                                           commit_properties=properties)

    return commit_once(staged.uri, key, write, staged.rows, options, table=staged.table, attempts=attempts)


DRIVER_READ_MAX_BYTES = 16 * 1024 * 1024
# An epoch on S3 from this size on is read faster by Spark's Delta reader (over s3a://, in the
# Spark server) than by the job's pyarrow and a transfer to the server (`make bench-read`).
SPARK_READ_MIN_BYTES = 1024 * 1024


class ReadPath(enum.Enum):
    """Who reads an epoch's files (:func:`read_path`)."""

    SPARK_PARQUET = "Spark's Parquet reader"  # a local table: its files by path
    DRIVER = "the job, in one request"  # pyarrow in the job's process, handed to Spark
    EXECUTORS = "the executors, with pyarrow"  # mapInArrow over the epoch's files
    SPARK_DELTA = "Spark's Delta reader"  # format("delta") over s3a://, pruned to the epoch


def read_path(uri: str, size: int, *, on_driver: bool = False, spark_reads: bool = False,
              driver_read_max_bytes: int = DRIVER_READ_MAX_BYTES,
              spark_read_min_bytes: int = SPARK_READ_MIN_BYTES) -> ReadPath:
    """The faster way to read an epoch of ``size`` bytes of the table at ``uri``, given whether
    it must be read in the job's own process (``on_driver``: the worker's scratch disk) and
    whether the Spark server reads the store itself (``spark_reads``).

    >>> read_path("/data/store/t", 50_000_000).name, read_path("/scratch/t", 10, on_driver=True).name
    ('SPARK_PARQUET', 'DRIVER')
    >>> [read_path("s3://b/t", n).name for n in (400_000, 4_000_000, 40_000_000)]
    ['DRIVER', 'DRIVER', 'EXECUTORS']
    >>> [read_path("s3://b/t", n, spark_reads=True).name for n in (400_000, 4_000_000, 40_000_000)]
    ['DRIVER', 'SPARK_DELTA', 'SPARK_DELTA']
    """
    if on_driver:
        return ReadPath.DRIVER
    if not uri.startswith("s3://"):
        return ReadPath.SPARK_PARQUET
    if spark_reads and size >= spark_read_min_bytes:
        return ReadPath.SPARK_DELTA
    return ReadPath.DRIVER if size <= driver_read_max_bytes else ReadPath.EXECUTORS


def epoch_bytes(table: DeltaTable, epoch: int) -> int:
    """The size of epoch ``epoch``'s files in ``table``, as its Delta log records them."""
    actions = pa.table(table.get_add_actions(flatten=True))
    return pc.sum(actions.filter(pc.equal(actions.column(f"partition.{EPOCH}"), int(epoch)))
                  .column("size_bytes")).as_py() or 0


def read_frame(spark: SparkSession, uri: str, key: CommitKey, rows: int | None,
               storage_options: dict[str, str] | None = None,
               driver_read_max_bytes: int = DRIVER_READ_MAX_BYTES, on_driver: bool = False,
               spark_reads: bool = False) -> DataFrame:
    """The rows that commit ``key`` wrote to the Delta table at ``uri`` (its epoch ``key.epoch``),
    as a DataFrame without the ``epoch`` column.

    ``rows`` is the row count the ledger recorded for that commit. The epoch is read only
    while the table still holds exactly that commit: a table that is gone, a commit that was
    never made, or a partition deleted since (garbage collection) raises
    :class:`~falkirk.policies.store.commits.EpochTableError` naming the table and the epoch, never an
    empty DataFrame that a job would take for an epoch without data.

    The driver reads the Delta log with delta-rs: which files make up the epoch, their sizes,
    the schema. Then :func:`read_path` chooses who reads the data: Spark's own Parquet reader
    for a local path; for ``s3://``, Spark's Delta reader at the version just checked when the
    Spark server reaches the store itself (``spark_reads``) and the epoch is large, else pyarrow,
    on the driver in one request for an epoch under ``driver_read_max_bytes`` (a typical state
    table), in the executors for a larger one. ``on_driver`` reads on the driver whatever the
    size: a table on the driver's own local disk (the scratch tier), which executors on other
    hosts cannot see.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    epoch = key.epoch
    table = open_table(uri, storage_options)
    why = missing_commit(table, uri, key, rows)
    if table is None or why is not None:
        raise EpochTableError(why or f"no Delta table at {uri}")
    gone = lost_files(table, epoch, storage_options)
    if gone:
        raise FilesLost(f"{uri} epoch {epoch}: its log names {len(gone)} data files that are gone (e.g. {gone[0]}): "
                        f"the table's files were lost while its _delta_log was kept")
    schema = pa.schema([f for f in pa.schema(table.schema().to_arrow()) if f.name != EPOCH])
    spark_schema = from_arrow_schema(schema)
    files = table.file_uris(file_pruning_predicate=[(EPOCH, "=", str(int(epoch)))])
    if not files:
        return spark.createDataFrame([], spark_schema)
    size = epoch_bytes(table, epoch) if uri.startswith("s3://") and not on_driver else 0
    path = read_path(uri, size, on_driver=on_driver, spark_reads=spark_reads,
                     driver_read_max_bytes=driver_read_max_bytes)
    if path is ReadPath.SPARK_PARQUET:
        return spark.read.schema(spark_schema).parquet(*files)
    if path is ReadPath.DRIVER:
        return on_the_executors(spark, scan(table, where={EPOCH: int(epoch)}).drop_columns([EPOCH]).cast(schema),
                                spark_schema)
    if path is ReadPath.SPARK_DELTA:  # the version checked above, whatever commits since
        frame = spark.read.format("delta").option("versionAsOf", table.version()).load(spark_uri(uri))
        return frame.where(f"`{EPOCH}` = {int(epoch)}").select(
            *(frame[f.name].cast(f.dataType) for f in spark_schema.fields))
    # One partition per file, up to the shuffle width: no SparkContext, so it also runs on Spark Connect.
    n = min(len(files), int(spark.conf.get("spark.sql.shuffle.partitions") or 4))
    paths = spark.createDataFrame([(f,) for f in files], "path string").repartition(n)
    return paths.mapInArrow(_file_reader(uri, schema, storage_options), spark_schema)


# Rows read on the driver beyond this many are handed to the executors (:func:`on_the_executors`);
# a small relation (a table of a few rows) stays inline, where it costs no Spark job of its own.
INLINE_MAX_ROWS = 5_000


def on_the_executors(spark: SparkSession, rows: pa.Table, schema: StructType, *,
                     inline_max_rows: int = INLINE_MAX_ROWS) -> DataFrame:
    """``rows``, which the driver read, as a DataFrame the executors hold.

    Rows handed to Spark as they are (a local relation) are part of every plan built on
    them: each later query and ``persist`` sends them to the Spark server again, which
    converts them again, so an iterative job's epochs grew slower as its state grew. Held by
    the executors (a local checkpoint, replicated to a second executor on a cluster), later
    plans name them instead. Losing every copy fails the job, whose retry reads the table
    again. At most ``inline_max_rows`` rows stay a local relation (``make bench-read``
    compares both ways).
    """
    from pyspark import StorageLevel

    frame = spark.createDataFrame(rows, schema)
    if rows.num_rows <= inline_max_rows:
        return frame
    local = str(spark.conf.get("spark.master", "local") or "local").startswith("local")
    return frame.localCheckpoint(eager=True,
                                 storageLevel=StorageLevel.MEMORY_AND_DISK if local else StorageLevel.MEMORY_AND_DISK_2)


def _file_reader(uri: str, schema: pa.Schema, storage_options: dict[str, str] | None):
    """The function each executor runs over its share of an epoch's file paths."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs, _ = filesystem(uri, storage_options)
        for batch in batches:
            for path in batch.column(0).to_pylist():
                located = path[len("s3://"):] if path.startswith("s3://") else path.removeprefix("file://")
                for part in pq.ParquetFile(fs.open_input_file(located)).iter_batches():
                    yield pa.RecordBatch.from_arrays([part.column(f.name).cast(f.type) for f in schema],
                                                     schema=schema)

    return read


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("not in a Spark task: the partition is known on an executor only")
    return context.partitionId()


def _file_writer(uri: str, epoch: int, schema: pa.Schema, storage_options: dict[str, str] | None):
    """Writes one partition's Arrow batches as one file (on an executor, or on the driver)."""
    attempt = uuid.uuid4().hex  # one per commit attempt: a retry never overwrites a file in use

    def write(batches: Iterator[pa.RecordBatch], partition: int) -> Iterator[pa.RecordBatch]:
        relative = f"{EPOCH}={epoch}/part-{attempt}-{partition:05d}.parquet"
        fs, root = filesystem(uri, storage_options)
        writer = None
        rows = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None:
                fs.create_dir(f"{root}/{EPOCH}={epoch}", recursive=True)
                writer = pq.ParquetWriter(f"{root}/{relative}", schema, filesystem=fs)
            writer.write_batch(batch.cast(schema))
            rows += batch.num_rows
        if writer is None:
            return  # an empty partition adds no file
        writer.close()
        size = fs.get_file_info(f"{root}/{relative}").size
        yield pa.RecordBatch.from_pylist([{"path": relative, "size": size, "rows": rows}],
                                         schema=pa.schema([("path", pa.string()), ("size", pa.int64()),
                                                           ("rows", pa.int64())]))

    return write


