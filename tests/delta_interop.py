"""Every Delta table a run left in a store, opened by Spark's own Delta reader and compared with
what delta-rs reads: rows, time travel to an epoch's commit, and the commit info that
``DESCRIBE HISTORY`` shows.

The readers are Spark Connect sessions on servers devstack starts (:mod:`devstack.spark_packages`
loads Delta and S3A into them): a local one for local tables, the cluster's (started with the
S3 server's :func:`~falkirk.policies.store.config.s3a_conf`) for ``s3a://``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from deltalake import DeltaTable

from falkirk.policies.store import StoreConfig
from falkirk.policies.store.commits import scan
from falkirk.policies.store.config import spark_uri


@contextmanager
def connect_session(url: str) -> Iterator[Any]:
    """A new Spark Connect session on the server at ``url``, stopped after: made by Connect's own
    builder, which (unlike ``SparkSession.builder.remote``) does not refuse while a classic
    session runs in the same process (the suite's in-process ``spark`` fixture)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(url).create()
    try:
        yield session
    finally:
        session.stop()


def tables_under(root: str, storage_options: dict[str, str] | None = None) -> list[str]:
    """The URI of every Delta table under ``root`` (a local directory or ``s3://bucket/prefix``):
    each directory holding a ``_delta_log/``."""
    if root.startswith("s3://"):
        bucket, _, prefix = root[len("s3://"):].partition("/")
        options = storage_options or {}
        client = boto3.client("s3", endpoint_url=options.get("AWS_ENDPOINT_URL"),
                              region_name=options.get("AWS_REGION"),
                              aws_access_key_id=options.get("AWS_ACCESS_KEY_ID"),
                              aws_secret_access_key=options.get("AWS_SECRET_ACCESS_KEY"))
        found = set()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
            for item in page.get("Contents", []):
                table, marker, _ = item["Key"].partition("/_delta_log/")
                if marker:
                    found.add(f"s3://{bucket}/{table}")
        return sorted(found)
    return sorted(str(log.parent) for log in Path(root).rglob("_delta_log") if log.is_dir())


def _canonical(rows: list[dict]) -> list[str]:
    """Rows as sorted JSON lines; an instant in UTC, however the reader zones it."""
    def plain(value: object) -> object:
        if isinstance(value, datetime):
            return (value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if isinstance(value, bytes | bytearray):
            return value.hex()
        return value
    return sorted(json.dumps(plain(row), sort_keys=True, default=str) for row in rows)


@dataclass
class Interop:
    """What :func:`compare` found, table by table."""

    tables: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    differing: dict[str, str] = field(default_factory=dict)
    time_travelled: dict[str, int] = field(default_factory=dict)  # table -> the version read back
    epochs_in_history: dict[str, set[int]] = field(default_factory=dict)


def compare(spark, uris: list[str], store: StoreConfig, threads: int = 4) -> Interop:  # noqa: ANN001 (a Connect session)
    """Read each table with ``spark`` and with delta-rs; for a table whose commits record Falkirk
    epochs, read the version of its latest epoch commit back with ``versionAsOf`` too. A
    session's time zone is UTC, so instants compare as instants. ``threads`` tables are read at
    once: a Connect session takes queries from several threads, and each table's reads wait
    mostly on the store and on the server's snapshot of its log."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    out = Interop(tables=list(uris))
    with ThreadPoolExecutor(threads) as pool:
        for uri, (rows, differing, epochs, version) in zip(uris, pool.map(lambda u: _compare_one(spark, u, store), uris)):
            out.rows[uri] = rows
            if differing is not None:
                out.differing[uri] = differing
            if epochs is not None:
                out.epochs_in_history[uri] = epochs
            if version is not None:
                out.time_travelled[uri] = version
    return out


def _compare_one(spark, uri: str, store: StoreConfig  # noqa: ANN001 (a Connect session)
                 ) -> tuple[int, str | None, set[int] | None, int | None]:
    """One table for :func:`compare`: (rows, how it differs or None, the epochs its history
    records, the version read back)."""
    table = DeltaTable(uri, storage_options=store.options_for(uri))
    ours = _canonical(scan(table).to_pylist())
    theirs = _canonical(spark.read.format("delta").load(spark_uri(uri)).toArrow().to_pylist())
    if ours != theirs:
        return len(ours), f"delta-rs reads {len(ours)} rows, Spark {len(theirs)}", None, None
    history = spark.sql(f"DESCRIBE HISTORY delta.`{spark_uri(uri)}`").select("version", "userMetadata").collect()
    epochs = {}
    for row in history:
        about = json.loads(row.userMetadata).get("falkirk", {}) if row.userMetadata else {}
        if "epoch" in about:
            epochs[row.version] = about["epoch"]
    if not epochs:
        return len(ours), None, set(), None
    version = max(epochs)
    table.load_as_version(version)
    past = _canonical(scan(table).to_pylist())
    read = spark.read.format("delta").option("versionAsOf", version).load(spark_uri(uri))
    if past != _canonical(read.toArrow().to_pylist()):
        return len(ours), f"version {version} differs", set(epochs.values()), None
    return len(ours), None, set(epochs.values()), version
