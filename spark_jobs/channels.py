"""Edges between processes that run side by side: Delta tables the sender writes to (one
commit per send) and the receiver polls. Local directories only.

>>> import tempfile, pyarrow as pa
>>> uri = tempfile.mkdtemp() + "/edge"
>>> schema = pa.schema([("epoch", pa.int64()), ("value", pa.int64())])
>>> append(uri, [{"epoch": 1, "value": 7}], schema)
>>> rows(uri, epoch=1), read(uri, epoch=2) is None
([{'epoch': 1, 'value': 7}], True)
>>> replace(uri, pa.Table.from_pylist([{"epoch": 1, "value": 8}], schema=schema), epoch=1); rows(uri)
[{'epoch': 1, 'value': 8}]
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import write_deltalake

from falkirk.policies.store.commits import open_table, scan

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

WAIT_SECONDS = 300.0


def read(uri: str, **where: int | str) -> pa.Table | None:
    """The rows whose columns equal ``where``, or ``None`` while there are none."""
    table = open_table(uri)
    if table is None:
        return None
    found = scan(table, where=where)
    return found if found.num_rows else None


def rows(uri: str, **where: int | str) -> list[dict]:
    """The rows whose columns equal ``where``, as dicts (none yet: an empty list)."""
    found = read(uri, **where)
    return found.to_pylist() if found is not None else []


def append(uri: str, new: list[dict], schema: pa.Schema) -> None:
    """Send ``new`` in one commit."""
    write_deltalake(uri, pa.Table.from_pylist(new, schema=schema), mode="append")


def replace(uri: str, new: pa.Table, **where: int | str) -> None:
    """Replace the rows whose columns equal ``where`` with ``new``, in one commit (a repeat changes nothing)."""
    predicate = " AND ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {int(v)}" for k, v in where.items())
    write_deltalake(uri, new, mode="overwrite", predicate=predicate)


def wait_for(uri: str, who: str, timeout: float = WAIT_SECONDS, **where: int | str) -> pa.Table:
    """The rows equal to ``where`` once their commit lands (how a receiver reads its edge)."""
    deadline = time.monotonic() + timeout
    while (found := read(uri, **where)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{who}: nothing where {where} in {uri} after {timeout:.0f} s")
        time.sleep(0.05)
    return found


def spark_session() -> SparkSession:
    """A Spark Connect session when ``SPARK_REMOTE`` is set, else a local one."""
    from pyspark.sql import SparkSession

    remote = os.environ.get("SPARK_REMOTE")
    builder = SparkSession.builder.remote(remote) if remote else SparkSession.builder.master("local[1]")
    return builder.getOrCreate()
