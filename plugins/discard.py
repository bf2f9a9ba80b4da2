"""Withdraw the newest epochs of a DAG, made by mistake: ``falkirk discard --dag D --epochs A-B``.

A run triggered at the wrong date (epoch 329 of a DAG at epoch 14) commits its tasks' epochs
to the ledger. Deleting the DAG run in Airflow leaves those rows: every later plan would then
cover epochs up to 329. A discard withdraws them the way a recovery withdraws what it redoes:

1. it checks, changing nothing, that epochs ``A..B`` are the DAG's newest (no ledger row or
   DAG run after them), that none of their runs is still running, and that nothing of them
   has left the store (an external delivery) or been garbage-collected;
2. it records itself in the recovery log, as a plan that re-runs nothing (the history shows
   who discarded which epochs), and takes the DAG's recovery lease;
3. it rolls back every ledger row of those epochs (append-only, as a replay does): readers
   ignore their outputs and state from then on, and ``falkirk gc`` reclaims the files;
4. it deletes those epochs' DAG runs in Airflow, so the next trigger is epoch ``A`` again.

Without ``--yes`` the command only prints what it would do.

Example::

    preview = plan_discard("orders", store, client, 15, 329)
    print(preview.describe())
    discard("orders", store, client, 15, 329, holder="admin")
"""

from __future__ import annotations

import getpass
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from falkirk.plugins.airflow_rest import AirflowClient
from falkirk.policies.epochs import EpochClock
from falkirk.policies.ids import check_dag_id
from falkirk.policies.planning.recovery import DiscardedEpochs, PlanError, RecoveryPlan
from falkirk.policies.planning.recovery_log import RecoveryLog
from falkirk.policies.store import StoreConfig
from falkirk.policies.store.control import Collections, Deliveries
from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerSnapshot

ACTIVE = ("queued", "running")


@dataclass(frozen=True)
class Discard:
    """What a discard withdraws: ``rows`` (the current ledger rows of its epochs) and ``runs``
    (their DAG runs' ids); ``plan`` is its record in the recovery log; ``next_epoch``: the epoch
    the DAG's next trigger makes once it is done. ``consumers``: the discards of the epochs other
    DAGs built, through an Asset, on the rows withdrawn (each with its own consumers)."""

    plan: RecoveryPlan
    rows: tuple[LedgerEntry, ...]
    runs: tuple[str, ...]
    next_epoch: int
    consumers: tuple[Discard, ...] = ()

    @property
    def first(self) -> int:
        return self.plan.failures[0].first  # type: ignore[union-attr]

    @property
    def last(self) -> int:
        return self.plan.failures[0].last  # type: ignore[union-attr]

    def every(self) -> tuple[Discard, ...]:
        """This discard and its consumers', consumers first (the order they are made in)."""
        return (*(d for c in self.consumers for d in c.every()), self)

    def describe(self) -> str:
        """One line per task with rows withdrawn, then the runs deleted; then each consumer's."""
        by_task: dict[str, list[int]] = {}
        for e in self.rows:
            by_task.setdefault(e.processor, []).append(e.epoch)
        lines = [f"discard {self.plan.plan_id} of {self.plan.dag_id}: epochs {self.first}..{self.last}"]
        lines += [f"  {task}: rolls back {_count(len(epochs), 'ledger row')} (epochs {_span(sorted(epochs))})"
                  for task, epochs in sorted(by_task.items())]
        shown = f": {', '.join(self.runs[:5])}" + (", ..." if len(self.runs) > 5 else "") if self.runs else ""
        lines.append(f"  deletes {_count(len(self.runs), 'DAG run')}{shown}")
        lines.append(f"the DAG's next epoch is then {self.next_epoch}")
        for consumer in self.consumers:
            lines += ["", f"{consumer.plan.dag_id} read these epochs through an Asset:", consumer.describe()]
        return "\n".join(lines)


def plan_discard(dag_id: str, store: StoreConfig, client: AirflowClient, first: int, last: int | None,
                 consumers: bool = False) -> Discard:
    """What discarding epochs ``first..last`` of ``dag_id`` withdraws (``last=None``: through the
    DAG's newest epoch, of a current ledger row or of a DAG run); changes nothing.
    Raises :class:`PlanError`, naming the fix, when the discard would leave the DAG inconsistent.

    Epochs of other DAGs that read the rows withdrawn through an Asset would stay current, built
    on rows no longer there: with ``consumers`` they are withdrawn too (from the first of them to
    the consumer's newest, a stateful task builds each epoch on the one before); without, the
    discard is refused, naming the ``--consumers`` form."""
    from falkirk.plugins.dag_facts import latest_run_epoch, regimes_and_clock

    check_dag_id(dag_id)
    if not 1 <= first <= (first if last is None else last):
        raise PlanError(f"--epochs {first}-{last}: give FIRST-LAST with 1 <= FIRST <= LAST")
    if not client.dag_exists(dag_id):
        raise PlanError(f"--dag: Airflow has no DAG {dag_id!r}")
    _, clock = regimes_and_clock(dag_id, client)
    if clock is None:
        raise PlanError(f"--dag {dag_id}: it has no Falkirk task, so it has no epochs to discard")
    snapshot = LedgerSnapshot(Ledger(store), dag_id)
    current = snapshot.entries()
    newest = max((e.epoch for e in current), default=0)
    latest_epoch = latest_run_epoch(dag_id, client, clock)
    if last is None:  # --epochs A-: through the DAG's newest ledger row or run
        last = max(first, newest, latest_epoch or 0)
    rows = tuple(sorted((e for e in current if first <= e.epoch <= last), key=lambda e: (e.epoch, e.processor)))
    if newest > last:
        raise PlanError(f"--epochs {first}-{last}: the ledger has rows up to epoch {newest}; a discard withdraws "
                        f"the newest epochs only (a later epoch may be built on a discarded one): give --epochs "
                        f"{first}-{newest}")
    if latest_epoch is not None and latest_epoch > last:
        raise PlanError(f"--epochs {first}-{last}: the DAG has a run at epoch {latest_epoch}; a discard withdraws "
                        f"the newest epochs only: give --epochs {first}-{latest_epoch}")
    runs = client.runs_between(dag_id, clock.logical_date(first), clock.logical_date(last))
    active = [r for r in runs if r.get("state") in ACTIVE]
    if active:
        r = active[0]
        raise PlanError(f"--epochs {first}-{last}: DAG run {r['dag_run_id']} is {r['state']}; wait for it to end "
                        f"(or mark it failed in Airflow), then discard")
    delivered = {t: e for t, e in Deliveries(store).through(dag_id).items() if e >= first}
    if delivered:
        task, epoch = sorted(delivered.items())[0]
        raise PlanError(f"--epochs {first}-{last}: {task} delivered epoch {epoch} to an external system, which a "
                        f"discard cannot take back; discard from epoch {epoch + 1} at the earliest")
    collected = {t: e for t, e in Collections(store).through(dag_id).items() if e >= first}
    if collected:
        task, epoch = sorted(collected.items())[0]
        raise PlanError(f"--epochs {first}-{last}: garbage collection already released {task}'s epochs up to "
                        f"{epoch}, which the DAG would restart from; discard from epoch {epoch + 1} at the earliest")
    readers = _consumer_epochs(store, dag_id, rows)
    if readers and not consumers:
        named = "; ".join(f"{dag} epochs {_span(epochs)}" for dag, epochs in sorted(readers.items()))
        raise PlanError(f"--epochs {first}-{last}: other DAGs read these epochs through an Asset ({named}), and "
                        f"would keep results built on the rows withdrawn; withdraw those too: falkirk discard "
                        f"--dag {dag_id} --epochs {first}-{last} --consumers (preview it first)")
    downstream = tuple(_consumer_discard(store, client, dag, min(epochs)) for dag, epochs in sorted(readers.items()))
    if not rows and not runs:
        raise PlanError(f"--epochs {first}-{last}: DAG {dag_id} has no ledger row and no DAG run in these epochs; "
                        f"nothing to discard")
    run_ids = tuple(r["dag_run_id"] for r in runs)
    kept = max((e.epoch for e in current if e.epoch < first), default=0)
    record = RecoveryPlan(dag_id, (DiscardedEpochs(first, last, run_ids),), first - 1, snapshot.dag_version, ())
    return Discard(record, rows, run_ids, _next_epoch(client, dag_id, clock, first, kept), downstream)


def _consumer_epochs(store: StoreConfig, producer: str, rows: Sequence[LedgerEntry]) -> dict[str, list[int]]:
    """The epochs of other DAGs whose current ledger rows read one of ``rows`` through an Asset,
    by DAG."""
    withdrawn = {e.commit_id for e in rows}
    ledger = Ledger(store)
    readers: dict[str, set[int]] = {}
    for dag in sorted({r.dag_id for r in ledger.asset_reads() if r.dag_id != producer}):
        for row in LedgerSnapshot(ledger, dag).entries():
            if any(read.commit_id in withdrawn for read in row.asset_inputs):
                readers.setdefault(dag, set()).add(row.epoch)
    return {dag: sorted(epochs) for dag, epochs in readers.items()}


def _consumer_discard(store: StoreConfig, client: AirflowClient, dag_id: str, first: int) -> Discard:
    """The discard of ``dag_id``'s epochs from ``first`` to its newest (ledger row or run)."""
    from falkirk.plugins.dag_facts import latest_run_epoch, regimes_and_clock

    _, clock = regimes_and_clock(dag_id, client)
    newest = max((e.epoch for e in Ledger(store).entries(dag_id)), default=first)
    latest = latest_run_epoch(dag_id, client, clock) if clock is not None else None
    return plan_discard(dag_id, store, client, first, max(newest, latest or first), consumers=True)


def _next_epoch(client: AirflowClient, dag_id: str, clock: EpochClock, first: int, kept: int) -> int:
    """The epoch the DAG's next trigger makes once epochs ``first..`` are discarded: the one after
    its newest run or ledger row before ``first``."""
    earlier = run_epochs(client, dag_id, clock, clock.first_epoch, first - 1) if first > clock.first_epoch else []
    return max(max([kept, *earlier]) + 1, clock.first_epoch)


def _epoch_of_run(clock: EpochClock, run: Mapping[str, Any]) -> int | None:
    from falkirk.plugins.airflow_rest import partition_date_of
    from falkirk.policies.epochs import EpochError

    date = run.get("logical_date")
    when = datetime.fromisoformat(date.replace("Z", "+00:00")) if date else partition_date_of(run)
    try:
        return clock.epoch_of(when) if when is not None else None
    except EpochError:
        return None


def discard(dag_id: str, store: StoreConfig, client: AirflowClient, first: int, last: int | None,
            holder: str | None = None, progress: Callable[[str], None] = print, consumers: bool = False) -> Discard:
    """Discard epochs ``first..last`` of ``dag_id`` (see the module docstring), and with
    ``consumers`` the epochs other DAGs built on them, consumers first: for each, check, record,
    take the lease, roll the rows back, delete the runs, give the lease back."""
    planned = plan_discard(dag_id, store, client, first, last, consumers=consumers)
    for each in planned.every():
        _withdraw(each, store, client, holder, progress)
    return planned


def _withdraw(planned: Discard, store: StoreConfig, client: AirflowClient, holder: str | None,
              progress: Callable[[str], None]) -> None:
    dag_id, first, last = planned.plan.dag_id, planned.first, planned.last
    log, ledger = RecoveryLog(store), Ledger(store)
    log.record(planned.plan)
    lease = log.begin(planned.plan, holder or getpass.getuser())
    try:
        if ledger.dag_version(dag_id) != planned.plan.ledger_version:
            raise PlanError(f"the ledger of {dag_id} changed while the discard was checked (a task committed); "
                            f"run it again")
        rolled = ledger.invalidations.record(planned.rows, planned.plan.plan_id)
        progress(f"discard {planned.plan.plan_id}: rolled back {_count(rolled, 'ledger row')} of {dag_id} epochs "
                 f"{first}..{last}")
        for run in planned.runs:
            client.delete_run(dag_id, run)
        progress(f"discard {planned.plan.plan_id}: deleted {_count(len(planned.runs), 'DAG run')} of {dag_id}")
    except BaseException as exc:
        log.end(lease, "failed", f"{type(exc).__name__}: {exc}"[:2000])
        raise
    log.end(lease, "finished", f"discarded epochs {first}..{last}: {_count(len(planned.rows), 'ledger row')} rolled "
                               f"back, {_count(len(planned.runs), 'DAG run')} deleted")


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1.

    >>> _count(1, "DAG run"), _count(3, "ledger row")
    ('1 DAG run', '3 ledger rows')
    """
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def rows_beyond(entries: list[LedgerEntry], last_epoch: int) -> tuple[int, int] | None:
    """The first and last epoch of current ledger rows past ``last_epoch`` (``None``: none).

    >>> from falkirk.policies.store.ledger import LedgerEntry
    >>> rows = [LedgerEntry(dag_id="d", task_id="t", epoch=e, regime="batch", run_id=f"r{e}", try_number=1) for e in (1, 2, 329)]
    >>> rows_beyond(rows, 2), rows_beyond(rows, 329)
    ((329, 329), None)
    """
    beyond = [e.epoch for e in entries if e.epoch > last_epoch]
    return (min(beyond), max(beyond)) if beyond else None


def beyond_note(dag_id: str, last_epoch: int, beyond: tuple[int, int]) -> str:
    """What a plan bounded to the DAG's latest run says about ledger rows past it.

    >>> print(beyond_note("orders", 15, (329, 329)))
    the ledger has rows of epochs 329..329 past the DAG's latest run (epoch 15), left out of this plan; if those runs were made by mistake, withdraw them: falkirk discard --dag orders --epochs 329-329
    """
    first, last = beyond
    return (f"the ledger has rows of epochs {first}..{last} past the DAG's latest run (epoch {last_epoch}), left out "
            f"of this plan; if those runs were made by mistake, withdraw them: falkirk discard --dag {dag_id} "
            f"--epochs {first}-{last}")


def run_gap(planned: Sequence[int], runs: Sequence[int]) -> tuple[int, int, int] | None:
    """The longest span of epochs a plan re-runs that have no DAG run while a later epoch has one:
    ``(first, last, resume)``, ``resume`` the first run after it; ``None`` when there is none.
    Such a gap comes from a run made at a date far ahead (or a deleted run): a plan re-runs the
    stateful tasks through it, and a replay cannot run an epoch without a run.

    >>> run_gap(range(14, 331), [*range(1, 15), 328, 329, 330])
    (15, 327, 328)
    >>> run_gap([4, 5], [1, 2, 3, 4, 5]) is None
    True
    """
    have = set(runs)
    best: tuple[int, int, int] | None = None
    start: int | None = None
    previous = 0
    for epoch in sorted(set(planned)):
        if epoch in have:
            if start is not None and (best is None or previous - start > best[1] - best[0]):
                best = (start, previous, epoch)
            start = None
        elif start is None or epoch != previous + 1:
            start = epoch
        previous = epoch
    return best


def gap_note(dag_id: str, gap: tuple[int, int, int], rerun: int, in_gap: int) -> str:
    """What a plan whose size comes from epochs without a run says instead of its table.

    >>> print(gap_note("orders", (15, 327, 328), 1816, 1771))
    1771 of this plan's 1816 re-runs are epochs 15..327, which have no DAG run: the DAG's runs jump from epoch 14 to 328, and a replay cannot run an epoch without a run. If the runs from epoch 328 on were made at a date far ahead by mistake, withdraw them instead (it previews; add --yes): falkirk discard --dag orders --epochs 328-
    """
    first, last, resume = gap
    return (f"{in_gap} of this plan's {rerun} re-runs are epochs {first}..{last}, which have no DAG run: the DAG's "
            f"runs jump from epoch {first - 1} to {resume}, and a replay cannot run an epoch without a run. If the "
            f"runs from epoch {resume} on were made at a date far ahead by mistake, withdraw them instead (it "
            f"previews; add --yes): falkirk discard --dag {dag_id} --epochs {resume}-")


def run_epochs(client: AirflowClient, dag_id: str, clock: EpochClock, first: int, last: int) -> list[int]:
    """The epochs ``first..last`` of ``dag_id`` that have a DAG run."""
    runs = client.runs_between(dag_id, clock.logical_date(first), clock.logical_date(last))
    return [e for r in runs if (e := _epoch_of_run(clock, r)) is not None]


def _span(epochs: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``3-5, 9``.

    >>> _span([3, 4, 5, 9])
    '3-5, 9'
    """
    parts, start = [], None
    for i, e in enumerate(epochs):
        if start is None:
            start = e
        if i + 1 == len(epochs) or epochs[i + 1] != e + 1:
            parts.append(str(start) if start == e else f"{start}-{e}")
            start = None
    return ", ".join(parts)
