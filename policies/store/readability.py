"""What the store can still read: the one :data:`Readable` that planning relies on.

A commit is readable when :func:`falkirk.policies.store.commits.missing_commit` finds
nothing missing (the table opens, records that (task, epoch) at this incarnation or a later
one, its epoch still holds the rows the ledger recorded, and the data files its log names are
there: :func:`~falkirk.policies.store.commits.lost_files`) and no control table says
otherwise: a state table at an epoch garbage collection marked is gone, and an external
destination holds an epoch once the ledger's deliveries say so. :func:`without` takes
locations away (a lost scratch directory, or the whole scratch tier for the monitor, which
must not rely on a copy that can vanish with its worker).

>>> import tempfile
>>> from falkirk.policies.store.config import StoreConfig
>>> from falkirk.policies.store.commits import CommitKey
>>> root = tempfile.mkdtemp()
>>> readable = StoreReadability(StoreConfig(root + "/store", root + "/scratch"), entries=[])
>>> readable(root + "/store/d/t/output", CommitKey(dag_id="d", task_id="t", epoch=1))   # no such table
False
>>> without(lambda uri, key: True, [root + "/scratch"])(root + "/scratch/d/t/state", None)
False
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from falkirk.policies.ids import ProcessorId
from falkirk.policies.regimes import Tier
from falkirk.policies.store.commits import (
    CommitKey,
    collected_epochs,
    epoch_rows,
    lost_files,
    missing_commit,
    open_table,
    table_files,
)
from falkirk.policies.store.config import StoreConfig
from falkirk.policies.store.control import Collections, Deliveries
from falkirk.policies.store.ledger import Ledger, LedgerEntry, is_external

Readable = Callable[[str, CommitKey], bool]
"""Whether the table at a URI still holds the commit of a (task, epoch, incarnation)."""


class StoreReadability:
    """A :data:`Readable` over a store's Delta tables; each table's log is read once.

    A tier that is gone (its directory deleted) has no tables, so nothing in it is
    readable; a ledger row naming a table outside the store is never read.

    ``entries`` are the ledger rows whose row counts to check (all of the DAG's, with the
    rolled-back ones, when not given: read from the ledger on first use), or a function that
    returns them, called on first use.
    """

    def __init__(self, store: StoreConfig,
                 entries: Iterable[LedgerEntry] | Callable[[], Iterable[LedgerEntry]] | None = None) -> None:
        self.store = store
        self._tables: dict[str, object] = {}
        self._exists: dict[str, bool] = {}
        self._epoch_rows: dict[str, dict[int, int]] = {}
        self._listed: dict[str, set[str]] = {}
        self._collected_epochs: dict[str, set[int]] = {}
        self._collected: dict[str, dict[str, int]] = {}
        self._delivered: dict[str, dict[str, int]] = {}
        self._rows: dict[str, dict[tuple[str, str, int], int]] = {}
        self._given = entries
        if entries is not None and not callable(entries):
            self._index(entries)

    def _index(self, entries: Iterable[LedgerEntry]) -> None:
        for e in entries:
            _index_rows(self._rows.setdefault(e.dag_id, {}), e)

    def __call__(self, uri: str, key: CommitKey) -> bool:
        if is_external(uri):
            if key.dag_id not in self._delivered:
                self._delivered[key.dag_id] = Deliveries(self.store).through(key.dag_id)
            return key.epoch <= self._delivered[key.dag_id].get(key.task_id, 0)
        if key.dag_id not in self._collected:
            self._collected[key.dag_id] = Collections(self.store).through(key.dag_id)
        if key.epoch <= self._collected[key.dag_id].get(ProcessorId(task=key.task_id, map_index=key.map_index), 0) and uri in (
                self.store.table_uri(tier, key.dag_id, key.task_id, "state", key.map_index) for tier in Tier):
            return False
        if uri not in self._exists:
            self._exists[uri] = self.store.contains(uri)
        if not self._exists[uri]:
            return False
        if uri not in self._tables:
            self._tables[uri] = open_table(uri, self.store.options_for(uri))
        table = self._tables[uri]
        if missing_commit(table, uri, key, self._expected_rows(uri, key),  # type: ignore[arg-type]
                          held=lambda: self._held(uri)) is not None:
            return False
        # a table whose log names data files that are gone (a disk wiped in part) is lost as well
        return not lost_files(table, key.epoch, present=lambda: self._files(uri))  # type: ignore[arg-type]

    def collected(self, uri: str, key: CommitKey) -> bool:
        """Whether garbage collection deleted ``key``'s epoch from the table at ``uri`` (its log
        says so): an epoch gone that way was no longer needed, unlike one lost."""
        if uri not in self._collected_epochs:
            table = open_table(uri, self.store.options_for(uri))
            self._collected_epochs[uri] = collected_epochs(table) if table is not None else set()
        return key.epoch in self._collected_epochs[uri]

    def _files(self, uri: str) -> set[str]:
        if uri not in self._listed:
            self._listed[uri] = table_files(uri, self.store.options_for(uri))
        return self._listed[uri]

    def _expected_rows(self, uri: str, key: CommitKey) -> int | None:
        if callable(self._given):
            given, self._given = self._given, None
            self._index(given())
        if key.dag_id not in self._rows:
            index: dict[tuple[str, str, int], int] = {}
            for e in Ledger(self.store).entries(key.dag_id, include_invalidated=True):
                _index_rows(index, e)
            self._rows[key.dag_id] = index
        return self._rows[key.dag_id].get((uri, key.app_id, key.incarnation))

    def _held(self, uri: str) -> dict[int, int]:
        if uri not in self._epoch_rows:
            self._epoch_rows[uri] = epoch_rows(self._tables[uri])  # type: ignore[arg-type]
        return self._epoch_rows[uri]


def under(uri: str, locations: Iterable[str]) -> bool:
    """Whether ``uri`` is one of ``locations`` or inside one of them (a path prefix, not a string one).

    >>> [under(uri, ["/scratch/d/"]) for uri in ("/scratch/d", "/scratch/d/t/state", "/scratch/dx")]
    [True, True, False]
    """
    return any(uri == loc.rstrip("/") or uri.startswith(loc.rstrip("/") + "/") for loc in locations)


def without(readable: Readable, locations: Iterable[str]) -> Readable:
    """``readable`` with everything at or under ``locations`` counted as gone.

    >>> lost = without(lambda uri, key: True, ["/scratch/d"])
    >>> lost("/scratch/d", None), lost("/scratch/d/t/state", None), lost("/scratch/dx/t", None)
    (False, False, True)
    """
    gone = tuple(locations)

    def check(uri: str, key: CommitKey) -> bool:
        return not under(uri, gone) and readable(uri, key)

    return check


def durable_only(readable: Readable, scratch_uri: str) -> Readable:
    """``readable`` with the scratch tier counted as already lost: what the monitor may rely on.

    A scratch copy can vanish with its worker at any moment, so a watermark computed from it
    could rise past something a later recovery needs.
    """
    return without(readable, [scratch_uri])


def _index_rows(index: dict[tuple[str, str, int], int], e: LedgerEntry) -> None:
    """Record the rows ``e``'s commit wrote to each of its tables."""
    app = e.key.app_id
    if e.state_uri is not None and e.state_rows is not None:
        index[e.state_uri, app, e.incarnation] = e.state_rows
    for o in e.outputs:
        index[o.uri, app, e.incarnation] = o.rows
