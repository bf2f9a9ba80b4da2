from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from falkirk.policies import (Batch, EagerCheckpoint, Ephemeral, EpochClock, EpochError, LazyCheckpoint, Regime,
    RegimeError, Tier)
from falkirk.policies.job_spec import JobSpec

UTC = timezone.utc


@pytest.mark.parametrize("regime", [Ephemeral(), Batch(), Batch(log_outputs=True), LazyCheckpoint(every=3),
                                    LazyCheckpoint(every=2, log_outputs=True), EagerCheckpoint()])
def test_regime_text_form_round_trips(regime: Regime) -> None:
    assert Regime.parse(regime.spec()) == regime


def test_regimes_route_outputs_and_state_to_tiers() -> None:
    assert [Ephemeral().output_tier(1), Ephemeral().state_tier(1)] == [Tier.SCRATCH, None]
    assert [Batch().output_tier(1), Batch(log_outputs=True).output_tier(1)] == [Tier.SCRATCH, Tier.DURABLE]
    lazy = LazyCheckpoint(every=3)
    assert [lazy.state_tier(e) for e in range(1, 7)] == [Tier.SCRATCH, Tier.SCRATCH, Tier.DURABLE] * 2
    assert [lazy.state_tiers(e) for e in (2, 3)] == [(Tier.SCRATCH,), (Tier.SCRATCH, Tier.DURABLE)]
    assert Ephemeral().state_tiers(1) == () and EagerCheckpoint().state_tiers(1) == (Tier.DURABLE,)
    assert (EagerCheckpoint().output_tier(5), EagerCheckpoint().state_tier(5)) == (Tier.DURABLE, Tier.DURABLE)
    assert [r.keeps_state for r in (Ephemeral(), Batch(), lazy, EagerCheckpoint())] == [False, False, True, True]


@pytest.mark.parametrize("text, message", [
    ("eager", "unknown regime 'eager'; choose one of: batch, eager_checkpoint, ephemeral, lazy_checkpoint"),
    ("lazy_checkpoint(every=0)", "every=0 must be a whole number of epochs >= 1"),
    ("lazy_checkpoint(every)", "argument 'every' must be written as name=value"),
    ("batch(log_outputs=yes)", "log_outputs='yes' must be true or false"),
    ("ephemeral(x=1)", "unknown argument 'x'; ephemeral takes: no arguments"),
    ("batch(", "is not of the form name or name(arg=value, ...)"),
])
def test_bad_regimes_name_the_field(text: str, message: str) -> None:
    with pytest.raises(RegimeError) as err:
        Regime.parse(text)
    assert message in str(err.value)


def test_epoch_clock_maps_grid_dates_and_rejects_others() -> None:
    clock = EpochClock(first=datetime(2026, 1, 1, tzinfo=UTC), period=timedelta(days=1))
    assert [clock.epoch_of(datetime(2026, 1, d, tzinfo=UTC)) for d in (1, 2, 31)] == [1, 2, 31]
    assert clock.epoch_of(clock.logical_date(42)) == 42
    with pytest.raises(EpochError, match="not on the epoch grid"):
        clock.epoch_of(datetime(2026, 1, 2, 12, tzinfo=UTC))
    with pytest.raises(EpochError, match="not on the epoch grid"):
        clock.epoch_of(datetime(2025, 12, 31, tzinfo=UTC))
    with pytest.raises(EpochError, match="no logical date"):
        clock.epoch_of(None)
    with pytest.raises(EpochError, match="needs a time zone"):
        EpochClock(first=datetime(2026, 1, 1), period=timedelta(days=1))


def test_job_spec_round_trips_and_rejects_bad_regime(capsys: pytest.CaptureFixture[str]) -> None:
    spec = JobSpec(dag_id="d", task_id="t", epoch=7, regime=LazyCheckpoint(every=2), run_id="r", try_number=3,
                   map_index=4, incarnation=1, inputs=("a", "b"))
    assert JobSpec.parse(spec.argv()) == spec
    argv = spec.argv()
    argv[argv.index("--regime") + 1] = "lazy(every=2)"
    with pytest.raises(SystemExit):
        JobSpec.parse(argv)
    assert "--regime: unknown regime 'lazy'" in capsys.readouterr().err
