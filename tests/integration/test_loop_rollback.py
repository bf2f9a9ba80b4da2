"""Falkirk Wheel Figure 7(c) on Spark: a loop between q and y inside each epoch, y killed.

s, p, q, y and r of :mod:`falkirk.spark_jobs.loops.cycle` run as processes of their own
against the session's Spark Connect server. y is SIGKILLed as iteration 5 of epoch 1 starts,
with lazy checkpoints at (1, 1) and (1, 3) behind it; q has already consumed y's (1, 4)
message. The records the processes wrote become a scenario; the solver's answer must be the
hand-checked one of ``shared/scenarios/fig7c.expected.json`` (q at (1, 4), y at (1, 3), the
rest at ⊤). After the rollback and a restart from those frontiers, y's first message is q's
logged one at (1, 4) (never written again), and every table equals a pure-Python run of the
same arithmetic.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from devstack.spark import SparkConnectServer
from tests.integration.job_processes import JobProcesses
from falkirk.policies.rollback.scenario import load_scenario
from falkirk.policies.store.commits import open_table, scan
from falkirk.spark_jobs import channels
from falkirk.spark_jobs.loops import cycle
from falkirk.spark_jobs.loops.cycle import ITERATIONS, MODULUS, NODES, Layout

pytestmark = pytest.mark.integration

SCENARIOS = Path(__file__).resolve().parents[3] / "shared" / "scenarios"


def oracle(epochs: int) -> dict:
    """What the loop computes, in plain Python: every message, state and report."""
    carry: dict[int, int] = {}
    acc = {n: 0 for n in range(NODES)}
    sent: dict[str, dict] = {"e3": {}, "e4": {}, "report": {}, "state-y": {}}
    for t in range(epochs):
        s = {n: (t * 7 + 1 + n * 13) % MODULUS for n in range(NODES)}
        p = {n: (2 * s[n] + t) % MODULUS for n in range(NODES)}
        x = {n: (p[n] + carry.get(n, 0)) % MODULUS for n in range(NODES)}
        sent["e4"][(t, 0)] = x
        for c in range(ITERATIONS):
            acc = {n: (acc[n] + x[n]) % MODULUS for n in range(NODES)}
            reply = {n: (3 * x[n] + acc[n] + c) % MODULUS for n in range(NODES)}
            sent["state-y"][(t, c)] = dict(acc)
            x = {n: (5 * reply[n] + t) % MODULUS for n in range(NODES)}
            sent["e4" if c + 1 < ITERATIONS else "e3"][(t, c + 1)] = x
        carry = x
        sent["report"][(t, 0)] = {0: sum(x.values()) % MODULUS}
    return sent


def rows_of(uri: str) -> dict:
    table = open_table(uri)
    found: dict = {}
    for r in scan(table).to_pylist():
        found.setdefault((r["epoch"], r["iteration"]), {})[r["node"]] = r["value"]
    return found


def commits_at(uri: str, at: tuple[int, int]) -> int:
    """How many commits wrote the rows at time ``at``."""
    wanted = f"epoch = {at[0]} AND iteration = {at[1]}"
    return sum(1 for h in open_table(uri).history()
               if h.get("operation") == "WRITE" and wanted in str(h.get("operationParameters", {}).get("predicate")))


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory, spark_connect: SparkConnectServer):
    root = tmp_path_factory.mktemp("cycle")
    layout = Layout(str(root / "store"), str(root / "scratch"))
    logs = root / "logs"
    run = JobProcesses("falkirk.spark_jobs.loops.cycle", spark_connect.url, logs,
                       ["--store", layout.store, "--scratch", layout.scratch])
    for t in (0, 1):
        run.run("source", "--epoch", str(t))
        run.run("prepare", "--epoch", str(t))
    q = run.start("head", "--epochs", "0-2")
    y = run.start("body", "--epochs", "0-2", crash="y:1:iteration-5")
    run.run("report", "--epoch", "0")
    assert y.wait(timeout=300) == -9, f"y was to be killed at (1, 5); logs in {logs}"
    deadline = time.monotonic() + 120
    # q consumes y's (1, 4) message, sends (1, 5) and records that checkpoint, then waits for y's (1, 5).
    # Its state row lands one commit before the record: only the record says the checkpoint is whole.
    while channels.read(layout.table("records-q"), kind="checkpoint", epoch=1, iteration=5) is None:
        assert time.monotonic() < deadline and q.poll() is None, f"q never got to (1, 5); logs in {logs}"
        time.sleep(0.2)
    q.kill()  # the loop stops; q's latest checkpoint is its ⊤ (it checkpoints after every event)
    q.wait()
    before = {"e4": rows_of(layout.table("e4")), "e5": rows_of(layout.table("e5"))}
    doc, frontiers = cycle.plan(layout, failed={"y"})
    deleted = cycle.roll_back(layout, frontiers)
    after = {"e4": rows_of(layout.table("e4")), "e5": rows_of(layout.table("e5"))}
    q = run.start("head", "--epochs", "1-2", "--resume", "1,4")
    y = run.start("body", "--epochs", "1-2", "--resume", "1,3")
    run.run("report", "--epoch", "1")
    run.run("source", "--epoch", "2")
    run.run("prepare", "--epoch", "2")
    run.run("report", "--epoch", "2")
    assert q.wait(timeout=300) == 0 and y.wait(timeout=300) == 0, f"logs in {logs}"
    text = {p.name: p.read_text() for p in sorted(logs.glob("*.log"))}
    return SimpleNamespace(layout=layout, doc=doc, frontiers=frontiers, deleted=deleted, before=before,
                           after=after, logs=text)


def test_the_records_of_the_running_loop_are_figure_7c(loop) -> None:
    chains = {p["id"]: p for p in loop.doc["processors"]}
    q = [c["frontier"] for c in chains["q"]["checkpoints"]]
    assert {"through": [1, 3]} in q and {"through": [1, 4]} in q and q[-1] == "top"
    assert chains["q"]["checkpoints"][-1]["M"] == {"e2": {"through": [1, 0]}, "e5": {"through": [1, 5]}}
    assert chains["y"]["failed"] and [c["frontier"] for c in chains["y"]["checkpoints"]][-2:] == [
        {"through": [1, 1]}, {"through": [1, 3]}]
    assert chains["r"]["checkpoints"][-1] == {"frontier": "top", "N": {"through": 0}, "M": {"e3": {"through": 0}}}
    assert chains["p"]["checkpoints"][-1]["D"] == {"e2": {"through": [1, 0]}}


def test_the_solver_answers_the_running_loop_as_the_hand_checked_figure(loop) -> None:
    expected = json.loads((SCENARIOS / "fig7c.expected.json").read_text())
    answer = load_scenario(loop.doc).answer()
    assert {p: a["frontier"] for p, a in answer["frontiers"].items()} == {
        p: a["frontier"] for p, a in expected["frontiers"].items()}
    assert answer["notification_frontiers"] == expected["notification_frontiers"]
    assert loop.frontiers == {"s": "top", "p": "top", "q": (1, 4), "y": (1, 3), "r": "top"}


def test_the_rollback_keeps_qs_logged_messages_and_drops_what_will_be_sent_again(loop) -> None:
    assert (1, 5) in loop.before["e4"] and (1, 5) not in loop.after["e4"]  # q sends (1, 5) again after (1, 4)
    assert loop.after["e4"][(1, 4)] == loop.before["e4"][(1, 4)]  # Q'(e4): y's next input, from q's log
    assert (1, 4) in loop.before["e5"] and max(loop.after["e5"]) == (1, 3)  # y discards: it sends (1, 4) again
    assert loop.deleted[loop.layout.table("e4")] == NODES and loop.deleted[loop.layout.table("e5")] == NODES


def test_after_the_restart_y_read_qs_logged_message_and_q_did_not_resend_it(loop) -> None:
    assert any("y: resuming at (1, 3)" in t for t in loop.logs.values())
    assert any("q: resuming at (1, 4)" in t for t in loop.logs.values())
    assert commits_at(loop.layout.table("e4"), (1, 4)) == 1
    assert commits_at(loop.layout.table("e4"), (1, 5)) == 2  # before the failure, and after the restart


def test_every_table_equals_an_uninterrupted_run(loop) -> None:
    want = oracle(3)
    for name in ("e3", "e4", "report"):
        assert rows_of(loop.layout.table(name)) == want[name], name
    y_state = rows_of(loop.layout.table("state-y"))
    assert y_state == {at: want["state-y"][at] for at in y_state} and (2, 7) in y_state
