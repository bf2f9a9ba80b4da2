"""The soak's fault schedule: a pure function of its seed, duration and mix."""

from __future__ import annotations

import doctest

from hypothesis import given, settings
from hypothesis import strategies as st

from devstack.soak import schedule as soak_schedule
from devstack.soak.schedule import HOLD_SECONDS, KINDS, WORKER_KINDS, FaultSchedule, Mix

mixes = st.dictionaries(st.sampled_from(sorted(KINDS)), st.integers(0, 5), min_size=1).filter(
    lambda w: any(w.values())).map(Mix)


def test_the_docstring_examples_hold() -> None:
    from devstack.soak import pipelines as soak_pipelines
    from devstack.soak import run as soak_run

    assert doctest.testmod(soak_schedule, optionflags=doctest.ELLIPSIS).failed == 0
    assert doctest.testmod(soak_pipelines).attempted >= 3 and doctest.testmod(soak_pipelines).failed == 0
    assert doctest.testmod(soak_run).attempted >= 2 and doctest.testmod(soak_run).failed == 0


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), duration=st.floats(0.5, 7200), mix=mixes,
       mean_gap=st.floats(1, 600), min_gap=st.floats(0, 120))
def test_a_schedule_is_its_seeds_and_keeps_its_bounds(seed, duration, mix, mean_gap, min_gap) -> None:
    drawn = FaultSchedule.draw(seed, duration, mix, mean_gap=mean_gap, min_gap=min_gap)
    assert drawn == FaultSchedule.draw(seed, duration, mix, mean_gap=mean_gap, min_gap=min_gap)
    times = [f.at for f in drawn.faults]
    assert times == sorted(times)
    assert all(min(60, duration / 6) <= t <= duration - min(120, duration / 6) for t in times)
    assert all(b - a >= min_gap - 1e-9 for a, b in zip(times, times[1:]))  # float sums
    for fault in drawn.faults:
        assert mix.weights[fault.kind] > 0
        assert (fault.target in ("worker-a", "worker-b")) == (fault.kind in WORKER_KINDS)
        low, high = HOLD_SECONDS.get(fault.kind, (None, None))
        assert (fault.hold is None) if low is None else (low <= fault.hold <= high)
    assert sum(drawn.counts().values()) == len(drawn.faults)


def test_kinds_are_drawn_by_their_weights() -> None:
    drawn = FaultSchedule.draw(3, 400_000, Mix.parse("gc=3,kill-job=1"), mean_gap=60, min_gap=0)
    counts = drawn.counts()
    assert set(counts) == {"gc", "kill-job"} and sum(counts.values()) > 5_000
    assert 0.72 < counts["gc"] / sum(counts.values()) < 0.78


def test_different_seeds_draw_different_schedules() -> None:
    drawn = {FaultSchedule.draw(seed, 3600).faults for seed in range(20)}
    assert len(drawn) == 20


def test_the_report_counts_faults_by_kind_with_their_times_to_caught_up() -> None:
    from devstack.soak.nemesis import Injected
    from devstack.soak.report import by_kind, markdown, render
    from devstack.soak.run import Recovery, SoakReport
    from devstack.soak.schedule import Fault

    faults = (Fault(60, "kill-worker", "worker-a"), Fault(90, "gc"), Fault(130, "kill-worker", "worker-b"))
    report = SoakReport(FaultSchedule(5, 600, Mix.parse("kill-worker=2,gc=1"), faults, mean_gap=40),
                        dags=["falkirk_figure1", "falkirk_shards"], epochs={"falkirk_figure1": 31, "falkirk_shards": 12},
                        caught_up_in=12.0)
    report.injected = [Injected(faults[0], 60.4, "worker-a killed", recoveries=["p1"], caught_up_in=48.0),
                       Injected(faults[1], 90.2, "falkirk gc exited 0", caught_up_in=6.0),
                       Injected(faults[2], 131.0, "worker-b killed", recoveries=["p2"], caught_up_in=70.0)]
    report.recoveries = [Recovery("p1", 7, 80.0, "failed: rank", replayed_in=21.0),
                         Recovery("p2", 3, 160.0, "failed: totals", replayed_in=15.0, dag_id="falkirk_shards")]
    assert [(k.kind, k.faults, k.planned, k.median, k.longest) for k in by_kind(report)] == [
        ("kill-worker", 2, 2, 59.0, 70.0), ("gc", 1, 0, 6.0, 6.0)]
    text = render(report)
    assert "zero discrepancies; this schedule again: make soak SEED=5 DURATION=10m MIX=kill-worker=2,gc=1 MEAN_GAP=40 " \
           "DAGS=figure1,shards" in text
    assert "epochs: falkirk_figure1 31, falkirk_shards 12" in text
    assert "faults injected: 3 of 3 scheduled, 2 kinds\n" in text
    report.injected[1].hit = "not landed: a batch delivered incomplete still awaited its recovery at the end"
    assert "faults injected: 2 of 3 scheduled, 1 kinds (1 did not land: below)" in render(report)
    report.injected[1].hit = "falkirk gc exited 0"
    assert "  kill-worker              2            2                59s   70s" in text
    assert "     160s  falkirk_shards plan p2: 3 re-runs, replayed in 15s  [failed: totals]" in text
    table = markdown(report)
    assert "| kill-worker | 2 | 2 | 59s | 70s |" in table and "| gc | 1 | 0 | 6s | 6s |" in table
    assert "Plans: 2, 3 to 7 task instances re-run (median 5); replays took 15s to 21s." in table
    report.discrepancies = ["table rank/state: 5071 rows against 5072"]
    assert "1 DISCREPANCIES" in render(report) and report.ok is False


def test_a_shifted_worker_clock_runs_ahead_by_what_its_file_says(tmp_path) -> None:  # noqa: ANN001
    """``clock-shift``: an interpreter started on a worker with the soak's clock directory on its
    path stamps the ledger's rows ahead, and follows the file when it changes (a warm process)."""
    import os
    import subprocess
    import sys

    from devstack.soak.nemesis import CLOCK_DIR, CLOCKS_ENV

    (tmp_path / "worker-a").write_text("120\n")
    probe = ("import datetime, time\n"
             "import falkirk.policies.store.ledger as ledger\n"
             "utc = datetime.timezone.utc\n"
             "print(round(time.time() - datetime.datetime.now().timestamp()),\n"
             "      round((ledger.datetime.now(utc) - datetime.datetime.now(utc)).total_seconds()))\n"
             f"open({str(tmp_path / 'worker-a')!r}, 'w').write('0')\n"
             "time.sleep(1.1)\n"
             "print(round(time.time() - datetime.datetime.now().timestamp()))\n")
    env = {**os.environ, "PYTHONPATH": str(CLOCK_DIR), CLOCKS_ENV: str(tmp_path)}
    on = subprocess.run([sys.executable, "-c", probe], env={**env, "FALKIRK_WORKER": "worker-a"},
                        capture_output=True, text=True, timeout=60)
    assert on.stdout.split() == ["120", "120", "0"], on.stderr
    elsewhere = subprocess.run([sys.executable, "-c", probe], env={**env, "FALKIRK_WORKER": "worker-b"},
                               capture_output=True, text=True, timeout=60)
    assert elsewhere.stdout.split() == ["0", "0", "0"], elsewhere.stderr


def test_the_soak_reads_the_replays_falkirk_watch_starts_from_its_output() -> None:
    """The soak reports the recoveries ``falkirk watch`` replays by itself from the lines it prints;
    the lines below are those the watch and the replay print (their sources are checked too)."""
    from pathlib import Path

    from devstack.soak.run import WATCH_DONE, WATCH_REPLAYING

    plugins = Path(__file__).resolve().parents[2] / "plugins"
    assert "replaying plan {recovery.plan_id} for the lost worker {worker}" in (plugins / "watch.py").read_text()
    assert "done, {len(rerun)} task instances re-ran in" in (plugins / "replay" / "executor.py").read_text()
    line = "falkirk_shards: replaying plan 2d0ea75ef995 for the lost worker worker-a (falkirk:auto_recover)"
    assert WATCH_REPLAYING.match(line).groups() == ("falkirk_shards", "2d0ea75ef995", "worker-a")
    assert WATCH_DONE.match("plan 2d0ea75ef995: done, 31 task instances re-ran in 48s").groups() == (
        "2d0ea75ef995", "31")
    assert WATCH_REPLAYING.match("falkirk watch: worker worker-a has not answered for more than 15s: lost") is None


def test_a_dag_held_after_a_stale_plan_asks_for_epochs_again_once_its_runs_have_ended_and_none_failed() -> None:
    """A plan that went stale before its replay began holds the DAG's triggers while its runs
    in flight finish. When they end with none failed (``falkirk watch`` recovered them), nothing
    is left to plan and no replay will end to release the hold: the soak triggers again. (The
    soak's Airflow client is stood in for by one that records the triggers asked for.)"""
    from types import SimpleNamespace

    from devstack.soak.run import DagUnderSoak

    asked: list[str] = []
    soaked = DagUnderSoak.__new__(DagUnderSoak)
    soaked.soak = SimpleNamespace(inputs=SimpleNamespace(latest_epoch=10))
    soaked.dag, soaked.dag_id = SimpleNamespace(fed=None), "falkirk_regions"
    soaked.client = SimpleNamespace(trigger=lambda dag_id, run_id, date: asked.append(run_id))
    soaked.clock = SimpleNamespace(logical_date=lambda epoch: epoch)
    soaked.latest_epoch, soaked.holding, soaked.replay, soaked.replay_due = 4, True, None, None
    ended = [{"state": "success"}] * 4

    soaked.trigger(ended[:3] + [{"state": "running"}])  # a run still in flight: held
    soaked.trigger(ended[:3] + [{"state": "failed"}])  # a run failed: a user plans it first
    soaked.replay = object()
    soaked.trigger(ended)  # a replay under way: held
    assert (asked, soaked.holding) == ([], True)
    soaked.replay = None
    soaked.trigger(ended)
    assert (asked, soaked.holding, soaked.latest_epoch) == (["epoch-5"], False, 5)


def test_a_batch_spoiled_after_the_last_epoch_is_reported_as_not_landed_and_the_soak_can_catch_up() -> None:
    """A bad-input fault spoils the next epoch's batch; when the soak's duration ends before that
    epoch is triggered, nothing ever reads it, so it is no fault to recover from (it kept the
    soak from catching up until its timeout)."""
    from types import SimpleNamespace

    from devstack.soak.nemesis import Injected
    from devstack.soak.report import landed
    from devstack.soak.schedule import Fault
    from devstack.soak.run import DagUnderSoak

    said: list[str] = []
    soaked = DagUnderSoak.__new__(DagUnderSoak)
    soaked.soak = SimpleNamespace(ending=True, elapsed=lambda: 1203.0, progress=said.append)
    soaked.dag, soaked.dag_id, soaked.latest_epoch = SimpleNamespace(fed=None), "falkirk_figure1", 7
    spoiled = Injected(Fault(1046.5, "bad-input"), 1048.0, "clickstream epoch 8 delivered with a tenth of its "
                       "events missing", epoch=8, settled=False)
    soaked.spoiled, soaked.delivered_again = {8: spoiled}, {}

    soaked._deliver_again([{"dag_run_id": f"epoch-{e}", "state": "success"} for e in range(1, 8)])

    assert (soaked.spoiled, soaked.delivered_again, spoiled.settled) == ({}, {}, True)
    assert landed(SimpleNamespace(injected=[spoiled])) == []
    assert said == ["  1203s  falkirk_figure1: clickstream epoch 8 was spoiled after the last epoch: nothing read it"]
