"""The Falkirk timetable: a DAG's runs are the epochs of its :class:`~falkirk.policies.epochs.EpochClock`.

Give a Falkirk DAG ``schedule=EpochTimetable(clock)`` and Airflow itself keeps its runs on the
epoch grid, at the moment a run is created, before any task starts:

* a manual run (the UI's Trigger dialog, the REST API, ``falkirk trigger``,
  ``airflow dags test``) whose logical date is not an epoch is refused with the reason and the
  date of the DAG's next epoch (the one after its latest run); the UI's dialog shows the
  message and creates nothing;
* a manual run that would leave a gap after the DAG's latest run (epoch 329 of a DAG at epoch
  14: the Trigger dialog's default date is "now") is refused the same way: its stateful tasks
  could never run it, as they run their epochs in order;
* a manual run without a logical date is refused: such a run has no epoch;
* a backfill (``airflow backfill create``) creates exactly the epochs in its range;
* with ``scheduled=True`` the scheduler creates one run per epoch, as
  ``DeltaDataIntervalTimetable`` would, aligned on the clock's first epoch (``catchup`` as usual).

A refused run never exists, so it cannot fail at task time and hold back the later epochs of a
stateful task through ``depends_on_past``.

The DAG's latest run is read from Airflow's metadata database where the timetable runs beside
it (the API server, the scheduler, ``airflow dags test``); ``airflow dags test`` runs do not
count. Each Falkirk operator binds the timetable to its DAG's id (see :meth:`EpochTimetable.for_dag`).

Example (a DAG file)::

    EPOCHS = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
    with DAG("falkirk_orders", schedule=EpochTimetable(EPOCHS), start_date=EPOCHS.first, catchup=False):
        ...  # RegimeSparkSubmitOperator tasks take the clock from the timetable

>>> from datetime import datetime, timedelta, timezone
>>> from falkirk.policies.epochs import EpochClock
>>> clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
>>> table = EpochTimetable(clock)
>>> table.infer_manual_data_interval(run_after=datetime(2026, 1, 3, tzinfo=timezone.utc)).start.day
3
>>> EpochTimetable.deserialize(table.serialize()).clock == clock
True
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any, NoReturn

from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction, Timetable
from airflow.utils.types import DagRunType
from pendulum import instance as _pendulum

from falkirk.policies.epochs import EpochClock, EpochError


class EpochTimetable(Timetable):
    """Runs on the grid of ``clock``: epoch ``k``'s run has logical date ``clock.logical_date(k)``
    and data interval ``[that date, the next epoch's)``. With ``scheduled=False`` (the default) the
    scheduler creates no runs by itself; manual runs and backfills still go through the grid."""

    run_ordering = ("logical_date",)

    def __init__(self, clock: EpochClock, *, scheduled: bool = False, dag_id: str | None = None) -> None:
        if not isinstance(clock, EpochClock):
            raise TypeError(f"EpochTimetable(clock={clock!r}): give a falkirk.policies.EpochClock")
        self.clock = clock
        self.scheduled = scheduled
        self.dag_id = dag_id
        self.can_be_scheduled = scheduled
        self.description = f"Falkirk epochs {clock.describe()}" + ("" if scheduled else ", triggered by hand")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EpochTimetable) and (other.clock, other.scheduled, other.dag_id) == (
            self.clock, self.scheduled, self.dag_id)

    def __hash__(self) -> int:
        return hash((self.clock, self.scheduled, self.dag_id))

    def for_dag(self, dag_id: str) -> EpochTimetable:
        """This timetable bound to ``dag_id``, whose latest run it then reads to refuse gaps.

        >>> from datetime import datetime, timedelta, timezone
        >>> clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
        >>> EpochTimetable(clock).for_dag("orders").serialize()["dag_id"]
        'orders'
        """
        return EpochTimetable(self.clock, scheduled=self.scheduled, dag_id=dag_id)

    @property
    def periodic(self) -> bool:  # type: ignore[override]
        """``True``: a Falkirk DAG can be backfilled, over a range that leaves no gap.

        Airflow asks this first when it creates a backfill or previews one (``airflow backfill
        create``, the REST API, the UI's Backfill dialog), before it reads the range's runs from
        :meth:`next_dagrun_info` in a loop that logs and drops any exception: so this is where a
        backfill that would leave epochs without a run is refused (:meth:`backfill_refusal`).
        """
        backfill = _caller_locals("airflow.models.backfill", ("_create_backfill", "_do_dry_run"))
        if backfill is not None and backfill.get("from_date") is not None:
            reason = self.backfill_refusal(backfill["from_date"], backfill.get("to_date"))
            if reason is not None:
                if _caller_locals("airflow.cli.commands.backfill_command", ("create_backfill",)) is not None:
                    raise SystemExit(f"airflow backfill create --dag-id {self.dag_id} refused: {reason}")
                from airflow.models.backfill import InvalidBackfillDate

                raise InvalidBackfillDate(reason)  # the REST API answers 422 with it
        return True

    def backfill_refusal(self, from_date: datetime, to_date: datetime | None,
                         latest: int | None = None) -> str | None:
        """Why a backfill from ``from_date`` is refused, or ``None``: its first epoch would leave
        a gap after the DAG's latest run (``latest``, read from Airflow's database when not given).

        >>> from datetime import datetime, timedelta, timezone
        >>> clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
        >>> table = EpochTimetable(clock, dag_id="orders")
        >>> print(table.backfill_refusal(datetime(2026, 11, 24, tzinfo=timezone.utc),
        ...                              datetime(2026, 11, 25, tzinfo=timezone.utc), latest=14))
        a backfill from epoch 328 would leave epochs 15..327 of DAG orders without a run: its latest run is epoch 14, and a task that keeps state runs its epochs in order. Backfill from the next epoch: airflow backfill create --dag-id orders --from-date 2026-01-15T00:00:00+00:00 --to-date 2026-11-25T00:00:00+00:00 --reprocess-behavior failed
        >>> table.backfill_refusal(datetime(2026, 1, 10, tzinfo=timezone.utc), None, latest=14) is None
        True
        """
        latest = self.latest_run_epoch() if latest is None else latest
        if latest is None:
            return None
        first = self.clock.epoch_at_or_after(from_date)
        if first <= latest + 1:
            return None
        until = f" --to-date {to_date.isoformat()}" if to_date is not None else ""
        return (f"a backfill from epoch {first} would leave epochs {latest + 1}..{first - 1} of DAG {self.dag_id} "
                f"without a run: its latest run is epoch {latest}, and a task that keeps state runs its epochs in "
                f"order. Backfill from the next epoch: airflow backfill create --dag-id {self.dag_id} --from-date "
                f"{self.clock.logical_date(latest + 1).isoformat()}{until} --reprocess-behavior failed")

    @property
    def summary(self) -> str:
        return f"epoch every {self.clock.period}"

    def serialize(self) -> dict[str, Any]:
        return {"clock": self.clock.spec(), "scheduled": self.scheduled, "dag_id": self.dag_id}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> EpochTimetable:
        return cls(EpochClock.parse(data["clock"]), scheduled=bool(data.get("scheduled", False)),
                   dag_id=data.get("dag_id"))

    def interval(self, epoch: int) -> DataInterval:
        """Epoch ``epoch``'s data interval.

        >>> from datetime import datetime, timedelta, timezone
        >>> clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(hours=6))
        >>> EpochTimetable(clock).interval(2).end.isoformat()
        '2026-01-01T12:00:00+00:00'
        """
        start = self.clock.logical_date(epoch)
        return DataInterval(_pendulum(start), _pendulum(start + self.clock.period))

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        """The interval of the epoch at ``run_after`` (the logical date being triggered); a date off
        the grid, or an epoch past the one after the DAG's latest run, is refused (a ``ValueError``:
        the REST API answers 400 with the message)."""
        cli = _trigger_call()
        if cli is not None and cli.get("coerced_logical_date") is not None:
            run_after = cli["coerced_logical_date"]
        latest = self.latest_run_epoch()
        try:
            epoch = self.clock.epoch_of(run_after)
        except EpochError:
            _refuse(cli, self.refusal(run_after, latest))
        if latest is not None and epoch > latest + 1:
            _refuse(cli, self.gap_refusal(epoch, latest))
        return self.interval(epoch)

    def latest_run_epoch(self) -> int | None:
        """The epoch of the bound DAG's latest run on the grid, ``airflow dags test`` runs left
        out; ``None`` when unbound, where no metadata database is at hand, or before any run."""
        if self.dag_id is None:
            return None
        try:
            from airflow.models.dagrun import DagRun
            from airflow.utils.session import create_session
            from airflow.utils.types import DagRunTriggeredByType
            from sqlalchemy import or_, select

            with create_session() as session:
                dates = session.scalars(select(DagRun.logical_date).where(
                    DagRun.dag_id == self.dag_id, DagRun.logical_date.is_not(None),
                    or_(DagRun.triggered_by.is_(None), DagRun.triggered_by != DagRunTriggeredByType.TEST),
                ).order_by(DagRun.logical_date.desc()).limit(50)).all()
        except Exception:  # noqa: BLE001 (a task worker has no metadata database: nothing to check)
            return None
        for date in dates:
            try:
                return self.clock.epoch_of(date)
            except EpochError:
                continue  # a run made before the DAG had this timetable
        return None

    def gap_refusal(self, epoch: int, latest: int) -> str:
        """Why epoch ``epoch`` is refused when the DAG's latest run is epoch ``latest``.

        >>> from datetime import datetime, timedelta, timezone
        >>> clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
        >>> print(EpochTimetable(clock, dag_id="orders").gap_refusal(329, 14))
        epoch 329 would leave epochs 15..328 of DAG orders without a run: its latest run is epoch 14, and a task that keeps state runs its epochs in order. Trigger the next epoch, 15, at logical date 2026-01-15T00:00:00+00:00.
        """
        return (f"epoch {epoch} would leave epochs {latest + 1}..{epoch - 1} of DAG {self.dag_id} without a run: "
                f"its latest run is epoch {latest}, and a task that keeps state runs its epochs in order. Trigger "
                f"the next epoch, {latest + 1}, at logical date {self.clock.logical_date(latest + 1).isoformat()}.")

    def generate_run_id(self, *, run_type: DagRunType, run_after: datetime, data_interval: DataInterval | None,
                        **extra: Any) -> str:
        """``manual__epoch-7`` and ``scheduled__epoch-7``; a manual run without a logical date is refused."""
        if data_interval is None:
            _refuse(_trigger_call(), (
                "a run of this DAG is an epoch, so it needs a logical date on the epoch grid "
                f"{self.clock.describe()}; trigger it with one (in the Trigger dialog, or airflow dags trigger "
                f"{self.dag_id or 'DAG_ID'} -l DATE), or trigger the next epoch with: falkirk trigger --dag "
                f"{self.dag_id or 'DAG_ID'}"))
        epoch = self.clock.epoch_of(data_interval.start)
        return run_type.generate_run_id(suffix=f"epoch-{epoch}")

    def next_dagrun_info(self, *, last_automated_data_interval: DataInterval | None,
                         restriction: TimeRestriction) -> DagRunInfo | None:
        """The next epoch after the last scheduled or backfilled one, within ``restriction``.

        A timetable that does not schedule answers only a bounded question (a backfill's range):
        the scheduler's open-ended one gets ``None``, so the UI shows no "Next Run" for a DAG
        whose epochs are triggered.
        """
        if not self.scheduled and restriction.latest is None:
            return None
        if last_automated_data_interval is not None:
            epoch = self.clock.epoch_of(last_automated_data_interval.start) + 1
        elif restriction.earliest is None:
            return None
        else:
            epoch = self.clock.epoch_at_or_after(restriction.earliest)
            if not restriction.catchup:
                # As Airflow's interval timetables do: start with the latest epoch already over.
                epoch = max(epoch, self.clock.epoch_at_or_after(datetime.now(tz=self.clock.first.tzinfo)) - 1)
        interval = self.interval(epoch)
        if restriction.latest is not None and interval.start > restriction.latest:
            return None
        return DagRunInfo.interval(start=interval.start, end=interval.end)

    def refusal(self, logical_date: datetime, latest: int | None = None) -> str:
        """Why a run at ``logical_date`` is refused, with the date to use: the next epoch after the
        DAG's latest run (``latest``), or, with no run yet, the epochs nearest the date.

        >>> from datetime import datetime, timedelta, timezone
        >>> clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
        >>> print(EpochTimetable(clock).refusal(datetime(2026, 11, 27, 9, 30, tzinfo=timezone.utc), latest=14))
        logical date 2026-11-27T09:30:00+00:00 is not an epoch of this DAG (epoch 1 at 2026-01-01T00:00:00+00:00, one every 1 day, 0:00:00): each run is one epoch. Trigger the next epoch, 15, at logical date 2026-01-15T00:00:00+00:00.
        """
        head = (f"logical date {logical_date.isoformat()} is not an epoch of this DAG {self.clock.describe()}: "
                f"each run is one epoch.")
        if latest is not None:
            return f"{head} Trigger the next epoch, {latest + 1}, at logical date " \
                   f"{self.clock.logical_date(latest + 1).isoformat()}."
        after = self.clock.epoch_at_or_after(logical_date)
        nearest = [e for e in (after - 1, after) if e >= self.clock.first_epoch]
        dates = " and ".join(f"epoch {e} at {self.clock.logical_date(e).isoformat()}" for e in nearest)
        return f"{head} Trigger it at an epoch's date (the nearest: {dates})."


def _caller_locals(module: str, functions: tuple[str, ...]) -> dict[str, Any] | None:
    """The locals of the nearest caller running one of ``functions`` of ``module``, else ``None``.

    >>> _caller_locals("airflow.models.backfill", ("_create_backfill",)) is None
    True
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in functions and frame.f_globals.get("__name__") == module:
            return frame.f_locals
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _trigger_call() -> dict[str, Any] | None:
    """The locals of Airflow's ``_trigger_dag`` when it is the caller (``airflow dags trigger``, a
    ``TriggerDagRunOperator``), else ``None``.

    ``_trigger_dag`` asks :meth:`EpochTimetable.infer_manual_data_interval` with ``run_after=now``
    rather than the logical date it was given (the REST API passes the logical date), so the date a
    user typed is read from its frame; without that frame the timetable keeps to ``run_after``.

    >>> _trigger_call() is None
    True
    """
    return _caller_locals("airflow.api.common.trigger_dag", ("_trigger_dag",))


def _refuse(trigger: dict[str, Any] | None, reason: str) -> NoReturn:
    """Refuse a run: an :class:`EpochError` (the REST API answers 400 with it), or, in Airflow's own
    CLI (which prints any exception with its traceback), the reason alone and exit status 1.

    >>> _refuse(None, "epoch 9 would leave a gap")
    Traceback (most recent call last):
    ...
    falkirk.policies.epochs.EpochError: epoch 9 would leave a gap
    """
    from airflow.utils.types import DagRunTriggeredByType

    if trigger is not None and trigger.get("triggered_by") == DagRunTriggeredByType.CLI:
        typed = trigger.get("coerced_logical_date")
        raise SystemExit(f"airflow dags trigger {trigger.get('dag_id')}"
                         f"{f' -l {typed.isoformat()}' if typed else ''} refused: {reason}")
    raise EpochError(reason)
