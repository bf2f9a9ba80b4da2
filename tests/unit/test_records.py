"""Records of running processors -> a scenario -> the solver's frontiers (policies/rollback/records.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from falkirk.policies.rollback.records import XiRecord, rollback_times, scenario_from_records
from falkirk.policies.rollback.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[2].parent / "shared" / "scenarios"
PROCESSORS = {"s": "epoch", "p": "epoch", "q": "lex", "y": "lex", "r": "epoch"}


def through(t):
    return {"through": list(t) if isinstance(t, tuple) else t}


def figure_7c_records() -> list[XiRecord]:
    """Figure 7(c)'s state as the processors of spark_jobs/loops/cycle.py record it (q checkpoints
    after every event, so its ⊤ is its latest checkpoint; y's records stop at (1, 3))."""
    found = [XiRecord("s", t, N="empty", D={"e1": through(t)}) for t in (0, 1)]
    found += [XiRecord("p", t, M={"e1": through(t)}, N="empty", D={"e2": through((t, 0))}) for t in (0, 1)]
    for c in range(6):
        consumed = through((1, c)) if c else through((0, 8))
        found.append(XiRecord("q", (1, c), M={"e2": through((1, 0)), "e5": consumed}, N="empty",
                              D={"e3": "empty", "e4": "empty"}))
    found += [XiRecord("y", (1, c), M={"e4": through((1, c))}, N="empty", D={"e5": through((1, c + 1))})
              for c in (1, 3)]
    found.append(XiRecord("r", 0, M={"e3": through(0)}, N=through(0)))
    return found


def test_figure_7c_from_records_answers_as_the_hand_checked_scenario() -> None:
    edges = json.loads((SCENARIOS / "fig7c.json").read_text())["edges"]
    doc = scenario_from_records("fig7c", PROCESSORS, edges, figure_7c_records(), failed={"y"})
    expected = json.loads((SCENARIOS / "fig7c.expected.json").read_text())
    answer = load_scenario(doc).answer()
    assert {p: a["frontier"] for p, a in answer["frontiers"].items()} == {
        p: a["frontier"] for p, a in expected["frontiers"].items()}
    assert answer["notification_frontiers"] == expected["notification_frontiers"]
    assert rollback_times(doc) == {"s": "top", "p": "top", "q": (1, 4), "y": (1, 3), "r": "top"}


def test_a_live_processors_top_is_its_live_record_when_it_has_one() -> None:
    records = [XiRecord("u", 0, D={"e": through(0)}), XiRecord("u", None, D={"e": through(3)})]
    doc = scenario_from_records("t", {"u": "epoch", "v": "epoch"}, [{"id": "e", "src": "u", "dst": "v", "phi": "identity"}],
                                records + [XiRecord("v", 1, M={"e": through(0)})], failed={"v"})
    assert doc["processors"][0]["checkpoints"][-1] == {"frontier": "top", "N": "empty", "D": {"e": through(3)}}
    assert rollback_times(doc) == {"u": 0, "v": 1}


def test_records_of_unknown_processors_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="record of 'x': not a processor of 't'"):
        scenario_from_records("t", {"u": "epoch"}, [], [XiRecord("x", 0)])
    with pytest.raises(ValueError, match=r"failed: \['x'\] are not processors"):
        scenario_from_records("t", {"u": "epoch"}, [], [], failed={"x"})
