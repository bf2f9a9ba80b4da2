"""Where the project's Delta tables live: a durable root and a scratch root.

The durable root is a local path or an ``s3://`` URI (AWS S3, MinIO, any S3-compatible
server); the scratch root is a local directory standing for a worker's volatile disk.
Both come from the environment so that Airflow components, ``spark-submit``'ed drivers
and tests agree on them:

* ``FALKIRK_STORE_URI``: the durable root (required).
* ``FALKIRK_SCRATCH_URI``: the scratch root (default: ``<durable root>/../scratch`` for a
  local durable root; required when the durable root is remote).
* ``FALKIRK_WORKER``: on a deployment of several workers, the name of this one. Its scratch
  tables then live under ``<scratch root>/<worker>/``, so that a ledger row names the worker's
  disk in its URIs and a lost worker is exactly the tables under that directory.
* ``FALKIRK_SPARK_READS_STORE``: ``true`` when the jobs' Spark server has Delta's jars and
  reaches the durable store itself (``s3a://`` settings, :meth:`StoreConfig.spark_conf`): large
  epochs of inputs on S3 are then read by Spark's Delta reader
  (:func:`falkirk.spark_jobs.delta_sink.read_path`).
* for ``s3://``: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_REGION`` and ``AWS_ALLOW_HTTP`` as delta-rs reads them.

>>> store = StoreConfig(durable_uri="/data/falkirk", scratch_uri="/tmp/falkirk-scratch")
>>> store.table_uri(Tier.DURABLE, "orders", "aggregate", "state")
'/data/falkirk/orders/aggregate/state'
>>> store.ledger_uri
'/data/falkirk/_falkirk/ledger'
>>> StoreConfig("/data/falkirk", "/mnt/scratch", worker="worker-a").table_uri(Tier.SCRATCH, "orders", "aggregate", "state")
'/mnt/scratch/worker-a/orders/aggregate/state'
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from falkirk.policies.regimes import Tier
from falkirk.policies.workers import WORKER_ENV

STORE_RETRY_ENV = "FALKIRK_STORE_RETRY_SECONDS"

STORE_ENV = "FALKIRK_STORE_URI"
SCRATCH_ENV = "FALKIRK_SCRATCH_URI"
SPARK_READS_ENV = "FALKIRK_SPARK_READS_STORE"
_S3_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


class StoreError(ValueError):
    """The store is configured wrongly; the message names the setting and the fix."""


@dataclass(frozen=True)
class StoreConfig:
    """The durable and scratch roots and the options delta-rs needs to reach them."""

    durable_uri: str
    scratch_uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict)
    # The worker this process runs on, when there are several (``FALKIRK_WORKER``); None: one machine.
    worker: str | None = None
    # Whether the jobs' Spark server reads the durable store with Delta's own reader (``FALKIRK_SPARK_READS_STORE``).
    spark_reads: bool = False

    def __post_init__(self) -> None:
        if self.worker is not None and not _NAME.fullmatch(self.worker):
            raise StoreError(f"{WORKER_ENV}={self.worker!r} cannot name a worker's scratch directory: use letters, "
                             f"digits, '_', '-' and '.'")
        for name, uri in (("durable_uri", self.durable_uri), ("scratch_uri", self.scratch_uri)):
            if not uri:
                raise StoreError(f"StoreConfig.{name} is empty; give a local path or an s3:// URI")
            if "://" in uri and not uri.startswith(("s3://", "file://")):
                raise StoreError(f"StoreConfig.{name}={uri!r}: only local paths and s3:// URIs are supported")
        object.__setattr__(self, "durable_uri", _normalise(self.durable_uri))
        object.__setattr__(self, "scratch_uri", _normalise(self.scratch_uri))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StoreConfig:
        """Read the configuration from ``FALKIRK_*`` and ``AWS_*`` environment variables."""
        env = os.environ if environ is None else environ
        durable = env.get(STORE_ENV, "").strip()
        if not durable:
            raise StoreError(
                f"{STORE_ENV} is not set: set it to a local directory or an s3:// URI for the durable store"
            )
        scratch = env.get(SCRATCH_ENV, "").strip()
        if not scratch:
            if _is_remote(durable):
                raise StoreError(f"{SCRATCH_ENV} is not set: with a remote {STORE_ENV}, name a local scratch directory")
            scratch = str(Path(durable).parent / "scratch")
        options = {k: env[k] for k in _S3_ENV if env.get(k)} if _is_remote(durable) else {}
        reads = env.get(SPARK_READS_ENV, "").strip().lower()
        if reads not in ("", "true", "false", "1", "0"):
            raise StoreError(f"{SPARK_READS_ENV}={reads!r:.40}: say true (the jobs' Spark server reads the store with "
                             f"Delta's jars and its own S3 settings) or false")
        return cls(durable_uri=durable, scratch_uri=scratch, storage_options=options,
                   worker=env.get(WORKER_ENV, "").strip() or None, spark_reads=reads in ("true", "1"))

    def env(self) -> dict[str, str]:
        """The environment variables that reproduce this configuration in another process."""
        worker = {WORKER_ENV: self.worker} if self.worker else {}
        reads = {SPARK_READS_ENV: "true"} if self.spark_reads else {}
        return {STORE_ENV: self.durable_uri, SCRATCH_ENV: self.scratch_uri, **self.storage_options, **worker, **reads}

    def root(self, tier: Tier) -> str:
        """A tier's root: for scratch, this worker's own directory when workers are named."""
        if tier is Tier.DURABLE:
            return self.durable_uri
        return f"{self.scratch_uri}/{self.worker}" if self.worker else self.scratch_uri

    def spark_conf(self) -> dict[str, str]:
        """The Hadoop settings with which Spark's own readers reach this store (:func:`s3a_conf`
        of its storage options), empty for a local durable root.

        >>> StoreConfig("/data/falkirk", "/tmp/s").spark_conf()
        {}
        """
        return s3a_conf(self.storage_options) if _is_remote(self.durable_uri) else {}

    def worker_scratch(self, worker: str) -> str:
        """The scratch directory of ``worker`` (its local disk's share of the scratch root).

        >>> StoreConfig("/data/falkirk", "/mnt/scratch").worker_scratch("worker-b")
        '/mnt/scratch/worker-b'
        """
        if not _NAME.fullmatch(worker or ""):
            raise StoreError(f"worker {worker!r:.80}: name a worker (letters, digits, '_', '-' and '.')")
        return f"{self.scratch_uri}/{worker}"

    def is_scratch(self, uri: str) -> bool:
        """Whether ``uri`` lies in the scratch tier (any worker's)."""
        return isinstance(uri, str) and not _is_remote(uri) and _normalise(uri).startswith(
            self.scratch_uri.rstrip("/") + "/")

    def table_uri(self, tier: Tier, dag_id: str, task_id: str, table: str, map_index: int = -1) -> str:
        """The URI of one of a task's tables (``output``, ``state``) in ``tier``; partition
        ``map_index`` of a partitioned task keeps its own, under ``partition-<map_index>``.

        >>> StoreConfig("/data/falkirk", "/tmp/s").table_uri(Tier.DURABLE, "clicks", "tally", "state", map_index=2)
        '/data/falkirk/clicks/tally/partition-2/state'
        """
        for label, part in (("dag_id", dag_id), ("task_id", task_id), ("table", table)):
            if not _NAME.fullmatch(part):
                raise StoreError(f"{label}={part!r} cannot name a table: use letters, digits, '_', '-' and '.'")
        partition = f"/partition-{map_index}" if map_index is not None and map_index >= 0 else ""
        return f"{self.root(tier)}/{dag_id}/{task_id}{partition}/{table}"

    def is_table_of(self, uri: str, dag_id: str, task_id: str, table: str, map_index: int = -1) -> bool:
        """Whether ``uri`` is where the store keeps that table: in the durable tier, or in the
        scratch tier of this process or of any worker (a ledger row written on a worker names
        that worker's disk).

        >>> store = StoreConfig("/data/falkirk", "/mnt/scratch")
        >>> store.is_table_of("/mnt/scratch/worker-b/orders/aggregate/state", "orders", "aggregate", "state")
        True
        >>> store.is_table_of("/mnt/scratch/worker-b/orders/report/state", "orders", "aggregate", "state")
        False
        >>> store.is_table_of("/mnt/scratch/../orders/aggregate/state", "orders", "aggregate", "state")
        False
        """
        if uri in {self.table_uri(tier, dag_id, task_id, table, map_index) for tier in Tier}:
            return True
        prefix = self.scratch_uri.rstrip("/") + "/"
        tail = replace(self, worker=None).table_uri(Tier.SCRATCH, dag_id, task_id, table, map_index)[len(prefix):]
        if not isinstance(uri, str) or not uri.startswith(prefix) or not uri.endswith("/" + tail):
            return False
        worker = uri[len(prefix):-len(tail) - 1]
        return bool(_NAME.fullmatch(worker)) and worker not in (".", "..")

    @property
    def ledger_uri(self) -> str:
        """The ledger table, always in the durable store."""
        return f"{self.durable_uri}/_falkirk/ledger"

    def control_uri(self, name: str) -> str:
        """One of Falkirk's own tables beside the ledger (``invalidations``, ``recoveries``)."""
        return f"{self.durable_uri}/_falkirk/{name}"

    def contains(self, uri: str) -> bool:
        """Whether ``uri`` lies strictly inside the durable or the scratch root (``..`` resolved).

        Everything the project reads or deletes is checked with this first, whatever a ledger
        row or a request says.

        >>> store = StoreConfig("/data/falkirk", "/tmp/scratch")
        >>> store.contains("/data/falkirk/orders/ingest/output"), store.contains("/tmp/scratch/../etc")
        (True, False)
        >>> store.contains("/data/falkirk"), store.contains("/data/falkirk-other/x")
        (False, False)
        """
        if not isinstance(uri, str) or not uri or "\x00" in uri:
            return False
        if "://" in uri and not uri.startswith(("s3://", "file://")):
            return False
        target = _normalise(uri)
        if _is_remote(target) and any(part in ("..", ".") for part in target[len("s3://"):].split("/")):
            return False
        return any(target.startswith(root.rstrip("/") + "/") and len(target) > len(root.rstrip("/")) + 1
                   for root in (self.durable_uri, self.scratch_uri))

    def scratch_location(self, location: str) -> str:
        """``location`` normalised, if it is the scratch root or a directory inside it; else
        :class:`StoreError` naming the root. A lost scratch location names only scratch.

        >>> StoreConfig("/data/falkirk", "/tmp/scratch").scratch_location("/tmp/scratch/orders/")
        '/tmp/scratch/orders'
        >>> StoreConfig("/data/falkirk", "/tmp/scratch").scratch_location("/tmp/scratch/../etc")
        Traceback (most recent call last):
        ...
        falkirk.policies.store.config.StoreError: '/tmp/scratch/../etc' is not the scratch root /tmp/scratch or a directory inside it; name a directory under it
        """
        if not isinstance(location, str) or not location.strip() or "\x00" in location or len(location) > 4096:
            raise StoreError(f"{location!r:.80}: name the scratch directory that was lost")
        if location.startswith("s3://") or ("://" in location and not location.startswith("file://")):
            raise StoreError(f"{location!r}: scratch is a local directory ({self.scratch_uri})")
        normal = _normalise(location)
        if not (normal == self.scratch_uri or normal.startswith(self.scratch_uri.rstrip("/") + "/")):
            raise StoreError(f"{location!r} is not the scratch root {self.scratch_uri} or a directory inside it; "
                             f"name a directory under it")
        return normal

    def options_for(self, uri: str) -> dict[str, str] | None:
        """delta-rs ``storage_options`` for ``uri`` (``None`` for local paths): the configured
        ones, and :func:`request_limits` unless they set those keys themselves.

        >>> StoreConfig("s3://b/store", "/tmp/scratch").options_for("s3://b/store/t")
        {'timeout': '30s', 'retry_timeout': '60s'}
        >>> StoreConfig("/tmp/store", "/tmp/scratch").options_for("/tmp/store/t") is None
        True
        """
        if not _is_remote(uri):
            return None
        return {**request_limits(), **self.storage_options}


def store_retry_seconds(environ: Mapping[str, str] | None = None) -> float:
    """How long a commit keeps asking a store that does not answer (``FALKIRK_STORE_RETRY_SECONDS``,
    default 60, at most 3600).

    >>> store_retry_seconds({}), store_retry_seconds({"FALKIRK_STORE_RETRY_SECONDS": "5"})
    (60.0, 5.0)
    """
    raw = (os.environ if environ is None else environ).get(STORE_RETRY_ENV, "").strip()
    try:
        seconds = float(raw) if raw else 60.0
    except ValueError:
        raise ValueError(f"{STORE_RETRY_ENV}={raw!r:.40}: give seconds, from 0 to 3600") from None
    if not 0 <= seconds <= 3600:
        raise ValueError(f"{STORE_RETRY_ENV}={raw!r:.40}: give seconds, from 0 to 3600")
    return seconds


def request_limits(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The object store client's limits that keep a store which accepts connections and never
    answers from blocking a job: each request gives up after ``timeout`` (30 s, less when the
    retry budget is shorter, never under 5 s) and the client's own retries stop
    ``FALKIRK_STORE_RETRY_SECONDS`` after the first try (its default would retry for 3 minutes).
    Then the commit's own retry (:func:`falkirk.policies.store.commits.retry_lost_races`) asks
    again within the same budget and names the store that did not answer.

    >>> request_limits({"FALKIRK_STORE_RETRY_SECONDS": "4"})
    {'timeout': '5s', 'retry_timeout': '4s'}
    """
    budget = store_retry_seconds(environ)
    return {"timeout": f"{int(min(30, max(5, budget)))}s", "retry_timeout": f"{int(max(1, budget))}s"}


def s3a_conf(storage_options: Mapping[str, str]) -> dict[str, str]:
    """The Hadoop settings with which Spark's own readers (``format("delta")`` over ``s3a://``,
    :func:`spark_uri`) reach the S3 store that ``storage_options`` (delta-rs's) name: given to the
    Spark server that reads it (``--conf``). The AWS SDK's own chain finds the credentials where
    the options name none.

    >>> s3a_conf({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1"})  # doctest: +NORMALIZE_WHITESPACE
    {'spark.hadoop.fs.s3a.endpoint': 'http://127.0.0.1:9000', 'spark.hadoop.fs.s3a.path.style.access': 'true',
     'spark.hadoop.fs.s3a.connection.ssl.enabled': 'false', 'spark.hadoop.fs.s3a.endpoint.region': 'eu-west-1'}
    """
    conf: dict[str, str] = {}
    if endpoint := storage_options.get("AWS_ENDPOINT_URL"):  # an S3-compatible server: its URL, the bucket in the path
        conf |= {"fs.s3a.endpoint": endpoint, "fs.s3a.path.style.access": "true",
                 "fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https://")).lower()}
    for option, key in (("AWS_REGION", "fs.s3a.endpoint.region"), ("AWS_ACCESS_KEY_ID", "fs.s3a.access.key"),
                        ("AWS_SECRET_ACCESS_KEY", "fs.s3a.secret.key")):
        if storage_options.get(option):
            conf[key] = storage_options[option]
    return {f"spark.hadoop.{key}": value for key, value in conf.items()}


def spark_uri(uri: str) -> str:
    """``uri`` as Spark's Hadoop file systems name it: ``s3a://`` (S3A) for ``s3://``, a local
    path unchanged.

    >>> spark_uri("s3://falkirk/store/orders/aggregate/state"), spark_uri("/data/falkirk/orders/x")
    ('s3a://falkirk/store/orders/aggregate/state', '/data/falkirk/orders/x')
    """
    return "s3a://" + uri[len("s3://"):] if _is_remote(uri) else uri


def _is_remote(uri: str) -> bool:
    return uri.startswith("s3://")


def _normalise(uri: str) -> str:
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if _is_remote(uri):
        return uri.rstrip("/")
    return str(Path(uri).expanduser().resolve())
