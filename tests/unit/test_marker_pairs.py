"""Marker pairs (Fast Travellers): every row of the bounded pipeline's table on the pure protocol, its decisions
(Fast Travellers, "Correctness"), and two properties over random bounded pipelines: with marker pairs every run
completes and commits nothing whose determinants were not saved; with slow travellers only a
run completes exactly when the data between two markers fits one transaction with the marker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from falkirk.policies.marker_pairs import (Data, FastTraveller, MarkerGate, ProtocolError, Scenario, SlowTraveller,
                                           boundary, simulate)

ALL = sorted(f"d{i}.{j}" for i in range(1, 9) for j in range(1, 4))


def test_slow_travellers_only_deadlock_with_no_commit_in_the_state_the_spec_gives() -> None:
    out = simulate(Scenario(mode="slow"))
    assert out.deadlocked and out.committed == []
    # six derived messages precede st1 and only four fit; every buffer is full
    assert out.stuck == {"I_Q": ["d1.1", "d1.2", "d1.3", "d2.1"], "O_R": ["d2.2", "d2.3", "st1"], "R": ["d3"],
                         "I_R": ["d4", "st2"], "O_P": ["d5", "d6"]}


def test_marker_pairs_commit_all_24_messages_once_with_no_violation() -> None:
    out = simulate(Scenario(mode="pairs"))
    assert not out.deadlocked and out.violations == []
    assert sorted(d.name for d in out.committed) == ALL  # each exactly once
    # d1.* and d2.* under ft1, and nothing of d3 before ft2 is in the slot
    assert out.log.index("ft1 in Q's slot") < _first_commit(out, "d1.1") < out.log.index("st1 at Q")
    assert _first_commit(out, "d3.1") > out.log.index("ft2 in Q's slot")


def test_with_a_determinant_delay_the_sink_holds_what_is_not_covered_until_its_fast_traveller() -> None:
    out = simulate(Scenario(mode="pairs", determinant_delay=20))
    assert not out.deadlocked and out.violations == [] and sorted(d.name for d in out.committed) == ALL
    assert out.log.index("st1 at Q") < out.log.index("ft2 in Q's slot") < _first_commit(out, "d3.1")


def test_without_eviction_on_st_the_oracle_finds_commits_under_a_stale_fast_traveller() -> None:
    out = simulate(Scenario(mode="pairs", determinant_delay=20, evict_on_st=False))
    stale = [(d.name, created) for d, created in out.violations]
    assert stale[:6] == [("d3.1", 1), ("d3.2", 1), ("d3.3", 1), ("d4.1", 1), ("d4.2", 1), ("d4.3", 1)]
    assert {d.origin for d, _ in out.violations} >= {3, 4, 5, 6}  # and likewise later


def test_the_buffer_size_boundaries() -> None:
    # slow travellers alone: K·F = 6 data messages must fit with the marker, |I_Q| - 1 >= 6
    assert boundary("slow", range(4, 9)) == {4: False, 5: False, 6: False, 7: True, 8: True}
    # marker pairs: one data slot and the reserved one are enough
    for capacity in (2, 3, 4):
        out = simulate(Scenario(mode="pairs", in_q=capacity))
        assert not out.deadlocked and out.violations == [] and sorted(d.name for d in out.committed) == ALL


@settings(max_examples=300, deadline=None)
@given(items=st.integers(1, 12), fanout=st.integers(1, 4), every=st.integers(1, 4), out_p=st.integers(1, 3),
       in_r=st.integers(2, 4), out_r=st.integers(1, 4), in_q=st.integers(2, 9), delay=st.integers(0, 25))
def test_marker_pairs_never_commit_what_cannot_be_replayed_and_never_wait_on_a_created_marker(
        items, fanout, every, out_p, in_r, out_r, in_q, delay) -> None:
    """With marker pairs a run completes unless the source cannot even reach its next marker
    (the buffers hold less than one marker's worth of items): then no marker can help. With a
    marker after every item, every run completes."""
    items = max(items - items % every, every)  # the last item is covered by a marker
    out = simulate(Scenario(items=items, fanout=fanout, marker_every=every, out_p=out_p, in_r=in_r, out_r=out_r,
                            in_q=in_q, mode="pairs", determinant_delay=delay))
    assert out.violations == []
    if out.deadlocked:
        assert every > 1 and out.emitted < every * (out.created + 1), out.stuck
    else:
        assert sorted(d.name for d in out.committed) == sorted(f"d{i}.{j}" for i in range(1, items + 1)
                                                               for j in range(1, fanout + 1))


@settings(max_examples=300, deadline=None)
@given(items=st.integers(1, 12), fanout=st.integers(1, 4), every=st.integers(1, 4), out_p=st.integers(1, 3),
       in_r=st.integers(1, 4), out_r=st.integers(1, 4), in_q=st.integers(1, 12))
def test_slow_travellers_complete_exactly_when_a_markers_data_fits_one_transaction(items, fanout, every, out_p, in_r,
                                                                                  out_r, in_q) -> None:
    items = max(items - items % every, every)
    out = simulate(Scenario(items=items, fanout=fanout, marker_every=every, out_p=out_p, in_r=in_r, out_r=out_r,
                            in_q=in_q, mode="slow"))
    assert out.violations == []
    assert out.deadlocked == (every * fanout > in_q - 1)


def test_the_sinks_decisions_on_marker_ids() -> None:
    gate = MarkerGate(capacity=4, mode="pairs")
    gate.fast(FastTraveller(1))
    gate.fast(FastTraveller(3))  # a newer ft supersedes the older one in the slot
    assert gate.slot == FastTraveller(3)
    gate.offer(SlowTraveller(2))  # st2 does not evict ft3
    assert gate.slot == FastTraveller(3) and gate.enabled
    gate.offer(SlowTraveller(3))
    assert gate.slot is None and not gate.enabled
    # st4 before ft4: classical semantics, what came before it is committable; the late ft4 is ignored
    gate.offer(Data("a", 1))
    gate.offer(SlowTraveller(4))
    assert [d.name for d in gate.committable()] == ["a"]
    gate.fast(FastTraveller(4))
    assert gate.slot is None
    gate.commit()
    gate.offer(Data("b", 9))
    assert gate.committable() == []


@pytest.mark.parametrize("make, message", [
    (lambda: MarkerGate(capacity=1, mode="pairs"), "capacity=1: at least 2 in pairs mode"),
    (lambda: MarkerGate(capacity=3, mode="fast"), "mode='fast'"),
    (lambda: simulate(Scenario(mode="pairs", in_r=1)), "in_r=1: at least 2 in pairs mode"),
])
def test_a_pipeline_the_protocol_cannot_run_is_refused_naming_the_field(make, message) -> None:
    with pytest.raises(ProtocolError, match=message):
        make()


def _first_commit(out, name: str) -> int:
    return next(i for i, line in enumerate(out.log) if line.startswith("commit") and name in line.split())


def test_clearing_a_delivered_epoch_also_clears_the_earlier_epochs_a_killed_attempt_left(tmp_path) -> None:
    """The sink delivers its epochs in order, so once it clears epoch 3 from the edge, no epoch
    up to 3 is read from the edge again: rows an attempt killed mid-epoch left for epoch 2 (its
    re-run read the producer's logged output) go too; epoch 4's, still being sent, stay."""
    from falkirk.spark_jobs import channels
    from falkirk.spark_jobs.marker_edge import EdgeTables, MarkerEdge, clear

    tables = EdgeTables.at(str(tmp_path))
    for epoch in (2, 3, 4):
        edge = MarkerEdge(tables, epoch, chunks=2)
        edge.start([])
        edge.send(1, [{"key": f"{epoch}-a", "value": 1}])
        edge.saved(1)
    clear(tables, 3)
    assert {r["epoch"] for r in channels.rows(tables.edge)} == {4}
    assert {r["epoch"] for r in channels.rows(tables.control)} == {4}


def test_a_redo_of_an_epoch_sends_again_under_its_own_markers_not_the_first_drawings(tmp_path) -> None:
    """draw's first incarnation sent and announced both chunks of epoch 7; the sink ran
    elsewhere, so they stayed on this worker's edge. A recovery redoes the epoch (other rows):
    its first attempt withdraws everything sent (a rewind keeping no chunk) and sends chunk 1
    anew. The first incarnation's fast travellers are still out of band, and vouch for none of
    the new rows: the sink commits chunk 1 only once the redo has saved and announced it."""
    import threading
    import time

    from falkirk.spark_jobs.marker_edge import EdgeTables, MarkerEdge, receive

    tables = EdgeTables.at(str(tmp_path))
    first = MarkerEdge(tables, 7, chunks=2)
    first.start([])
    for chunk in (1, 2):
        first.send(chunk, [{"key": f"7-{chunk}", "value": 100 + chunk}])
        first.saved(chunk)
    redo = MarkerEdge(tables, 7, chunks=2)
    redo.start([])  # nothing of the redo is saved yet
    redo.send(1, [{"key": "7-1", "value": 901}, {"key": "7-5", "value": 905}])
    committed: list[list[tuple]] = []
    sink = threading.Thread(daemon=True, target=receive, args=(tables, 7, 2, 4, lambda rows: committed.append(
        [(r["key"], r["value"]) for r in rows])))
    sink.start()
    time.sleep(1.5)
    assert committed == []  # chunk 1 of the redo is not saved: nothing vouches for it
    redo.saved(1)
    redo.send(2, [{"key": "7-2", "value": 902}])
    redo.saved(2)
    sink.join(30)
    assert not sink.is_alive()
    assert sorted(r for t in committed for r in t) == [("7-1", 901), ("7-2", 902), ("7-5", 905)]
