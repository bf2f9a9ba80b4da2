"""Release policies and acknowledgements of sender-side logs, as pure decisions: exact values,
clear refusals, and the retention bound of scenario S11 on a simulated
run (the run through Airflow and Delta is the integration tests')."""

from __future__ import annotations

import pytest

from falkirk.policies.sender_logs.acks import Acknowledgements, acknowledged, retained
from falkirk.policies.sender_logs.graph import slice_sinks
from falkirk.policies.sender_logs.release import (AtEnd, Custom, Immediate, ReleaseError, Window, parse_release,
                                                  release_point)


def keep_two(through: int, final: bool) -> int:
    """A custom policy for the tests: the last two blocks matter."""
    return through if final else max(through - 2, 0)


def too_far(through: int, final: bool) -> int:
    """A broken custom policy: it releases a block not yet processed."""
    return through + 1


def test_each_policy_releases_what_it_declares() -> None:
    assert [Immediate().released(e) for e in (0, 1, 5)] == [0, 1, 5]
    assert [AtEnd().released(e) for e in (1, 9)] + [AtEnd().released(10, final=True)] == [0, 0, 10]
    assert [Window(2).released(e) for e in (1, 2, 3, 6)] + [Window(2).released(7, final=True)] == [0, 0, 1, 4, 7]
    custom = Custom(f"{__name__}:keep_two")
    assert [custom.released(e) for e in (1, 5)] == [Window(2).released(e) for e in (1, 5)]
    assert release_point({"probe": Immediate(), "build": AtEnd()}, 6) == 0
    assert release_point({"probe": Immediate(), "build": AtEnd()}, 6, final=True) == 6
    assert release_point({"a": Immediate(), "b": Window(3)}, 6) == 3


@pytest.mark.parametrize("text", ["immediate", "at_end", "window(4)", f"custom({__name__}:keep_two)"])
def test_specs_read_back(text: str) -> None:
    assert parse_release(text).spec() == text


@pytest.mark.parametrize("text, message", [
    ("windows(2)", r"release policy 'windows\(2\)': give one of immediate, at_end, window\(K\)"),
    ("window(-1)", r"release policy 'window\(-1\)'"),
    ("window(0)", r"Window\(k=0\): k is the number of blocks"),
    ("custom(no.such.module:f)", r"Custom\('no.such.module:f'\): cannot import it"),
    ("custom(os.path)", r"name the function as 'package.module:function'"),
])
def test_bad_specs_are_refused_naming_the_fix(text: str, message: str) -> None:
    with pytest.raises(ReleaseError, match=message):
        parse_release(text)


def test_a_custom_policy_that_releases_the_future_is_refused() -> None:
    with pytest.raises(ReleaseError, match=r"returned 4 for through=3: a release is a seq from 0 to the newest"):
        Custom(f"{__name__}:too_far").released(3)


def test_s11_a_stateless_chain_retains_only_the_blocks_in_flight_and_an_at_end_edge_all_until_the_end() -> None:
    chain = [("ingest", "clean"), ("clean", "enrich"), ("enrich", "publish")]
    releases = {"clean": Immediate(), "enrich": Immediate(), "publish": Immediate()}
    acks = Acknowledgements.none()
    released_at: dict[str, dict[int, int]] = {t: {} for t in releases}
    kept_per_epoch = []
    for epoch in range(1, 21):
        for task, policy in releases.items():  # every task commits epoch `epoch` and releases by its policy
            released_at[task][epoch] = policy.released(epoch)
        # Acknowledgements of the epoch before arrive now (one epoch in flight).
        for producer, central in chain:
            for sink in slice_sinks(chain, (producer, central)):
                carrier = released_at[central] if sink != central else released_at[sink]
                acks = acks.record((producer, central), sink, acknowledged(carrier, epoch - 1))
        kept_per_epoch.append([retained(range(1, epoch + 1), acks.prune_point(e, slice_sinks(chain, e)))
                               for e in chain])
    assert kept_per_epoch == [[[epoch]] * 3 for epoch in range(1, 21)]

    edge, sinks = ("ingest", "total"), ("total",)  # S2: a graph sink that sums 10 epochs, at_end
    acks, kept = Acknowledgements.none(), []
    for epoch in range(1, 11):
        acks = acks.record(edge, "total", AtEnd().released(epoch, final=epoch == 10))
        kept.append(len(retained(range(1, epoch + 1), acks.prune_point(edge, sinks))))
    assert kept == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]


def test_s2_negative_control_immediate_on_an_aggregator_prunes_what_its_recovery_needs() -> None:
    """The contract violation the integration test must detect: declared immediate, the
    aggregator's input is pruned, and a recovery at epoch 8 can replay only epoch 8 on."""
    edge = ("ingest", "total")
    acks = Acknowledgements.none()
    for epoch in range(1, 8):
        acks = acks.record(edge, "total", Immediate().released(epoch))
    assert retained(range(1, 9), acks.prune_point(edge, ("total",))) == [8]
    assert sum(range(8, 11)) != sum(range(1, 11))  # what total' would compute differs from the true sum
