"""The Falkirk timetable keeps a DAG's runs on its epoch grid; the operator takes its clock from it and
warns about DAG settings under which a recovery cannot replay."""

from __future__ import annotations

import warnings
from datetime import datetime, timedelta, timezone

import pytest
from airflow.sdk import DAG
from airflow.timetables.base import DataInterval, TimeRestriction
from airflow.utils.types import DagRunType
from pendulum import instance

from falkirk.plugins.operators import FalkirkSettingsWarning, RegimeSparkSubmitOperator
from falkirk.plugins.timetable import EpochTimetable
from falkirk.policies import EagerCheckpoint, Ephemeral, EpochClock, EpochError

UTC = timezone.utc
CLOCK = EpochClock(first=datetime(2026, 1, 1, tzinfo=UTC), period=timedelta(days=1))
JOB = "falkirk.spark_jobs.pipeline.ingest"


def day(d: int, hour: int = 0) -> datetime:
    return datetime(2026, 1, d, hour, tzinfo=UTC)


def test_a_manual_run_on_the_grid_gets_its_epoch_and_one_off_the_grid_is_refused_naming_the_nearest() -> None:
    table = EpochTimetable(CLOCK)
    assert table.infer_manual_data_interval(run_after=instance(day(5))) == DataInterval(instance(day(5)),
                                                                                     instance(day(6)))
    with pytest.raises(ValueError) as refused:  # the REST API answers 400 with the message
        table.infer_manual_data_interval(run_after=instance(day(5, 17)))
    assert str(refused.value) == (
        "logical date 2026-01-05T17:00:00+00:00 is not an epoch of this DAG (epoch 1 at 2026-01-01T00:00:00+00:00, "
        "one every 1 day, 0:00:00): each run is one epoch. Trigger it at an epoch's date (the nearest: epoch 5 at "
        "2026-01-05T00:00:00+00:00 and epoch 6 at 2026-01-06T00:00:00+00:00).")
    with pytest.raises(ValueError, match=r"the nearest: epoch 1 at 2026-01-01T00:00:00\+00:00\)"):
        table.infer_manual_data_interval(run_after=instance(datetime(2025, 12, 31, tzinfo=UTC)))


def test_a_dag_with_runs_refuses_a_gap_and_proposes_its_next_epoch_never_a_date_nearest_one(monkeypatch) -> None:
    """The Trigger dialog's default date is now: on a DAG at epoch 14 of a daily clock from
    January, that is hundreds of epochs ahead. Off the grid or on it, the refusal names epoch 15."""
    table = EpochTimetable(CLOCK).for_dag("orders")
    monkeypatch.setattr(EpochTimetable, "latest_run_epoch", lambda self: 14)
    now = instance(datetime(2026, 11, 25, 9, 41, tzinfo=UTC))
    with pytest.raises(ValueError) as off_grid:
        table.infer_manual_data_interval(run_after=now)
    assert str(off_grid.value).endswith(
        "each run is one epoch. Trigger the next epoch, 15, at logical date 2026-01-15T00:00:00+00:00.")
    with pytest.raises(ValueError) as gap:
        table.infer_manual_data_interval(run_after=instance(datetime(2026, 11, 25, tzinfo=UTC)))
    assert str(gap.value) == (
        "epoch 329 would leave epochs 15..328 of DAG orders without a run: its latest run is epoch 14, and a task "
        "that keeps state runs its epochs in order. Trigger the next epoch, 15, at logical date "
        "2026-01-15T00:00:00+00:00.")
    # the next epoch, and any earlier one (a run deleted by mistake, made again), are allowed
    assert table.infer_manual_data_interval(run_after=instance(day(15))).start == instance(day(15))
    assert table.infer_manual_data_interval(run_after=instance(day(3))).start == instance(day(3))
    # unbound (no Falkirk task binds it): no run is known, no gap refused
    monkeypatch.undo()
    assert EpochTimetable(CLOCK).latest_run_epoch() is None


def test_a_manual_run_without_a_logical_date_is_refused_and_run_ids_name_the_epoch() -> None:
    table = EpochTimetable(CLOCK)
    with pytest.raises(ValueError, match="needs a logical date on the epoch grid"):
        table.generate_run_id(run_type=DagRunType.MANUAL, run_after=instance(day(9, 13)), data_interval=None)
    interval = table.interval(7)
    assert table.generate_run_id(run_type=DagRunType.MANUAL, run_after=instance(day(30)),
                                 data_interval=interval) == "manual__epoch-7"
    assert table.generate_run_id(run_type=DagRunType.SCHEDULED, run_after=interval.end,
                                 data_interval=interval) == "scheduled__epoch-7"


def test_a_triggered_timetable_shows_no_next_run_yet_backfills_its_range() -> None:
    """Airflow asks for the next run without an upper bound to show "Next Run" (none: epochs are
    triggered), and with the backfill's range to create a backfill's runs."""
    table = EpochTimetable(CLOCK)
    open_ended = TimeRestriction(instance(day(1)), None, catchup=False)
    assert table.next_dagrun_info(last_automated_data_interval=None, restriction=open_ended) is None
    bounded = TimeRestriction(instance(day(3)), instance(day(4)), catchup=True)
    info = table.next_dagrun_info(last_automated_data_interval=None, restriction=bounded)
    assert info.data_interval.start == instance(day(3))


def test_scheduled_and_backfilled_runs_are_exactly_the_epochs_in_range() -> None:
    """What Airflow's backfill and scheduler ask: the next epoch after the last, within the restriction."""
    table = EpochTimetable(CLOCK, scheduled=True)

    def epochs(earliest: datetime, latest: datetime) -> list[int]:
        found, last = [], None
        restriction = TimeRestriction(instance(earliest), instance(latest), catchup=True)
        while (info := table.next_dagrun_info(last_automated_data_interval=last, restriction=restriction)):
            found.append(CLOCK.epoch_of(info.logical_date))
            assert info.data_interval == table.interval(found[-1]) and info.run_after == info.data_interval.end
            last = info.data_interval
        return found

    assert epochs(day(3), day(6)) == [3, 4, 5, 6]
    assert epochs(day(2, 12), day(5, 23)) == [3, 4, 5]  # dates between epochs round inwards
    assert epochs(datetime(2025, 6, 1, tzinfo=UTC), day(2)) == [1, 2]  # nothing before the first epoch
    no_catchup = TimeRestriction(instance(day(1)), None, catchup=False)
    info = table.next_dagrun_info(last_automated_data_interval=None, restriction=no_catchup)
    assert info is not None and info.logical_date > instance(datetime.now(UTC) - timedelta(days=2))
    assert EpochTimetable(CLOCK).can_be_scheduled is False and EpochTimetable(CLOCK).periodic is True


def test_the_timetable_round_trips_through_the_serialized_dag() -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("tt", schedule=EpochTimetable(CLOCK, scheduled=True), start_date=CLOCK.first) as dag:
        RegimeSparkSubmitOperator(task_id="ingest", application=JOB, regime=Ephemeral())
    back = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    assert back.timetable == EpochTimetable(CLOCK, scheduled=True, dag_id="tt")  # bound by its Falkirk task
    assert back.timetable.summary == "epoch every 1 day, 0:00:00"


def test_the_operator_takes_the_clock_from_the_timetable_and_refuses_a_second_clock_or_none() -> None:
    with DAG("tt", schedule=EpochTimetable(CLOCK), start_date=CLOCK.first):
        task = RegimeSparkSubmitOperator(task_id="ingest", application=JOB, regime=Ephemeral())
        assert task.epoch_clock == CLOCK and task.falkirk_epoch_clock == CLOCK.spec()
        other = EpochClock(first=CLOCK.first, period=timedelta(hours=1))
        with pytest.raises(TypeError, match="differs from the DAG's EpochTimetable clock"):
            RegimeSparkSubmitOperator(task_id="b", application=JOB, regime=Ephemeral(), epoch_clock=other)
    with DAG("plain", schedule=None, start_date=CLOCK.first):
        with pytest.raises(TypeError, match=r"needs an epoch clock: give the DAG schedule=EpochTimetable\(clock\)"):
            RegimeSparkSubmitOperator(task_id="ingest", application=JOB, regime=Ephemeral())
        assert RegimeSparkSubmitOperator(task_id="i2", application=JOB, regime=Ephemeral(),
                                         epoch_clock=CLOCK).epoch_clock == CLOCK


def test_settings_under_which_a_replay_cannot_run_as_planned_warn_when_the_dag_is_parsed() -> None:
    def parsed(**dag_kwargs: object) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with DAG("w", start_date=CLOCK.first, **dag_kwargs):
                RegimeSparkSubmitOperator(task_id="ingest", application=JOB, regime=Ephemeral(),
                                          depends_on_past=False)
                RegimeSparkSubmitOperator(task_id="agg", application=JOB, regime=EagerCheckpoint())
        return [str(w.message) for w in caught if w.category is FalkirkSettingsWarning]

    assert parsed(schedule=EpochTimetable(CLOCK), catchup=False) == []
    assert parsed(schedule=EpochTimetable(CLOCK, scheduled=True), catchup=False) == []
    [warning] = parsed(schedule=EpochTimetable(CLOCK, scheduled=True), catchup=True)
    assert warning.startswith("task 'agg' keeps state and DAG 'w' has catchup=True with a schedule: Airflow's "
                              "depends_on_past then checks only the previous scheduled run")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DAG("w2", schedule=EpochTimetable(CLOCK), start_date=CLOCK.first):
            RegimeSparkSubmitOperator(task_id="agg", application=JOB, regime=EagerCheckpoint(), depends_on_past=False)
    [warning] = [str(w.message) for w in caught if w.category is FalkirkSettingsWarning]
    assert warning.startswith("task 'agg' keeps state (eager_checkpoint) but depends_on_past=False: after a "
                              "recovery Airflow may start its epochs out of order")


def test_epoch_errors_are_value_errors_so_airflow_answers_them_as_bad_requests() -> None:
    assert issubclass(EpochError, ValueError)
