"""The soak's fault schedule: a pure function of its seed, duration and mix."""

from __future__ import annotations

import doctest

from hypothesis import given, settings
from hypothesis import strategies as st

from devstack.soak import schedule as soak_schedule
from devstack.soak.schedule import HOLD_SECONDS, KINDS, WORKER_KINDS, FaultSchedule, Mix

mixes = st.dictionaries(st.sampled_from(sorted(KINDS)), st.integers(0, 5), min_size=1).filter(
    lambda w: any(w.values())).map(Mix)


def test_the_docstring_examples_hold() -> None:
    assert doctest.testmod(soak_schedule, optionflags=doctest.ELLIPSIS).failed == 0


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), duration=st.floats(0.5, 7200), mix=mixes,
       mean_gap=st.floats(1, 600), min_gap=st.floats(0, 120))
def test_a_schedule_is_its_seeds_and_keeps_its_bounds(seed, duration, mix, mean_gap, min_gap) -> None:
    drawn = FaultSchedule.draw(seed, duration, mix, mean_gap=mean_gap, min_gap=min_gap)
    assert drawn == FaultSchedule.draw(seed, duration, mix, mean_gap=mean_gap, min_gap=min_gap)
    times = [f.at for f in drawn.faults]
    assert times == sorted(times)
    assert all(60 <= t <= duration - 120 for t in times)
    assert all(b - a >= min_gap - 1e-9 for a, b in zip(times, times[1:]))  # float sums
    for fault in drawn.faults:
        assert mix.weights[fault.kind] > 0
        assert (fault.target in ("worker-a", "worker-b")) == (fault.kind in WORKER_KINDS)
        low, high = HOLD_SECONDS.get(fault.kind, (None, None))
        assert (fault.hold is None) if low is None else (low <= fault.hold <= high)
    assert sum(drawn.counts().values()) == len(drawn.faults)


def test_kinds_are_drawn_by_their_weights() -> None:
    drawn = FaultSchedule.draw(3, 400_000, Mix.parse("gc=3,kill-job=1"), mean_gap=60, min_gap=0)
    counts = drawn.counts()
    assert set(counts) == {"gc", "kill-job"} and sum(counts.values()) > 5_000
    assert 0.72 < counts["gc"] / sum(counts.values()) < 0.78


def test_different_seeds_draw_different_schedules() -> None:
    drawn = {FaultSchedule.draw(seed, 3600).faults for seed in range(20)}
    assert len(drawn) == 20
