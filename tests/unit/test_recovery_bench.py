"""The recovery benchmark's arithmetic (``make bench-recovery`` runs the shape itself): what it
counts as re-done, its clocks, and the targets it reports."""

from __future__ import annotations

import pytest

from benchmarks.recovery_bench import Recovery, _measure, report


def _ti(start: str, end: str, duration: float) -> dict:
    return {"start_date": start, "end_date": end, "duration": duration}


def test_measure_counts_only_the_redone_instances_and_times_from_the_recovery_start() -> None:
    started = 1_700_000_000.0  # 2023-11-14T22:13:20Z
    tis = {("rank", 4): _ti("2023-11-14T22:13:25Z", "2023-11-14T22:13:40Z", 15.0),
           ("stats", 4): _ti("2023-11-14T22:13:41Z", "2023-11-14T22:13:50Z", 9.0),
           ("rank", 6): _ti("2023-11-14T22:13:51Z", "2023-11-14T22:14:20Z", 29.0)}  # a new epoch
    got = _measure("Falkirk plan", tis, {("rank", 4), ("stats", 4)}, started)
    assert (got.redone, got.task_seconds, got.redone_after, got.caught_up_after) == (2, 24.0, 30.0, 60.0)


def test_report_gives_the_ratios_and_checks_the_targets() -> None:
    falkirk = Recovery("Falkirk plan", 12, 100.0, 50.0, 100.0)
    clear = Recovery("clear-downstream", 55, 600.0, 500.0, 520.0, "the restart's set")
    restart = Recovery("restart", 55, 600.0, 500.0, 520.0)
    text, ok = report([falkirk, clear, restart], epochs=12, lose_at=12)
    assert ok
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "Falkirk plan 12 100 50 100" in lines and "restart 55 600 500 520" in lines
    assert "task-seconds / clear-downstream's 0.17 <= 0.50" in lines
    assert "task-seconds / restart's 0.17 <= 0.20" in lines
    assert "restart's catch-up time / ours 5.2x >= 3.0x" in lines
    slow = Recovery("Falkirk plan", 12, 100.0, 50.0, 200.0)  # catches up only 2.6 times sooner
    assert report([slow, clear, restart], epochs=12, lose_at=12)[1] is False
    heavy = Recovery("Falkirk plan", 12, 150.0, 50.0, 100.0)  # a quarter of the restart's task-seconds
    assert report([heavy, clear, restart], epochs=12, lose_at=12)[1] is False


@pytest.mark.parametrize("argv", [["--lose-at", "1"], ["--epochs", "8", "--lose-at", "9"]])
def test_bad_arguments_name_the_flag(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.recovery_bench import main

    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and "--lose-at" in capsys.readouterr().err
