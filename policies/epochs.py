"""Epochs: each DAG run is one epoch, numbered by its logical date.

An :class:`EpochClock` maps a run's logical date onto a grid of fixed periods. Runs are
totally ordered by logical date, so epochs are too, which is what the rollback
frontiers of the Falkirk Wheel need.

>>> from datetime import datetime, timedelta, timezone
>>> clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
>>> clock.epoch_of(datetime(2026, 1, 3, tzinfo=timezone.utc))
3
>>> clock.logical_date(3)
datetime.datetime(2026, 1, 3, 0, 0, tzinfo=datetime.timezone.utc)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta


class EpochError(ValueError):
    """A logical date that is not an epoch of the clock; the message says which dates are."""


@dataclass(frozen=True)
class EpochClock:
    """The grid of epochs: epoch ``first_epoch`` starts at ``first``, one every ``period``."""

    first: datetime
    period: timedelta
    first_epoch: int = 1

    def __post_init__(self) -> None:
        if self.first.tzinfo is None:
            raise EpochError(f"EpochClock.first={self.first!r} needs a time zone, e.g. tzinfo=timezone.utc")
        if self.period <= timedelta(0):
            raise EpochError(f"EpochClock.period={self.period!r} must be positive")

    def epoch_of(self, logical_date: datetime | None) -> int:
        """The epoch whose period starts at ``logical_date``.

        A date between grid points is an error, not a rounding: two runs in one period
        would otherwise share an epoch, and the second would silently do nothing.
        """
        if logical_date is None:
            raise EpochError(
                "this DAG run has no logical date; each run of a Falkirk DAG is an epoch, "
                f"so trigger it with a logical date on the grid {self.describe()}"
            )
        if logical_date.tzinfo is None:
            raise EpochError(f"logical date {logical_date!r} needs a time zone")
        offset = _plain(logical_date) - self.first
        periods, remainder = divmod(offset, self.period)
        if remainder or periods < 0:
            raise EpochError(
                f"logical date {logical_date.isoformat()} is not on the epoch grid {self.describe()}; "
                f"trigger the run at one of those dates"
            )
        return self.first_epoch + periods

    def epoch_at_or_after(self, moment: datetime) -> int:
        """The first epoch whose logical date is not before ``moment``.

        >>> from datetime import datetime, timedelta, timezone
        >>> clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
        >>> clock.epoch_at_or_after(datetime(2026, 1, 2, 9, tzinfo=timezone.utc))
        3
        >>> clock.epoch_at_or_after(datetime(2025, 6, 1, tzinfo=timezone.utc))
        1
        """
        behind = self.first - _plain(moment)
        if behind >= timedelta(0):
            return self.first_epoch
        return self.first_epoch - (behind // self.period)  # ceiling of (moment - first) / period

    def logical_date(self, epoch: int) -> datetime:
        """The logical date of ``epoch``'s run."""
        if epoch < self.first_epoch:
            raise EpochError(f"epoch {epoch} is before the first epoch {self.first_epoch}")
        return self.first + (epoch - self.first_epoch) * self.period

    def __str__(self) -> str:
        # Airflow serializes a mapped task's arguments with str(): the text form reads back.
        return self.spec()

    def spec(self) -> str:
        """The text form, serialized with a DAG's tasks; :meth:`parse` reads it back.

        >>> from datetime import datetime, timedelta, timezone
        >>> clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(hours=6))
        >>> clock.spec()
        'first=2026-01-01T00:00:00+00:00,period_seconds=21600,first_epoch=1'
        >>> EpochClock.parse(clock.spec()) == clock
        True
        """
        seconds = self.period / timedelta(seconds=1)
        period = int(seconds) if seconds == int(seconds) else seconds
        return f"first={self.first.isoformat()},period_seconds={period},first_epoch={self.first_epoch}"

    @classmethod
    def parse(cls, text: str) -> EpochClock:
        """Read a clock from its text form (see :meth:`spec`)."""
        try:
            fields = dict(item.split("=", 1) for item in text.split(","))
            return cls(first=datetime.fromisoformat(fields["first"]),
                       period=timedelta(seconds=float(fields["period_seconds"])),
                       first_epoch=int(fields.get("first_epoch", "1")))
        except (KeyError, ValueError) as exc:
            raise EpochError(f"{text!r:.100} is not an epoch clock: write "
                             f"first=ISO-DATE-WITH-ZONE,period_seconds=N[,first_epoch=N] ({exc})") from None

    def describe(self) -> str:
        """A short human description, used in error messages."""
        return f"(epoch {self.first_epoch} at {self.first.isoformat()}, one every {self.period})"



def runs_by_epoch(runs: Iterable[tuple[str, datetime | None]], clock: EpochClock) -> dict[int, str]:
    """The run at each epoch among ``runs``: pairs of a run id and the date its epoch is read
    from (:func:`falkirk.policies.asset_events.run_date`), newest first. The first run met at an
    epoch holds it; runs with no date, or with one off the clock's grid, are left out. The one
    rule by which the CLI (over REST) and the API server (over the metadata database) place a
    DAG's runs, so the two never disagree on its latest epoch.

    >>> from datetime import timezone
    >>> clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=timezone.utc), period=timedelta(days=1))
    >>> day = lambda d, h=0: datetime(2026, 1, d, h, tzinfo=timezone.utc)
    >>> runs_by_epoch([("again-2", day(2)), ("off-grid", day(3, 5)), ("asset", day(3)), ("first-2", day(2)),
    ...                ("no-date", None)], clock)
    {2: 'again-2', 3: 'asset'}
    """
    placed: dict[int, str] = {}
    for run_id, date in runs:
        if date is None:
            continue
        try:
            placed.setdefault(clock.epoch_of(date), run_id)
        except EpochError:
            continue
    return placed


def epoch_ranges(epochs: Iterable[int]) -> str:
    """``1-5, 7``: epochs (or block seqs) written as runs of consecutive numbers.

    >>> epoch_ranges([7, 1, 2, 3, 4, 5]), epoch_ranges([3]), epoch_ranges([])
    ('1-5, 7', '3', '')
    """
    runs: list[list[int]] = []
    for e in sorted(set(epochs)):
        if runs and e == runs[-1][1] + 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)

def _plain(moment: datetime) -> datetime:
    """``moment`` as a plain datetime: a subclass (pendulum's, in Airflow) subtracts to its own types."""
    return datetime.combine(moment.date(), moment.timetz())
