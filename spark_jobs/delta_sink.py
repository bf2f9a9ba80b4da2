"""Write one epoch of a Spark DataFrame into a Delta table: files on the executors, one commit on the driver.

No epoch is collected to the driver. Each executor writes its partition as a Parquet file
into the table's ``epoch=<t>/`` directory (with pyarrow, to a local path or S3-compatible
storage) and returns only the file's path, size and row count. The driver then makes all
the files visible in **one** Delta commit (delta-rs) that replaces exactly that epoch's
partition and records the (task, epoch) app transaction, as
:func:`policies.epoch_tables.commit_epoch` does for data it holds itself.

Files written by an attempt that dies before the commit are never referenced by the
Delta log, so readers never see them (a later ``vacuum`` deletes them); the next attempt
writes new files and commits those.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Iterator
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Schema, Transaction
from deltalake.transaction import AddAction, create_table_with_add_actions

from policies.epoch_tables import EPOCH, CommitKey, CommitResult, already_committed, count_epoch, open_table
from spark_jobs.faults import crash_point

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

FILES_SCHEMA = "path string, size long, rows long"


def commit_frame(frame: "DataFrame", uri: str, key: CommitKey,
                 storage_options: dict[str, str] | None = None) -> CommitResult:
    """Replace epoch ``key.epoch`` of the table at ``uri`` with ``frame``'s rows, at most once per key."""
    table = open_table(uri, storage_options)
    if already_committed(table, key):
        return CommitResult(uri, table.version(), count_epoch(table, key.epoch), applied=False)

    data = frame.drop(EPOCH) if EPOCH in frame.columns else frame
    schema = data.limit(0).toArrow().schema  # Spark's Arrow types, fixed on the driver
    files = data.mapInArrow(_file_writer(uri, key.epoch, schema, storage_options), FILES_SCHEMA).collect()
    crash_point(key.task_id, key.epoch, "after-files")

    now = int(time.time() * 1000)
    actions = [
        AddAction(f.path, f.size, {EPOCH: str(key.epoch)}, now, True, json.dumps({"numRecords": f.rows}))
        for f in files
    ]
    full_schema = schema.append(pa.field(EPOCH, pa.int64()))
    props = CommitProperties(
        app_transactions=[Transaction(key.app_id, key.incarnation)],
        custom_metadata={"falkirk.app_id": key.app_id, "falkirk.incarnation": str(key.incarnation)},
    )
    if table is None:
        create_table_with_add_actions(uri, Schema.from_arrow(full_schema), actions, mode="error",
                                      partition_by=[EPOCH], storage_options=storage_options,
                                      commit_properties=props)
    else:
        table.create_write_transaction(actions, mode="overwrite", schema=full_schema, partition_by=[EPOCH],
                                       partition_filters=[(EPOCH, "=", str(key.epoch))], commit_properties=props)
    after = DeltaTable(uri, storage_options=storage_options)
    return CommitResult(uri, after.version(), sum(f.rows for f in files), applied=True)


def _file_writer(uri: str, epoch: int, schema: pa.Schema, storage_options: dict[str, str] | None):
    """The function each executor runs over its partition's Arrow batches."""
    attempt = uuid.uuid4().hex  # one per commit attempt: a retry never overwrites a file in use

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        relative = f"{EPOCH}={epoch}/part-{attempt}-{TaskContext.get().partitionId():05d}.parquet"
        fs, root = _filesystem(uri, storage_options)
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


def _filesystem(uri: str, storage_options: dict[str, str] | None):
    """A pyarrow filesystem and the table's root path in it (local, or S3-compatible)."""
    from pyarrow import fs

    if not uri.startswith("s3://"):
        return fs.LocalFileSystem(), uri
    opts = storage_options or {}
    endpoint = opts.get("AWS_ENDPOINT_URL")
    parsed = urlparse(endpoint) if endpoint else None
    s3 = fs.S3FileSystem(
        access_key=opts.get("AWS_ACCESS_KEY_ID"),
        secret_key=opts.get("AWS_SECRET_ACCESS_KEY"),
        region=opts.get("AWS_REGION", "us-east-1"),
        endpoint_override=parsed.netloc if parsed else None,
        scheme=parsed.scheme if parsed else "https",
    )
    return s3, uri[len("s3://"):]
