"""The data graph's conditions for sender-side logs (Smith & Watson, CS-TR-836 §IV; scenario S10):
exact errors for the scenarios, and a property test of :func:`check_uniform` against a
brute-force oracle that enumerates every walk of small random graphs."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falkirk.policies.sender_logs.graph import GraphError, Segment, check_uniform, slice_sinks, walk_lengths


def test_s10_a_shortcut_edge_is_refused_naming_the_pair_and_the_walk_lengths() -> None:
    with pytest.raises(GraphError) as refused:
        check_uniform([("A", "B"), ("B", "D"), ("A", "D")])
    message = str(refused.value)
    assert message.startswith("data edges from A to D: walks of lengths [1, 2] (A -> D; A -> B -> D).")
    assert "drop the edge A >> D" in message


def test_s10_a_cycle_is_refused_naming_it() -> None:
    with pytest.raises(GraphError, match=r"^data edges form a cycle A >> B >> A: .*acyclic"):
        check_uniform([("A", "B"), ("B", "A")])


def test_s10_the_diamond_is_accepted_with_its_segments() -> None:
    assert check_uniform([("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")]) == (
        Segment("B", ("A",), ("D",)), Segment("C", ("A",), ("D",)))


def test_slice_sinks_are_two_hops_away_or_the_graph_sink_itself() -> None:
    chain = [("ingest", "clean"), ("clean", "enrich"), ("enrich", "publish")]
    assert [slice_sinks(chain, e) for e in chain] == [("enrich",), ("publish",), ("publish",)]
    fan = [("A", "B"), ("B", "C"), ("B", "D")]
    assert slice_sinks(fan, ("A", "B")) == ("C", "D")
    with pytest.raises(GraphError, match=r"^A >> C is not a data edge"):
        slice_sinks(fan, ("A", "C"))


def all_walk_lengths(nodes: list[str], edges: set[tuple[str, str]]) -> dict[tuple[str, str], set[int]] | None:
    """The oracle: every walk of an acyclic graph enumerated one by one; ``None`` for a cyclic graph
    (found as a walk longer than the number of tasks)."""
    lengths: dict[tuple[str, str], set[int]] = {}
    stack = [(u,) for u in nodes]
    while stack:
        walk = stack.pop()
        if len(walk) > len(nodes):
            return None
        for u, v in edges:
            if u == walk[-1]:
                lengths.setdefault((walk[0], v), set()).add(len(walk))
                stack.append((*walk, v))
    return lengths


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(
    st.just(n), st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda e: e[0] != e[1]),
                        min_size=1, max_size=10))))
def test_check_uniform_agrees_with_every_walk_enumerated(graph: tuple[int, set[tuple[int, int]]]) -> None:
    n, pairs = graph
    nodes = [f"t{i}" for i in range(n)]
    edges = {(f"t{u}", f"t{v}") for u, v in pairs}
    ordered = sorted(edges)
    oracle = all_walk_lengths(nodes, edges)
    if oracle is None:
        with pytest.raises(GraphError, match="cycle"):
            check_uniform(ordered)
        return
    assert {k: set(v) for k, v in walk_lengths(ordered).items()} == oracle
    uneven = {k for k, v in oracle.items() if len(v) > 1}
    if uneven:
        with pytest.raises(GraphError) as refused:
            check_uniform(ordered)
        u, v = str(refused.value).split(":")[0].removeprefix("data edges from ").split(" to ")
        assert (u, v) in uneven
        return
    segments = check_uniform(ordered)
    central = {t for t in nodes if any(e[1] == t for e in edges) and any(e[0] == t for e in edges)}
    assert {s.central for s in segments} == central
    for s in segments:
        assert set(s.sources) == {u for u, v in edges if v == s.central}
        assert set(s.sinks) == {v for u, v in edges if u == s.central}
    for edge in edges:  # the slice sinks are at distance 2 through the edge (or the edge's end)
        sinks = set(slice_sinks(ordered, edge))
        after = {v for u, v in edges if u == edge[1]}
        assert sinks == (after or {edge[1]})
        assert all(oracle[edge[0], s] == {2} for s in after)
    assert not list(itertools.islice((k for k in oracle if k[0] == k[1]), 1))  # acyclic: no walk returns
