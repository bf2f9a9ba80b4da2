"""Epoch-partitioned Delta tables with atomic, idempotent per-epoch commits.

Every table the project owns (a task's outputs, its state, the ledger) holds rows
keyed by ``epoch``. One epoch of one task is written in **one** Delta commit that
replaces exactly that epoch's rows (``overwrite`` with the predicate ``epoch = t``), and
the commit carries a Delta app transaction whose id names the (task, epoch) and whose
version is the incarnation. Before writing, the committer reads the table's recorded
transaction version: if this incarnation of this (task, epoch) is already in the table,
the commit is skipped and the table is left exactly as it was. A retried, re-run or
zombie attempt therefore cannot apply an epoch twice, and a crash between two tables'
commits is repaired by simply running the task again. A job's commit also names what it
was computed from (:func:`inputs_fingerprint`): tables an attempt committed before dying,
from inputs a recovery has redone since, are replaced by the retry, not adopted.

The same check settles a commit the store did not answer (the connection was refused,
reset or timed out, perhaps after the commit was applied): the committer asks again, with
back-off, for up to :func:`store_retry_seconds`; then it raises :class:`StoreUnreachable`,
and running the task again, once the store is back, finds out what landed.

>>> import tempfile, pyarrow as pa
>>> uri = tempfile.mkdtemp() + "/t"
>>> key = CommitKey(dag_id="orders", task_id="aggregate", epoch=1)
>>> commit_epoch(uri, pa.table({"epoch": [1, 1], "x": [10, 20]}), key).applied
True
>>> commit_epoch(uri, pa.table({"epoch": [1], "x": [99]}), key).applied   # the same key again
False
>>> read_epoch(uri, 1).column("x").to_pylist()
[10, 20]
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from falkirk.policies.ids import CommitId, OfProcessor
from falkirk.policies.store.config import STORE_RETRY_ENV, store_retry_seconds  # noqa: F401 - part of this module's API

if TYPE_CHECKING:
    from pyarrow import fs as pafs

EPOCH = "epoch"


class EpochTableError(ValueError):
    """Rows that cannot be committed as one epoch; the message names the column and the fix."""


class FilesLost(EpochTableError):
    """A table whose log names data files of an epoch that its storage no longer holds (a disk
    wiped in part): the epoch is lost, as if the table were gone."""


def plain_reason(cause: BaseException) -> str:
    """``cause``'s message on one line, without the terminal colours delta-rs puts in its errors.

    >>> plain_reason(OSError("Generic S3 error \\x1b[31m↳\\x1b[0m error sending\\n request"))
    'Generic S3 error ↳ error sending request'
    """
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(cause)).split())


class UnreadableTable(Exception):
    """A Delta table that exists but cannot be read: its storage is unreachable, or its
    ``_delta_log`` or a data file is damaged. The message names the table and the way out."""

    def __init__(self, uri: str, cause: BaseException) -> None:
        self.uri = uri
        reason = plain_reason(cause)
        super().__init__(
            f"the Delta table {uri} cannot be read ({type(cause).__name__}: {reason[:400]}). If its storage is "
            f"unreachable, retry once it is back; if its _delta_log or a data file is damaged, restore the table "
            f"from a backup. Nothing was changed")


class StoreUnreachable(Exception):
    """The store did not answer a commit for longer than :func:`store_retry_seconds`. The
    commit may or may not have been applied; either way nothing is half-visible, and running
    the same commit again (the task, or the command) once the store is back finds out."""

    def __init__(self, uri: str, seconds: float | None, cause: BaseException) -> None:
        self.uri = uri
        reason = plain_reason(cause)
        super().__init__(
            f"the store did not answer a commit to {uri or 'a Delta table'}"
            f"{f' for {seconds:.0f}s' if seconds is not None else ''} "
            f"({type(cause).__name__}: {reason[:300]}). The commit may or may not have been applied; nothing is "
            f"half-visible. Run the task (or the command) again once the store is back: it finds what landed and "
            f"never applies it twice")


def unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` says the store did not answer (refused, reset, timed out), as opposed
    to answering no: delta-rs raises ``OSError`` for an object store it cannot reach.

    >>> unanswered(OSError("Generic S3 error: connection error")), unanswered(FileNotFoundError("x"))
    (True, False)
    """
    if isinstance(exc, UnreadableTable):
        exc = exc.__cause__ or exc
    return isinstance(exc, OSError) and not isinstance(
        exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError))


@dataclass(frozen=True, kw_only=True)
class CommitKey(OfProcessor):
    """The idempotency key of one (task, epoch) commit.

    ``incarnation`` counts how often the epoch has been rolled back and redone: a
    recovery that invalidates an epoch re-runs it under the next incarnation, which is
    the only way to replace rows that were already committed.
    """

    dag_id: str
    task_id: str
    epoch: int
    map_index: int = -1
    incarnation: int = 0
    # What the commit was computed from (:func:`inputs_fingerprint`); empty: not checked.
    inputs: str = ""

    @property
    def app_id(self) -> str:
        return f"falkirk/{self.dag_id}/{self.task_id}/{self.map_index}/{self.epoch}"

    @property
    def inputs_app_id(self) -> str:
        """The app transaction that records, beside :attr:`app_id`, what this commit was computed from."""
        return f"{self.app_id}/inputs/{self.inputs}"


def inputs_fingerprint(reads: Iterable[CommitId]) -> str:
    """A short name for the set of commits an epoch was computed from.

    Two attempts at one (task, epoch) under one incarnation usually read the same commits, and
    then either attempt's rows may stand for the epoch. A recovery in between can change what
    the second one reads (an input redone under a new incarnation, a state restored from a
    redone epoch): the fingerprints then differ, and the second attempt's commit replaces the
    first one's instead of adopting it (:func:`already_committed`).

    >>> from falkirk.policies.ids import ProcessorId
    >>> rank = lambda incarnation: CommitId(dag="d", processor=ProcessorId(task="rank"), epoch=10,
    ...                                     incarnation=incarnation)
    >>> inputs_fingerprint([rank(0)]) == inputs_fingerprint([rank(0)])
    True
    >>> inputs_fingerprint([rank(0)]) == inputs_fingerprint([rank(1)])
    False
    >>> len(inputs_fingerprint([]))
    16
    """
    text = "\n".join(sorted(str(r) for r in set(reads)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CommitResult:
    """What a commit did: the table version after it, and whether it wrote anything."""

    uri: str
    version: int
    rows: int
    applied: bool


class OnceKey(Protocol):
    """What makes a commit happen at most once: a :class:`CommitKey`, or the key of a one-off
    append to a shared table (``falkirk.policies.store.control``)."""

    @property
    def app_id(self) -> str: ...
    @property
    def inputs_app_id(self) -> str: ...
    @property
    def epoch(self) -> int: ...
    @property
    def incarnation(self) -> int: ...
    @property
    def inputs(self) -> str: ...


def already_committed(table: DeltaTable | None, key: OnceKey) -> bool:
    """Whether ``table`` already records this incarnation (or a later one) of ``key``'s (task, epoch),
    and, at this incarnation, computed from the same inputs when ``key`` names them.

    delta-rs records app transactions but does not skip a duplicate by itself: every
    committer checks here first. A commit of this incarnation made from other inputs (see
    :func:`computed_from_other_inputs`) is not this commit: it is replaced.

    >>> import tempfile, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> key = CommitKey(dag_id="d", task_id="rank", epoch=11, inputs=inputs_fingerprint([("rank", -1, 10, 0)]))
    >>> _ = commit_epoch(uri, pa.table({"epoch": [11], "x": [1]}), key)
    >>> already_committed(open_table(uri), key)
    True
    >>> from dataclasses import replace
    >>> redone = replace(key, inputs=inputs_fingerprint([("rank", -1, 10, 1)]))
    >>> already_committed(open_table(uri), redone), computed_from_other_inputs(open_table(uri), redone)
    (False, True)
    >>> commit_epoch(uri, pa.table({"epoch": [11], "x": [2]}), redone).applied
    True
    >>> read_epoch(uri, 11).column("x").to_pylist(), already_committed(open_table(uri), redone)
    ([2], True)
    """
    if table is None:
        return False
    recorded = table.transaction_version(key.app_id)
    if recorded is None or recorded < key.incarnation:
        return False
    if recorded > key.incarnation or not key.inputs:
        return True
    return table.transaction_version(key.inputs_app_id) == recorded


def computed_from_other_inputs(table: DeltaTable | None, key: CommitKey) -> bool:
    """Whether ``table`` holds a commit of ``key``'s incarnation made from inputs other than ``key.inputs``:
    an attempt that committed its tables and died before its ledger row, after which a recovery
    changed what this (task, epoch) reads. Such a commit was never acknowledged; it is replaced."""
    if table is None or not key.inputs:
        return False
    return (table.transaction_version(key.app_id) == key.incarnation
            and table.transaction_version(key.inputs_app_id) != key.incarnation)


def epoch_rows(table: DeltaTable) -> dict[int, int]:
    """Rows per epoch in the table's current version, from the Delta log's file statistics
    (no data file is read). An epoch with no file is absent.
    """
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    rows: dict[int, int] = {}
    for epoch, n in zip(actions.get(f"partition.{EPOCH}", []), actions.get("num_records", [])):
        rows[int(epoch)] = rows.get(int(epoch), 0) + int(n or 0)
    return rows


# The commit info key of garbage collection's deletes: the epochs each one removed (a JSON list).
COLLECTED_METADATA = "falkirk.collected_epochs"


def collection_properties(epochs: Iterable[int]) -> CommitProperties:
    """The commit properties of a delete that collects ``epochs``: its commit info names them, so
    that a reader can tell an epoch collected from one lost (:func:`collected_epochs`)."""

    return CommitProperties(custom_metadata={COLLECTED_METADATA: json.dumps(sorted(int(e) for e in epochs))})


def collected_epochs(table: DeltaTable) -> set[int]:
    """The epochs garbage collection deleted from ``table``, as its log records them.

    >>> import tempfile, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> for e in (1, 2, 3):
    ...     _ = commit_epoch(uri, pa.table({"epoch": [e], "x": [e]}), CommitKey(dag_id="d", task_id="t", epoch=e))
    >>> _ = open_table(uri).delete("epoch IN (1, 2)", commit_properties=collection_properties([1, 2]))
    >>> _ = open_table(uri).delete("epoch = 3")  # a delete that is no collection
    >>> sorted(collected_epochs(open_table(uri)))
    [1, 2]
    """

    found: set[int] = set()
    for commit in table.history():
        if COLLECTED_METADATA in commit:
            found |= set(json.loads(commit[COLLECTED_METADATA]))
    return found


def missing_commit(table: DeltaTable | None, uri: str, key: CommitKey, rows: int | None,
                   held: Callable[[], Mapping[int, int]] | None = None) -> str | None:
    """Why ``table`` no longer holds the commit of ``key`` with its ``rows`` rows (``None``: it does).

    The one answer to "is this commit still readable?": the table exists, records this
    incarnation of the (task, epoch) or a later one, and, at this incarnation, its epoch
    holds exactly the rows committed. A deleted partition (garbage collection, a lost file
    listing) keeps the transaction record, so the row count is what tells it apart from an
    epoch that committed no rows. ``held`` gives the table's rows per epoch when the caller
    keeps them (:func:`epoch_rows` of the same table); by default they are read here.

    >>> import tempfile, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> key = CommitKey(dag_id="d", task_id="t", epoch=1)
    >>> _ = commit_epoch(uri, pa.table({"epoch": [1, 1], "x": [10, 20]}), key)
    >>> missing_commit(open_table(uri), uri, key, rows=2) is None
    True
    >>> _ = open_table(uri).delete("epoch = 1")
    >>> missing_commit(open_table(uri), uri, key, rows=2)  # doctest: +ELLIPSIS
    '... epoch 1 holds 0 rows where its commit wrote 2 (deleted since, e.g. by garbage collection)'
    """
    if table is None:
        return f"no Delta table at {uri}"
    recorded = table.transaction_version(key.app_id)
    if recorded is None or recorded < key.incarnation:
        return f"{uri} has no commit of {key.task_id} epoch {key.epoch} (incarnation {key.incarnation})"
    if rows is not None and recorded == key.incarnation:
        found = (held() if held is not None else epoch_rows(table)).get(int(key.epoch), 0)
        if found != rows:
            return (f"{uri} epoch {key.epoch} holds {found} rows where its commit wrote {rows} "
                    f"(deleted since, e.g. by garbage collection)")
    return None


def filesystem(uri: str, storage_options: Mapping[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the table's root path in it (local, or S3-compatible).

    >>> fs, root = filesystem("/data/falkirk/orders/ingest/output")
    >>> type(fs).__name__, root
    ('LocalFileSystem', '/data/falkirk/orders/ingest/output')
    """
    from pyarrow import fs

    if not uri.startswith("s3://"):
        return fs.LocalFileSystem(), uri.removeprefix("file://")
    return _s3_filesystem(tuple(sorted((storage_options or {}).items()))), uri[len("s3://"):]


@functools.lru_cache(maxsize=16)
def _s3_filesystem(options: tuple[tuple[str, str], ...]) -> pafs.FileSystem:
    """One S3 filesystem per set of storage options, made once: making one sets up the AWS SDK
    and its connection pool, which a read of a few files would otherwise pay every time."""
    from urllib.parse import urlparse

    from pyarrow import fs

    opts = dict(options)
    endpoint = opts.get("AWS_ENDPOINT_URL")
    parsed = urlparse(endpoint) if endpoint else None
    return fs.S3FileSystem(
        access_key=opts.get("AWS_ACCESS_KEY_ID"),
        secret_key=opts.get("AWS_SECRET_ACCESS_KEY"),
        region=opts.get("AWS_REGION", "us-east-1"),
        endpoint_override=parsed.netloc if parsed else None,
        scheme=parsed.scheme if parsed else "https",
    )


def lost_files(table: DeltaTable, epoch: int, storage_options: Mapping[str, str] | None = None,
               present: Callable[[], set[str]] | None = None) -> list[str]:
    """The data files of ``epoch`` that the table's log names and its storage no longer holds:
    a disk wiped in part (the data files gone, ``_delta_log`` kept) leaves a table that opens,
    counts its rows from the log, and fails only when read.

    >>> import os, tempfile, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> _ = commit_epoch(uri, pa.table({"epoch": [1], "x": [10]}), CommitKey(dag_id="d", task_id="t", epoch=1))
    >>> lost_files(open_table(uri), 1)
    []
    >>> for f in open_table(uri).file_uris():
    ...     os.remove(f)
    >>> len(lost_files(open_table(uri), 1))
    1
    """
    from pyarrow.fs import FileType

    files = table.file_uris(file_pruning_predicate=[(EPOCH, "=", str(int(epoch)))])
    if not files:
        return []
    located = [_located(f) for f in files]
    if present is not None:  # the caller listed the table's files once (one listing for many epochs)
        held = present()
        return [f for f, path in zip(files, located) if path not in held]
    fs, _ = filesystem(table.table_uri, storage_options)
    return [f for f, info in zip(files, fs.get_file_info(located)) if info.type == FileType.NotFound]


def table_files(uri: str, storage_options: Mapping[str, str] | None = None) -> set[str]:
    """Every file under the table at ``uri``, as :func:`lost_files` compares them: one listing.

    >>> table_files("/nonexistent/table")
    set()
    """
    from pyarrow.fs import FileSelector, FileType

    fs, root = filesystem(uri, storage_options)
    try:
        infos = fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True))
    except OSError:
        return set()
    return {i.path for i in infos if i.type == FileType.File}


def _located(file_uri: str) -> str:
    return file_uri[len("s3://"):] if file_uri.startswith("s3://") else file_uri.removeprefix("file://")


def commit_epoch(
    uri: str,
    rows: pa.Table,
    key: CommitKey,
    storage_options: dict[str, str] | None = None,
) -> CommitResult:
    """Atomically replace epoch ``key.epoch`` of the table at ``uri`` with ``rows``, once.

    ``rows`` must have an integer ``epoch`` column equal to ``key.epoch`` in every row.
    """
    _check_rows(rows, key.epoch)

    def write(table: DeltaTable | None, properties: CommitProperties) -> None:
        _write_rows(uri, table, rows, properties, storage_options, mode="overwrite",
                    predicate=f"{EPOCH} = {int(key.epoch)}", partition_by=[EPOCH])

    return commit_once(uri, key, write, rows.num_rows, storage_options)


def append_once(
    uri: str,
    rows: pa.Table,
    key: OnceKey,
    storage_options: dict[str, str] | None = None,
    schema_mode: str | None = None,
    table: DeltaTable | None = None,
) -> CommitResult:
    """Append ``rows`` to a table shared by many tasks (the ledger), at most once per ``key``.

    Appends from concurrent tasks can lose Delta's commit race, the first one most of all
    (every writer tries to create the table); see :func:`retry_lost_races`. ``schema_mode``
    ``"merge"`` adds columns ``rows`` has and the table has not yet. ``table``: a handle the
    caller already holds, brought up to date instead of loading the table's log again.
    """

    def write(table: DeltaTable | None, properties: CommitProperties) -> None:
        _write_rows(uri, table, rows, properties, storage_options, mode="append", predicate=None, partition_by=None,
                    schema_mode=schema_mode)

    # Skipped: report none of the rows already there, which are other keys' rows.
    return commit_once(uri, key, write, rows.num_rows, storage_options, table=table, count_existing=False)


Write = Callable[["DeltaTable | None", CommitProperties], None]
"""Writes one commit: into the table given, or creating it when ``None`` (failing if it exists
by then), always with the commit properties given."""


def commit_once(uri: str, key: OnceKey, write: Write, rows: int,
                storage_options: dict[str, str] | None = None, *, table: DeltaTable | None = None,
                count_existing: bool = True, attempts: int | None = None) -> CommitResult:
    """The commit protocol, the one place it is written: make ``write``'s commit to the table
    at ``uri`` at most once per ``key``.

    Each attempt reads the table as it is now (``table``, if given, is brought up to date for
    the first) and skips when it already records this incarnation of ``key`` (or a later one),
    reporting the epoch's rows already there (none when not ``count_existing``). Otherwise
    ``write`` commits with :func:`commit_properties`, which record ``key`` in the same Delta
    commit, and with no retry inside delta-rs: a loser must not be replayed on top of the
    winner. Lost races and an unanswering store are retried by :func:`retry_lost_races`,
    which re-runs the check, so an older incarnation never overwrites a newer one.

    >>> import tempfile, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> rows = pa.table({"epoch": [1], "x": [7]})
    >>> write = lambda table, props: write_deltalake(uri, rows, mode="error", commit_properties=props)
    >>> [commit_once(uri, CommitKey(dag_id="d", task_id="t", epoch=1), write, rows=1).applied for _ in range(2)]
    [True, False]
    """
    first = [table]

    def attempt() -> CommitResult:
        current = first.pop() if first else None
        if current is not None:
            current.update_incremental()
        else:
            current = open_table(uri, storage_options)
        if current is not None and already_committed(current, key):
            existing = count_epoch(current, key.epoch) if count_existing else 0
            return CommitResult(uri, current.version(), existing, applied=False)
        write(current, commit_properties(key))
        if current is None:  # created just now
            current = DeltaTable(uri, storage_options=storage_options)
        else:  # reads only the log since the check, not the whole table again
            current.update_incremental()
        return CommitResult(uri, current.version(), rows, applied=True)

    return retry_lost_races(attempt, uri=uri, **({} if attempts is None else {"attempts": attempts}))


def commit_properties(key: OnceKey) -> CommitProperties:
    """The Delta commit properties that record ``key``: its app transaction (id: the
    (task, epoch), version: the incarnation), the transaction naming its inputs when it has
    them, and no retry inside delta-rs. The commit's ``userMetadata``, the column Spark's
    ``DESCRIBE HISTORY`` shows, names the DAG, the task (as the planner names it), the epoch and
    the incarnation.

    >>> commit_properties(CommitKey(dag_id="d", task_id="t", epoch=3, map_index=1)).custom_metadata["userMetadata"]
    '{"falkirk":{"dag_id":"d","task":"t[1]","epoch":3,"incarnation":0}}'
    """
    transactions = [Transaction(key.app_id, key.incarnation)]
    metadata = {"falkirk.app_id": key.app_id, "falkirk.incarnation": str(key.incarnation)}
    about: dict[str, object] = {"dag_id": key.dag_id, "task": str(key.processor)} if isinstance(key, CommitKey) else {}
    about |= {"epoch": key.epoch, "incarnation": key.incarnation}
    metadata["userMetadata"] = json.dumps({"falkirk": about}, separators=(",", ":"))
    if key.inputs:  # keys of shared tables (the ledger, control tables) have none
        transactions.append(Transaction(key.inputs_app_id, key.incarnation))
        metadata["falkirk.inputs"] = key.inputs
    return CommitProperties(app_transactions=transactions, custom_metadata=metadata, max_commit_retries=0)


COMMIT_ATTEMPTS = 20

# Every table this package creates checkpoints its Delta log every 5 commits instead of
# Delta's default 100. Opening a table reads each commit file since the last checkpoint, one
# request apiece on S3: the ledger, appended to by every task instance, was otherwise read
# as up to 99 files per open. A task's own tables get one commit per epoch, so with 10 their
# opens grew slower for ten epochs in a row (benchmarks/delta_log_bench.py).
TABLE_PROPERTIES: dict[str, str | None] = {"delta.checkpointInterval": "5"}

_log = logging.getLogger(__name__)

T = TypeVar("T")


def lost_race(exc: BaseException) -> bool:
    """Whether a Delta write failed only because another writer committed first.

    Either a conflict Delta's optimistic concurrency caught (``CommitFailedError``: for
    example a table created twice, whose second creation carries new metadata that every
    writer who read the first version then trips over), or a creation that found the
    table already there. Neither applied anything.
    """
    return isinstance(exc, CommitFailedError) or (isinstance(exc, DeltaError) and "already exists" in str(exc))


def retry_lost_races(commit: Callable[[], T], attempts: int = COMMIT_ATTEMPTS, uri: str = "") -> T:
    """Run ``commit`` until it does not lose a commit race, at most ``attempts`` times, and
    while the store does not answer, for up to :func:`store_retry_seconds` (then
    :class:`StoreUnreachable`).

    Safe only for a commit that re-reads the table and re-checks its :class:`CommitKey`
    first, as every committer here does: a retry after the same key won the race, or after
    the store applied a commit whose answer was lost, then writes nothing, and an older
    incarnation never overwrites a newer one.

    >>> tries = []
    >>> def commit():
    ...     tries.append(1)
    ...     if len(tries) < 3:
    ...         raise CommitFailedError("Metadata changed since last commit")
    ...     return "committed"
    >>> retry_lost_races(commit), len(tries)
    ('committed', 3)
    """
    attempt, silent_since, pause = 0, None, 0.5
    while True:
        try:
            return commit()
        except Exception as exc:
            if unanswered(exc):
                silent_since = silent_since or time.monotonic()
                waited, budget = time.monotonic() - silent_since, store_retry_seconds()
                if waited >= budget:
                    raise StoreUnreachable(uri, waited, exc) from exc
                _log.warning("the store did not answer a commit to %s (%s); asking again in %.1fs",
                             uri or "a Delta table", " ".join(str(exc).split())[:200], pause)
                time.sleep(min(pause, budget - waited))
                pause = min(pause * 2, 10.0)
                continue
            if not isinstance(exc, DeltaError) or not lost_race(exc) or attempt == attempts - 1:
                raise
        attempt += 1
        time.sleep(random.uniform(0.05, 0.25) * attempt)  # jitter, so racers do not meet again


def _write_rows(uri: str, table: DeltaTable | None, rows: pa.Table, properties: CommitProperties,
                storage_options: dict[str, str] | None, *, mode: str, predicate: str | None,
                partition_by: list[str] | None, schema_mode: str | None = None) -> None:
    # A first commit creates the table and fails if it exists by then ("error"): writing to a bare
    # URI in mode append would let delta-rs load a table another writer created after the key
    # was checked, and append there unchecked.
    write_deltalake(  # type: ignore[call-overload, misc]  # mode and predicate are paired at run time
        table if table is not None else uri,
        rows,
        mode=mode if table is not None else "error",  # type: ignore[arg-type]
        predicate=predicate,
        partition_by=partition_by,
        schema_mode=schema_mode if table is not None else None,  # type: ignore[arg-type]
        configuration=TABLE_PROPERTIES if table is None else None,
        storage_options=storage_options,
        commit_properties=properties,
    )


def read_epoch(uri: str, epoch: int, storage_options: dict[str, str] | None = None) -> pa.Table:
    """The rows of ``epoch`` in the table at ``uri`` (an error if the table does not exist)."""
    table = open_table(uri, storage_options)
    if table is None:
        raise EpochTableError(f"no Delta table at {uri}: has the task that writes it run for epoch {epoch}?")
    return scan(table, where={EPOCH: int(epoch)})


def scan(table: DeltaTable, where: Mapping[str, int | str] | None = None,
         columns: Sequence[str] | None = None) -> pa.Table:
    """The rows of ``table`` whose columns equal the values in ``where`` (all rows if empty).

    Reads go through delta-rs's own query engine rather than pyarrow's dataset scanner:
    the scanner's C++ thread pool can abort the process at exit (``terminate called
    without an active exception``, apache/arrow#34314), which a job or CLI must not do.
    """
    select = ", ".join(_quote_name(c) for c in columns) if columns else "*"
    sql = f"SELECT {select} FROM t"
    if where:
        sql += " WHERE " + " AND ".join(f"{_quote_name(k)} = {_literal(v)}" for k, v in where.items())
    try:
        rows = pa.table(QueryBuilder().register("t", table).execute(sql).read_all())
    except Exception as exc:  # a truncated or missing data file, an unreachable object store
        raise UnreadableTable(table.table_uri, exc) from exc
    return _without_view_types(rows)


_CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def scan_since(table: DeltaTable, version: int, where: Mapping[str, int | str] | None = None) -> pa.Table | None:
    """The rows (matching ``where``) that the commits after ``version`` added to an append-only
    table, up to the version ``table`` is loaded at: what a reader who has read the table at
    ``version`` must add to be current, from those commits' own files and nothing older.

    ``None`` when the tail is not a plain list of appended rows (a commit deleted or rewrote rows
    that match ``where``, or the log no longer holds those commits): the caller then reads the
    whole table. A compaction adds no rows: delta-rs's change feed leaves out the files a commit
    only moved.

    >>> import tempfile, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> write_deltalake(uri, pa.table({"dag_id": ["a", "b"], "x": [1, 2]}))
    >>> write_deltalake(uri, pa.table({"dag_id": ["a", "b"], "x": [3, 4]}), mode="append")
    >>> scan_since(DeltaTable(uri), 0, where={"dag_id": "a"}).to_pydict()
    {'dag_id': ['a'], 'x': [3]}
    >>> _ = DeltaTable(uri).delete("x = 1")
    >>> scan_since(DeltaTable(uri), 1) is None    # a delete is not an append
    True
    """
    if table.version() <= version:
        return None if table.version() < version else pa.table({})
    predicate = " AND ".join(f"{_quote_name(k)} = {_literal(v)}" for k, v in where.items()) if where else None
    try:
        rows = pa.table(table.load_cdf(starting_version=version + 1, ending_version=table.version(),
                                       predicate=predicate).read_all())
    except (DeltaError, OSError, ValueError):
        return None
    rows = _without_view_types(rows)
    if rows.num_rows and not pc.all(pc.equal(rows.column("_change_type"), "insert")).as_py():
        return None
    return (rows.drop_columns([c for c in _CHANGE_COLUMNS if c in rows.column_names]))


def _without_view_types(rows: pa.Table) -> pa.Table:
    """Cast string/binary *view* columns (what delta-rs's engine returns) to the plain types
    that Spark's Arrow conversion and most consumers accept."""
    plain = {pa.types.is_string_view: pa.string(), pa.types.is_binary_view: pa.binary()}
    fields = []
    for f in rows.schema:
        target = next((t for test, t in plain.items() if test(f.type)), None)
        fields.append(f.with_type(target) if target is not None else f)
    schema = pa.schema(fields, metadata=rows.schema.metadata)
    return rows if schema.equals(rows.schema) else rows.cast(schema)


def _quote_name(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: int | str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"scan: filter value {value!r} must be an int or a str")
    return str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"


def compact(uri: str, storage_options: dict[str, str] | None = None) -> int:
    """Rewrite an append-only control table's small files (one per commit) into a few large
    ones; returns how many files were replaced (0 when another compaction of the table is under
    way). Rows, versions and idempotency records are unchanged.

    Two compactions of one table never run at once. delta-rs commits both (a rewrite that
    changes no data does not conflict with another one), and every row of the files both
    rewrote would then be in the table twice, and each later pair of compactions would double
    them again. So a compaction first claims the table (:func:`_claim_compaction`), and one
    that cannot does nothing: the next one does the work.

    >>> import tempfile
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> for k in range(5):
    ...     write_deltalake(uri, pa.table({"k": [k]}), mode="append")
    >>> compact(uri), DeltaTable(uri).to_pyarrow_table().num_rows
    (5, 5)
    """
    if open_table(uri, storage_options) is None:
        return 0
    token = _claim_compaction(uri, storage_options)
    if token is None:
        return 0
    try:
        # Read under the claim: a handle read before it may predate a compaction that ended
        # since, and rewriting its files again would add their rows a second time.
        table = open_table(uri, storage_options)
        if table is None:
            return 0
        metrics = table.optimize.compact()
    except CommitFailedError:
        return 0
    finally:
        _release_compaction(uri, token, storage_options)
    return int(metrics.get("numFilesRemoved", 0))


# A claim not released after this long is a crashed compactor's (one takes seconds).
COMPACTION_CLAIM_SECONDS = 600.0
_CLAIM_SCHEMA = pa.schema([("token", pa.string()), ("event", pa.string()), ("at", pa.timestamp("us", tz="UTC"))])


def _claims_uri(uri: str) -> str:
    """The table of compaction claims on ``uri``: beside it, in the store."""
    return uri.rstrip("/") + "-compactions"


def _claim_compaction(uri: str, storage_options: dict[str, str] | None) -> str | None:
    """A token for this compaction of ``uri``, or ``None`` while another one holds the table.

    The claim is an append that fails if any other row landed in the claims table since this
    one read it: of two compactors that read the same claims, one commits and the other stops.
    Claims are taken one at a time, so the table's last row says whether one is held: only
    that commit is read."""
    import uuid
    from datetime import datetime, timedelta

    claims_uri = _claims_uri(uri)
    claims = open_table(claims_uri, storage_options)
    if claims is None:  # created empty first: an append is a claim only through a handle read before it
        try:
            DeltaTable.create(claims_uri, schema=_CLAIM_SCHEMA, mode="ignore", storage_options=storage_options)
        except DeltaError:
            pass  # created meanwhile by another compactor
        claims = open_table(claims_uri, storage_options)
        if claims is None:
            return None
    now = datetime.now(UTC)
    last = scan_since(claims, claims.version() - 1) if claims.version() > 0 else scan(claims)
    if last is None:  # not a plain append (cannot happen to this table): read it whole
        last = scan(claims)
    rows = sorted(last.to_pylist(), key=lambda r: r["at"])
    if rows and rows[-1]["event"] == "start" and now - rows[-1]["at"] < timedelta(seconds=COMPACTION_CLAIM_SECONDS):
        return None
    token = uuid.uuid4().hex
    row = pa.Table.from_pylist([{"token": token, "event": "start", "at": now}], schema=_CLAIM_SCHEMA)
    try:
        write_deltalake(claims, row, mode="append", commit_properties=CommitProperties(max_commit_retries=0))
    except (CommitFailedError, DeltaError):
        return None  # another claim landed first
    return token


def _release_compaction(uri: str, token: str, storage_options: dict[str, str] | None) -> None:
    from datetime import datetime

    row = pa.Table.from_pylist([{"token": token, "event": "end", "at": datetime.now(UTC)}],
                               schema=_CLAIM_SCHEMA)
    try:
        write_deltalake(_claims_uri(uri), row, mode="append", storage_options=storage_options)
    except Exception as exc:  # noqa: BLE001 - an unreleased claim expires by itself
        logging.getLogger(__name__).warning("compaction claim on %s not released (%s); it expires in %.0f s",
                                            uri, exc, COMPACTION_CLAIM_SECONDS)


def compact_every(result: CommitResult, every: int, storage_options: dict[str, str] | None = None,
                  what: str = "table") -> None:
    """After an append: compact the table when the append made a multiple of ``every`` versions.
    Compaction only speeds reads up, so it never fails the append that triggered it."""
    if not (result.applied and result.version and result.version % every == 0):
        return
    try:
        compact(result.uri, storage_options)
    except Exception as exc:  # noqa: BLE001
        logging.getLogger(__name__).warning("%s compaction of %s skipped: %s", what, result.uri, exc)


def open_table(uri: str, storage_options: dict[str, str] | None = None) -> DeltaTable | None:
    """The Delta table at ``uri``, or ``None`` when there is none yet."""
    try:
        return DeltaTable(uri, storage_options=storage_options)
    except TableNotFoundError:
        return None
    except (DeltaError, OSError) as exc:  # a gap in _delta_log, a torn commit file, storage gone
        raise UnreadableTable(uri, exc) from exc


# Handles kept by latest_version: (uri, options) -> (table, when it was opened).
_WATCHED: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[DeltaTable, float]] = {}
_WATCHED_LOCK = threading.Lock()
REOPEN_SECONDS = 60.0


def latest_version(uri: str, storage_options: dict[str, str] | None = None) -> int | None:
    """The table's latest Delta version (``None`` when there is no table), cheaply for a
    long-lived process such as the scheduler or the API server.

    The first call opens the table; a later one reads only the commits made since (delta-rs's
    ``update_incremental``, one listing of ``_delta_log``) instead of loading the log again. A
    handle is opened anew after :data:`REOPEN_SECONDS`, so a table deleted and created again is
    seen within that time.

    >>> import tempfile, pyarrow as pa
    >>> uri = tempfile.mkdtemp() + "/t"
    >>> latest_version(uri) is None
    True
    >>> commit_epoch(uri, pa.table({"epoch": [1], "x": [1]}), CommitKey(dag_id="d", task_id="t", epoch=1)).version
    0
    >>> latest_version(uri)
    0
    >>> commit_epoch(uri, pa.table({"epoch": [2], "x": [2]}), CommitKey(dag_id="d", task_id="t", epoch=2)).version, latest_version(uri)
    (1, 1)
    """
    key = (uri, tuple(sorted((storage_options or {}).items())))
    with _WATCHED_LOCK:
        held = _WATCHED.get(key)
        if held is not None and time.monotonic() - held[1] < REOPEN_SECONDS:
            try:
                held[0].update_incremental()
                return held[0].version()
            except (DeltaError, OSError):
                pass  # opened anew below, which names the problem
        table = open_table(uri, storage_options)
        if table is None:
            _WATCHED.pop(key, None)
            return None
        _WATCHED[key] = (table, time.monotonic())
        return table.version()


def count_epoch(table: DeltaTable, epoch: int) -> int:
    """How many rows ``table`` holds for ``epoch``."""
    return scan(table, where={EPOCH: int(epoch)}, columns=[EPOCH]).num_rows


def _check_rows(rows: pa.Table, epoch: int) -> None:
    if EPOCH not in rows.column_names:
        raise EpochTableError(f"rows have no {EPOCH!r} column: add one holding {epoch} in every row")
    column = rows.column(EPOCH)
    if not pa.types.is_integer(column.type):
        raise EpochTableError(f"column {EPOCH!r} is {column.type}; it must be an integer type")
    if rows.num_rows and not pc.all(pc.equal(column, epoch)).as_py():
        found = sorted(set(column.to_pylist()))
        raise EpochTableError(f"column {EPOCH!r} must be {epoch} in every row; found {found}")
