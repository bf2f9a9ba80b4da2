"""Every hand-checked scenario in ../shared/scenarios gives its expected answer, through the CLI;
invalid scenarios are refused with exit 2 and one line naming the field."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from falkirk.policies.rollback.cli import main
from falkirk.policies.rollback.scenario import ScenarioError, load_scenario

SCENARIOS = Path(__file__).resolve().parents[2].parent / "shared" / "scenarios"
CASES = sorted(p for p in SCENARIOS.glob("*.json") if not p.name.endswith(".expected.json"))


def test_the_shared_scenarios_are_there() -> None:
    assert len(CASES) >= 31, f"expected the hand-checked scenarios in {SCENARIOS}"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_scenario_gives_its_expected_answer(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expected = json.loads(path.with_name(path.stem + ".expected.json").read_text())
    assert main(["solve", str(path)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == expected and err == ""


@pytest.mark.parametrize("path", CASES[:6], ids=lambda p: p.stem)
def test_answer_does_not_depend_on_visiting_order(path: Path) -> None:
    scenario = load_scenario(json.loads(path.read_text()))
    ids = scenario.graph.ids()
    answers = {json.dumps(scenario.answer(scenario.solve(order)), sort_keys=True)
               for order in (ids, ids[::-1], ids[1:] + ids[:1])}
    assert len(answers) == 1


def test_installed_command_solves_from_a_file() -> None:
    falkirk = Path(sys.executable).parent / "falkirk"
    proc = subprocess.run([str(falkirk), "solve", str(SCENARIOS / "fig7b.json")], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == ""
    assert json.loads(proc.stdout) == json.loads((SCENARIOS / "fig7b.expected.json").read_text())


def fig7c() -> dict:
    return json.loads((SCENARIOS / "fig7c.json").read_text())


def broken(edit) -> dict:
    doc = copy.deepcopy(fig7c())
    edit(doc)
    return doc


def procs(doc: dict, pid: str) -> dict:
    return next(p for p in doc["processors"] if p["id"] == pid)


# fig7c: processors s, p, q, y (failed), r; edges e1 s->p, e2 p->q (ingress), e3 q->r (egress),
# e4 q->y, e5 y->q (feedback). Processor indexes: s 0, p 1, q 2, y 3, r 4.
INVALID = [
    ("unknown edge in D", lambda d: procs(d, "q")["checkpoints"][1]["D"].update({"e9": "empty"}),
     'processors[2].checkpoints[1].D.e9: unknown edge \'e9\''),
    ("edge to unknown processor", lambda d: d["edges"][0].update(dst="nobody"),
     "edges[0].dst: unknown processor 'nobody'"),
    ("top on a failed processor", lambda d: procs(d, "y")["checkpoints"].append({"frontier": "top"}),
     'processors[3].checkpoints[3].frontier: a failed processor has no "top" checkpoint'),
    ("non-ascending checkpoints", lambda d: procs(d, "s")["checkpoints"].insert(2, {"frontier": {"through": 0}}),
     "processors[0].checkpoints[2].frontier: checkpoints must strictly ascend"),
    ("top not last", lambda d: procs(d, "r")["checkpoints"].append({"frontier": {"through": 5}}),
     'processors[4].checkpoints[2].frontier: "top" may only be the last checkpoint'),
    ("first is not empty", lambda d: procs(d, "s")["checkpoints"].pop(0),
     'processors[0].checkpoints[0].frontier: the first checkpoint must be ∅ ("empty")'),
    ("frontier of the wrong domain", lambda d: procs(d, "q")["checkpoints"][1].update(frontier={"through": 3}),
     "processors[2].checkpoints[1].frontier: through takes a list of whole numbers >= 0 for a lex domain"),
    ("lex length differs", lambda d: procs(d, "q")["checkpoints"][1].update(frontier={"through": [1, 3, 0]}),
     "lex tuples of processor 'q' have 3 coordinates elsewhere, here 2"),
    ("counts on an epoch processor", lambda d: procs(d, "s")["checkpoints"][1].update(frontier={"counts": {}}),
     "processors[0].checkpoints[1].frontier: 'counts' is not a frontier of a epoch domain"),
    ("missing frontier", lambda d: procs(d, "s")["checkpoints"][1].pop("frontier"),
     "processors[0].checkpoints[1].frontier: is required"),
    ("missing name", lambda d: d.pop("name"), "name: is required"),
    ("wrong format", lambda d: d.update(format="falkirk-scenario/0"), "format: must be 'falkirk-scenario/1'"),
    ("typo key in a checkpoint", lambda d: procs(d, "r")["checkpoints"][2].update(Dbar={}),
     "processors[4].checkpoints[2].Dbar: unknown key"),
    ("M breaks M ⊆ f", lambda d: procs(d, "r")["checkpoints"][1].update(M={"e3": {"through": 4}}),
     "processors[4].checkpoints[1].M.e3: M̄ must lie within the checkpoint's frontier"),
    ("N shrinks along the chain", lambda d: procs(d, "r")["checkpoints"][1].update(N={"through": 0}) or
     procs(d, "r")["checkpoints"].insert(2, {"frontier": {"through": 1}, "N": "empty"}),
     "processors[4].checkpoints[2].N: metadata must not shrink along the chain"),
    ("metadata of ∅ not ∅", lambda d: procs(d, "p")["checkpoints"][0].update(D={"e2": {"through": [0, 0]}}),
     "processors[1].checkpoints[0].D.e2: the metadata of ∅ must be ∅"),
    ("phi kind that does not fit", lambda d: d["edges"][1].update(phi="identity"),
     "edges[1].phi: identity joins equal domains other than seq"),
    ("unknown phi", lambda d: d["edges"][1].update(phi="sideways"), "edges[1].phi: unknown phi 'sideways'"),
    ("duplicate processor", lambda d: d["processors"].append(copy.deepcopy(d["processors"][0])),
     "processors[5].id: duplicate processor id 's'"),
]


@pytest.mark.parametrize("name, edit, message", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_scenario_exits_2_naming_the_field(name, edit, message, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(broken(edit)))
    assert main(["solve", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err and err.count("\n") == 1, err


def test_recorded_values_are_required(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = json.loads((SCENARIOS / "fig7a.json").read_text())
    x = next(p for p in doc["processors"] if p["id"] == "x")
    del x["checkpoints"][1]["phi"]
    with pytest.raises(ScenarioError, match=r"checkpoints\[1\]\.phi\.e2: edge 'e2' is recorded"):
        load_scenario(doc)


def test_not_json_and_missing_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["solve", str(bad)]) == 2
    assert main(["solve", str(tmp_path / "missing.json")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "not JSON" in err and "cannot read" in err


def _spell_metadata(doc: dict, choose) -> dict:
    """``doc`` with metadata left to its defaults written out explicitly where ``choose`` says:
    M̄ at a ``"top"`` checkpoint as ``"top"`` (⊤, restricted to its edge in seq domains), and
    elsewhere in epoch and lex domains as the frontier itself."""
    doc = copy.deepcopy(doc)
    ins: dict[str, list[str]] = {}
    for e in doc["edges"]:
        ins.setdefault(e["dst"], []).append(e["id"])
    for p in doc["processors"]:
        for c in p["checkpoints"]:
            for d in ins.get(p["id"], []):
                if d in c.get("M", {}) or c["frontier"] == "empty" or not choose():
                    continue
                if c["frontier"] == "top":
                    c.setdefault("M", {})[d] = "top"
                elif p["domain"] != "seq":
                    c.setdefault("M", {})[d] = c["frontier"]
    return doc


def test_an_explicit_top_m_on_a_seq_processors_top_checkpoint_is_the_default() -> None:
    doc = json.loads((SCENARIOS / "fig7a.json").read_text())
    x = next(p for p in doc["processors"] if p["id"] == "x")
    x["failed"] = False
    x["checkpoints"].append({"frontier": "top", "D": {"e2": "empty"}, "phi": {"e2": {"counts": {"e2": 9}}}})
    explicit = copy.deepcopy(doc)
    explicit["processors"][1]["checkpoints"][-1]["M"] = {"e1": "top", "e4": "top"}
    assert load_scenario(explicit).answer() == load_scenario(doc).answer()


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_metadata_written_explicitly_answers_as_its_default(path: Path) -> None:
    from hypothesis import given, settings, strategies as st

    doc = json.loads(path.read_text())
    expected = load_scenario(doc).answer()

    @settings(max_examples=20, deadline=None)
    @given(st.randoms(use_true_random=False))
    def spelled(rnd) -> None:
        assert load_scenario(_spell_metadata(doc, lambda: rnd.random() < 0.5)).answer() == expected

    spelled()
