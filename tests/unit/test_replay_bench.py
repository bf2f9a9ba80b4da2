"""The replay benchmark's arithmetic (``make bench-replay`` runs the stacks itself): the critical
path of the re-runs, the window it counts, and the targets it reports."""

from __future__ import annotations

import json

import pytest

from benchmarks import replay_bench
from benchmarks.replay_bench import _when, critical_path, handoffs, main, report

TASKS = [{"task_id": "events", "downstream_task_ids": ["rank", "popularity"], "depends_on_past": False},
         {"task_id": "popularity", "downstream_task_ids": ["answers"], "depends_on_past": True},
         {"task_id": "rank", "downstream_task_ids": ["answers"], "depends_on_past": True},
         {"task_id": "answers", "downstream_task_ids": [], "depends_on_past": False}]
T0 = _when("2026-01-01T00:00:00Z")


def _ti(start: int, end: int) -> dict:
    return {"start_date": f"2026-01-01T00:{start // 60:02d}:{start % 60:02d}Z",
            "end_date": f"2026-01-01T00:{end // 60:02d}:{end % 60:02d}Z"}


def test_the_critical_path_follows_edges_and_depends_on_past_only() -> None:
    tis = {("events", 4): _ti(1, 3), ("rank", 4): _ti(3, 13), ("popularity", 4): _ti(3, 5),
           ("answers", 4): _ti(14, 16),
           # epoch 5: events ran long but answers waits on rank 5, which waits on rank 4 (past)
           ("events", 5): _ti(1, 12), ("rank", 5): _ti(13, 20), ("answers", 5): _ti(21, 22)}
    # rank 4 (10) -> rank 5 (7) -> answers 5 (1), after events 4 (2): 20 s
    assert critical_path(TASKS, tis, T0, T0 + 60) == (20.0, 7, 35.0)


def test_instances_outside_the_replay_window_do_not_count() -> None:
    tis = {("events", 4): _ti(1, 3), ("rank", 4): _ti(30, 40), ("answers", 4): _ti(41, 42),
           ("events", 5): _ti(50, 100),  # still running when the replay returned
           ("popularity", 4): {"start_date": None, "end_date": None}}  # never ran
    assert critical_path(TASKS, tis, T0 + 20, T0 + 60) == (11.0, 2, 11.0)


def test_report_gives_the_overhead_and_checks_the_targets() -> None:
    def result(plan: str, path: float, wall: float) -> dict:
        return {"plan": plan, "planned": 9, "instances": 9, "task_seconds": 2 * path, "critical_path": path,
                "wall": wall, "first_start": 2.0, "after_last": 1.0, "slots": 4 if plan == "demo" else 1}

    before = [result("demo", 100.0, 200.0), result("lost worker", 100.0, 300.0)]
    after = [result("demo", 100.0, 140.0), result("lost worker", 110.0, 150.0)]
    text, ok = report(before, after, "ea3a66b")
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "demo ea3a66b 9 100.0 200.0 100.0 2.0 1.0 2.00" in lines
    assert "lost worker this 9 110.0 150.0 40.0 2.0 1.0 1.36" in lines
    assert "demo 1 0.40 <= 0.50 1.40 <= 1.50" in lines and "lost worker 1 0.20 <= 0.50 1.36 <= 1.50" in lines
    assert ok
    # one slot: 220 task-seconds bound the lost worker's replay, not its 110 s critical path
    assert "demo this 4 50.0 100.0 1.40" in lines and "lost worker this 1 220.0 220.0 0.68" in lines
    slow = [result("demo", 100.0, 160.0), after[1]]  # overhead 60 s of 100: 0.6
    assert report(before, slow, "ea3a66b")[1] is False
    # replayed three times each: judged on the medians, one slow replay of three does not decide
    thrice_before = before + [result("demo", 100.0, 210.0), result("demo", 100.0, 190.0)]
    thrice_after = after + [result("demo", 100.0, 145.0), result("demo", 100.0, 190.0)]
    text, ok = report(thrice_before, thrice_after, "ea3a66b")
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "demo 3 0.45 <= 0.50 1.45 <= 1.50" in lines and ok


def test_handoffs_wait_from_the_last_predecessor_that_ran_inside_the_window() -> None:
    def ti(scheduled: int, queued: int, start: int, end: int) -> dict:
        return {**_ti(start, end), "scheduled_when": _ti(scheduled, scheduled)["start_date"],
                "queued_when": _ti(queued, queued)["start_date"]}

    tis = {("events", 4): ti(0, 1, 2, 3),     # no predecessor inside: released at the replay's start (1)
           ("rank", 4): ti(5, 6, 9, 13),      # released by events 4 at 3
           ("popularity", 4): ti(4, 4, 4, 5),  # released at 3 too
           ("answers", 4): ti(13, 15, 16, 17),  # released by rank 4 at 13
           ("rank", 5): ti(14, 14, 14, 20)}   # rank 4 (past) ended at 13; events 5 never ran
    assert handoffs(TASKS, tis, T0 + 1, T0 + 60) == {
        "released -> scheduled": 1.0, "scheduled -> queued": 1.0, "queued -> started": 1.0}


def test_an_airflow_setting_not_named_as_airflow_reads_it_is_refused_before_anything_starts(capsys) -> None:
    for bad in ("MIN_HEARTBEAT_INTERVAL=5", "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL"):
        with pytest.raises(SystemExit) as exit:
            main(["--measure", "/nonexistent/out.json", "--airflow", bad])
        assert exit.value.code == 2
        assert f"--airflow {bad!r}: give AIRFLOW__SECTION__KEY=VALUE" in capsys.readouterr().err


def test_measuring_one_checkout_starts_its_plans_afresh_and_keeps_the_other_checkout_and_the_runs(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "bench-replay"
    for kept in ("checkout-ea3a66b/README.md", "runs/0/this.json", "demo/stale"):
        (root / kept).parent.mkdir(parents=True, exist_ok=True)
        (root / kept).write_text("x")
    seen = []
    monkeypatch.setitem(replay_bench.PLANS, "demo", lambda where, env: seen.append(sorted(where.iterdir())) or
                        {"plan": "demo"})
    replay_bench.measure(tmp_path / "out.json", root, ["demo"])
    assert seen == [[]]  # the plan's own directory, emptied
    assert (root / "checkout-ea3a66b/README.md").exists() and (root / "runs/0/this.json").exists()
    assert json.loads((tmp_path / "out.json").read_text()) == [{"plan": "demo"}]
