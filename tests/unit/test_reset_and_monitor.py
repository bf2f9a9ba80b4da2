"""The reset's re-send queues (Falkirk Wheel Figure 7(a)) and the monitor's low-watermarks (Falkirk Wheel §4.2-4.3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from falkirk.policies.planning.monitor import Monitor, garbage, low_watermarks
from falkirk.policies.rollback.metadata import Chain
from falkirk.policies.rollback.reset import Message, reset
from falkirk.policies.rollback.scenario import load_scenario
from falkirk.policies.rollback.times import INF

SCENARIOS = Path(__file__).resolve().parents[2].parent / "shared" / "scenarios"


def scenario(name: str):
    return load_scenario(json.loads((SCENARIOS / f"{name}.json").read_text()))


def expected_bounds(name: str) -> dict[str, object]:
    doc = json.loads((SCENARIOS / f"{name}.expected.json").read_text())
    s = scenario(name)
    return {p: s.chains[p][v["checkpoint"]].f for p, v in doc["frontiers"].items()}


def test_fig7a_reset_resends_exactly_the_spec_queues() -> None:
    s = scenario("fig7a")
    solution = s.solve()
    # a reads only external input: its sends have no cause time in a graph domain (a is at ⊤).
    # Logs consistent with the checkpoints: x's e2 messages 1..3 come from events within x1 =
    # (e1:3, e4:0), 4..7 from later ones; y's e3 1..2 from y1 = (e2:2); z's e4 #1 from z1 = (e3:2).
    logs = {
        "e1": [Message("e1", s, ("e1", s), cause=None) for s in range(1, 11)],
        "e2": [Message("e2", k, ("e2", k), ("e1", k) if k <= 6 else ("e4", 2)) for k in range(1, 8)],
        "e3": [Message("e3", k, ("e3", k), ("e2", 2 * k)) for k in range(1, 7)],
        "e4": [Message("e4", 1, ("e4", 1), ("e3", 2)), Message("e4", 2, ("e4", 2), ("e3", 5)),
               Message("e4", 3, ("e4", 3), ("e3", 6))],
    }
    plan = reset(s.graph, solution, logs)
    assert [m.seq for m in plan.queues["e1"]] == list(range(4, 11))  # a's logged (e1,4)..(e1,10)
    assert [m.seq for m in plan.queues["e2"]] == [3]
    assert plan.queues["e3"] == []
    assert [m.seq for m in plan.queues["e4"]] == [1]
    assert plan.restore["x"].action == "load" and plan.restore["x"].index == 1
    assert plan.restore["a"].action == "keep" and plan.restore["y"].action == "discard"
    assert plan.kept == {"a": 1, "x": 2, "y": 2, "z": 2}


def test_receiver_at_top_keeps_queued_messages_caused_within_the_sender_frontier() -> None:
    s = scenario("s1c")  # u logs all and keeps ⊤; v failed at ↓{1}
    solution = s.solve()
    assert solution.bound("u") == INF and solution.bound("v") == 2
    logs = {"e": [Message("e", t, t, t) for t in range(4)]}
    plan = reset(s.graph, solution, logs)
    assert [m.time for m in plan.queues["e"]] == [2, 3]  # u re-sends its logged epoch-2 and -3 messages


@pytest.mark.parametrize("variant, steps", [
    ("g1a", [("a", 1, "g1a-t2"), ("o", 1, "g1a-t3"), ("a", 2, "g1a-t4")]),
    ("g1b", [("a", 1, "g1b-t2"), ("o", 1, "g1b-t3"), ("a", 2, "g1b-t4")]),
])
def test_monitor_low_watermarks_follow_the_g1_table(variant: str, steps) -> None:
    final = scenario(f"{variant}-t4")
    start = {p: Chain(c.domain, c.checkpoints[:1] if p != "i" else c.checkpoints,
                      out_domains=c.out_domains) for p, c in final.chains.items()}
    monitor = Monitor(final.graph, start, notifications=final.notifications)
    assert monitor.watermarks() == expected_bounds("g1-t1")
    for pid, index, expected in steps:
        assert monitor.report(pid, final.chains[pid][index]) == expected_bounds(expected), expected
        full = low_watermarks(final.graph, monitor.solver.chains, final.notifications)
        assert {p: full.bound(p) for p in final.graph.ids()} == monitor.watermarks()


def test_garbage_at_g1b_t4() -> None:
    s = scenario("g1b-t4")
    collectable = garbage(s.graph, low_watermarks(s.graph, s.chains, s.notifications))
    assert collectable.drop_checkpoints == {"i": [0, 1], "a": [0, 1], "o": [0]}  # keep the watermark itself
    assert collectable.trim_logs == {"e1": 3, "e2": 2}  # epochs <= 2 on e1, <= 1 on e2
    assert collectable.acknowledge == {"i": 3}  # i acknowledges its epoch-1 and -2 input


@pytest.mark.parametrize("tally_logs, expected", [
    (False, {"T2": (0, 0, 0), "T3": (1, 1, 1), "T4": (1, 1, 1)}),
    (True, {"T2": (1, 1, 0), "T3": (1, 1, 1), "T4": (2, 2, 1)}),
])
def test_ledger_watermarks_count_an_external_send_only_once_accepted(tally_logs: bool, expected) -> None:
    """G1 from ledger rows: deliver's epochs are sent at once but accepted later (Falkirk Wheel §4.3)."""
    from falkirk.policies.planning.chains import DataEdge, TaskGraph
    from falkirk.policies.planning.collector import watermarks
    from falkirk.policies.store.ledger import InputRef, LedgerEntry, OutputRef, external_uri, is_external

    graph = TaskGraph(("i", "a", "o"), (DataEdge("i", "output", "a"), DataEdge("a", "output", "o")))
    a_tier = "durable" if tally_logs else "scratch"

    def row(task: str, e: int) -> LedgerEntry:
        out = {"i": OutputRef("output", "/scratch/i", "scratch", e, 1),
               "a": OutputRef("output", f"/{a_tier}/a", a_tier, e, 1),
               "o": OutputRef("sent", external_uri("outbox:/x"), "external", 0, 1)}[task]
        inputs = {"i": (), "a": (InputRef(task_id="i", output="output", through=e),), "o": (InputRef(task_id="a", output="output", through=e),)}[task]
        regime = "lazy_checkpoint(every=1)" if task == "a" else "ephemeral"
        return LedgerEntry(dag_id="d", task_id=task, epoch=e, regime=regime, run_id=f"epoch-{e}", try_number=1, notified_through=e, outputs=(out,), inputs=inputs,
                           state_uri="/durable/a/state" if task == "a" else None)

    def marks(rows, accepted: int) -> tuple[int, ...]:
        def readable(uri, key):
            return key.epoch <= accepted if is_external(uri) else not uri.startswith("/scratch")
        w = watermarks(rows, graph, readable)
        return tuple(w[t] for t in graph.tasks)

    rows = [row("i", 1), row("i", 2)]
    assert marks(rows, 0) == (0, 0, 0)  # T1
    rows += [row("a", 1), row("o", 1)]
    assert marks(rows, 0) == expected["T2"]  # o has sent epoch 1; not accepted, so no checkpoint
    assert marks(rows, 1) == expected["T3"]
    rows += [row("a", 2), row("o", 2)]
    assert marks(rows, 1) == expected["T4"]
    assert marks(rows, 2) == (2, 2, 2)  # once epoch 2 is accepted too
