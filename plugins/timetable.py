"""The Falkirk timetable: a DAG's runs are the epochs of its :class:`~falkirk.policies.epochs.EpochClock`.

Give a Falkirk DAG ``schedule=EpochTimetable(clock)`` and Airflow itself keeps its runs on the
epoch grid, at the moment a run is created, before any task starts:

* a manual run (the UI's Trigger dialog, the REST API, ``airflowctl dags trigger``,
  ``airflow dags test``) whose logical date is not an epoch is refused with the reason and the
  nearest epochs' dates; the UI's dialog shows the message and creates nothing;
* a manual run without a logical date is refused: such a run has no epoch;
* a backfill (``airflow backfill create``) creates exactly the epochs in its range;
* with ``scheduled=True`` the scheduler creates one run per epoch, as
  ``DeltaDataIntervalTimetable`` would, aligned on the clock's first epoch (``catchup`` as usual).

A refused run never exists, so it cannot fail at task time and hold back the later epochs of a
stateful task through ``depends_on_past``.

Airflow's deprecated local ``airflow dags trigger --logical-date`` asks the timetable with the
trigger time instead of the logical date; the refusal message says so, and
``airflowctl dags trigger`` (or the REST API) is the command to use.

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

from datetime import datetime
from typing import Any

from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction, Timetable
from airflow.utils.types import DagRunType
from pendulum import instance as _pendulum

from falkirk.policies.epochs import EpochClock, EpochError


class EpochTimetable(Timetable):
    """Runs on the grid of ``clock``: epoch ``k``'s run has logical date ``clock.logical_date(k)``
    and data interval ``[that date, the next epoch's)``. With ``scheduled=False`` (the default) the
    scheduler creates no runs by itself; manual runs and backfills still go through the grid."""

    periodic = True
    run_ordering = ("logical_date",)

    def __init__(self, clock: EpochClock, *, scheduled: bool = False) -> None:
        if not isinstance(clock, EpochClock):
            raise TypeError(f"EpochTimetable(clock={clock!r}): give a falkirk.policies.EpochClock")
        self.clock = clock
        self.scheduled = scheduled
        self.can_be_scheduled = scheduled
        self.description = f"Falkirk epochs {clock.describe()}" + ("" if scheduled else ", triggered by hand")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EpochTimetable) and (other.clock, other.scheduled) == (self.clock, self.scheduled)

    def __hash__(self) -> int:
        return hash((self.clock, self.scheduled))

    @property
    def summary(self) -> str:
        return f"epoch every {self.clock.period}"

    def serialize(self) -> dict[str, Any]:
        return {"clock": self.clock.spec(), "scheduled": self.scheduled}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> EpochTimetable:
        return cls(EpochClock.parse(data["clock"]), scheduled=bool(data.get("scheduled", False)))

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
        the grid is refused (a ``ValueError``: the REST API answers 400 with the message)."""
        try:
            return self.interval(self.clock.epoch_of(run_after))
        except EpochError:
            raise EpochError(self.refusal(run_after)) from None

    def generate_run_id(self, *, run_type: DagRunType, run_after: datetime, data_interval: DataInterval | None,
                        **extra: Any) -> str:
        """``manual__epoch-7`` and ``scheduled__epoch-7``; a manual run without a logical date is refused."""
        if data_interval is None:
            raise EpochError(
                "a run of this DAG is an epoch, so it needs a logical date on the epoch grid "
                f"{self.clock.describe()}; trigger it with one (in the Trigger dialog, or "
                "airflowctl dags trigger DAG_ID --logical-date DATE)")
        epoch = self.clock.epoch_of(data_interval.start)
        return run_type.generate_run_id(suffix=f"epoch-{epoch}")

    def next_dagrun_info(self, *, last_automated_data_interval: DataInterval | None,
                         restriction: TimeRestriction) -> DagRunInfo | None:
        """The next epoch after the last scheduled or backfilled one, within ``restriction``."""
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

    def refusal(self, logical_date: datetime) -> str:
        """Why a run at ``logical_date`` is refused, with the nearest epochs' dates."""
        after = self.clock.epoch_at_or_after(logical_date)
        nearest = [e for e in (after - 1, after) if e >= self.clock.first_epoch]
        dates = " and ".join(f"epoch {e} at {self.clock.logical_date(e).isoformat()}" for e in nearest)
        return (f"logical date {logical_date.isoformat()} is not an epoch of this DAG {self.clock.describe()}: "
                f"each run is one epoch, so trigger it at an epoch's date (the nearest: {dates}). "
                f"(The deprecated local `airflow dags trigger` passes the trigger time here, not the logical "
                f"date: use `airflowctl dags trigger`.)")
