"""Each rule of the replay (``falkirk.policies.replay``) against the fault that made it, decided
over views built by hand: no Airflow, no store, no network (the rules read none)."""

from __future__ import annotations

import builtins
import importlib
import socket
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from falkirk.policies.ids import CommitId, ProcessorId
from falkirk.policies.planning.recovery import LostWorker
from falkirk.policies.planning.replay_decisions import AirflowRun, RolledBack
from falkirk.policies.replay import (
    AirflowView,
    Clear,
    Done,
    Invalidate,
    MarkSuccess,
    Memory,
    QueueRun,
    RestorePairs,
    SetRunState,
    SettleSecondRuns,
    Stopped,
    StoreView,
    Working,
    decide,
)
from falkirk.policies.replay import finishing, rules, waiting
from falkirk.policies.replay.rules import Pass

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)
TASKS = ("source", "model", "sink")
DOWN = {"source": frozenset({"model", "sink"}), "model": frozenset({"sink"}), "sink": frozenset()}


@dataclass(frozen=True)
class Row:
    """A current ledger row as the replay reads it."""

    processor: str
    epoch: int
    incarnation: int = 0
    rollbacks_seen: int | None = 0
    committed_at: datetime = AT
    dag_id: str = "d"

    @property
    def commit_id(self) -> CommitId:
        return CommitId(dag=self.dag_id, processor=ProcessorId.parse(self.processor), epoch=self.epoch,
                        incarnation=self.incarnation)


def plan(rerun: set[tuple[str, int]], last: int = 4, failures: tuple = ()) -> SimpleNamespace:
    tasks = tuple(SimpleNamespace(task_id=t, rerun=tuple(sorted(e for u, e in rerun if u == t)),
                                  regime="eager_checkpoint" if t != "source" else "ephemeral") for t in TASKS)
    return SimpleNamespace(dag_id="d", plan_id="p1", last_epoch=last, failures=failures, tasks=tasks,
                           rerun_set=lambda: frozenset(rerun))


def run(states: dict[str, str | None], state: str | None = "running", queue: str = "default") -> AirflowRun:
    return AirflowRun(states, dict.fromkeys(states, queue), state)


def memory(p: SimpleNamespace, epochs: range = range(1, 7), **changes) -> Memory:
    return Memory.fresh(p.rerun_set(), {e: f"epoch-{e}" for e in epochs}, 0.0, p.last_epoch).but(**changes)


def at(p, store: StoreView, airflow: AirflowView, now: float = 0.0, stall: float = 600.0) -> Pass:
    return Pass(p, store, airflow, now, stall)


# -- the first pass ---------------------------------------------------------------------------


def test_sweep_later_rows_rolls_back_a_later_row_whose_job_checked_the_rollbacks_before_the_plan():
    """A DAG run that arrived while the replay started read model's rolled-back epoch 4: its row
    checked the rollbacks at version 2, before the plan's (3); sink's row of epoch 5 checked after
    it but read model 5, which the sweep takes, so it goes too; source (upstream of the re-run,
    ephemeral) is not affected and stays."""
    p = plan({("model", 4)})
    rows = {("model", 5): Row("model", 5, rollbacks_seen=2), ("sink", 5): Row("sink", 5, rollbacks_seen=4),
            ("source", 6): Row("source", 6, rollbacks_seen=2)}
    store = StoreView(rows=rows, rolled_back=(RolledBack("model", 4, 3),), rolled_back_at=AT, downstream=DOWN)
    out = rules.sweep_later_rows(at(p, store, AirflowView(runs={})), memory(p))
    (action,) = out.actions
    assert isinstance(action, Invalidate) and action.name.startswith("p1+later:")
    assert sorted((r.processor, r.epoch) for r in action.rows) == [("model", 5), ("sink", 5)]
    assert rules.sweep_later_rows(at(p, StoreView(rows=rows, downstream=DOWN), AirflowView(runs={})),
                                  memory(p)).actions == ()  # the plan rolled nothing back


def test_settle_kept_instances_marks_a_refused_rerun_of_a_kept_epoch_furthest_downstream_first():
    """A Clear of a completed epoch the plan keeps was refused and failed what is downstream: left
    failed, the re-runs downstream would wait for ever."""
    p = plan({("sink", 4)})
    kept = {("model", 4): Row("model", 4), ("source", 4): Row("source", 4)}
    store = StoreView(rows=kept, completed=frozenset(kept), downstream=DOWN)
    airflow = AirflowView(runs={4: run({"source": "success", "model": "failed", "sink": "upstream_failed"}, "failed")})
    out = rules.settle_kept_instances(at(p, store, airflow), memory(p))
    assert [(a.row.processor, a.run_id) for a in out.actions if isinstance(a, MarkSuccess)] == [("model", "epoch-4")]
    assert out.actions[-1].line == "plan p1: marked 1 refused re-runs of kept epochs success"
    assert out.memory.marked == {"epoch-4"}


def test_restore_lost_pairs_gives_a_partition_that_lost_both_replicas_two_new_ones():
    p = plan({("stats[2]", 4), ("stats[3]", 4)})
    store = StoreView(rows={}, lost_partitions=frozenset({("stats", 1), ("other", 0)}))
    out = rules.restore_lost_pairs(at(p, store, AirflowView(runs={})), memory(p))
    assert out.actions == (RestorePairs(partitions=(("stats", 1),)),)


def test_clear_the_plan_leaves_what_already_reran_and_clears_what_a_resumed_replay_must():
    """Started again after a kill: model 4 already re-ran (committed, success), sink 4 is running
    (left to finish), model 5 failed after its commit in a completed epoch (marked success: a
    re-run would be refused), sink 5 failed without a commit (cleared), and model 6 waits on the
    queue of the lost worker (cleared, so that placement moves it)."""
    p = plan({("model", 4), ("sink", 4), ("model", 5), ("sink", 5), ("model", 6)}, last=6,
             failures=(LostWorker("worker-a"),))
    store = StoreView(rows={("model", 4): Row("model", 4), ("model", 5): Row("model", 5)},
                      completed=frozenset({("model", 5)}))
    airflow = AirflowView(runs={4: run({"model": "success", "sink": "running"}),
                                5: run({"model": "failed", "sink": "failed"}, "failed"),
                                6: AirflowRun({"model": "queued"}, {"model": "worker-a"}, "running")})
    out = rules.clear_the_plan(at(p, store, airflow), memory(p))
    assert [(a.epoch, a.tasks) for a in out.actions if isinstance(a, Clear)] == [(5, ("sink",)), (6, ("model",))]
    assert [a.row.processor for a in out.actions if isinstance(a, MarkSuccess)] == ["model"]
    assert out.memory.stage == "rerun" and out.memory.cleared == {"epoch-5": ("sink",), "epoch-6": ("model",)}


def test_clear_the_plan_leaves_skipped_a_replica_its_twin_took_over():
    """The soak met one cleared 23 times: it ends skipped at once, finding itself dead."""
    p = plan({("stats[2]", 4), ("stats[3]", 4)})
    store = StoreView(rows={}, taken_over=frozenset({ProcessorId.parse("stats[2]")}))
    airflow = AirflowView(runs={4: run({"stats[2]": "skipped", "stats[3]": "failed"}, "failed")})
    out = rules.clear_the_plan(at(p, store, airflow), memory(p))
    assert [(a.epoch, a.tasks) for a in out.actions] == [(4, ("stats[3]",))]


# -- waiting ------------------------------------------------------------------------------------


def test_report_changes_says_each_state_once_and_restarts_the_stall_clock():
    p = plan({("model", 4)})
    airflow = AirflowView(runs={4: run({"model": "running"})})
    first = waiting.report_changes(at(p, StoreView(rows={}), airflow, now=3.0), memory(p, stage="rerun"))
    assert [line.split()[-2:] for line in first.lines] == [["model", "running"]] and first.memory.changed == 3.0
    again = waiting.report_changes(at(p, StoreView(rows={}), airflow, now=9.0), first.memory)
    assert again.lines == () and again.memory.changed == 3.0


def test_settle_refused_redos_marks_a_producer_killed_after_its_commit_and_clears_one_not_completed():
    """A task process killed after its commit is run again by the next scheduler, and that attempt
    finds the epoch committed: marked success when the epoch completed (the applier emits the
    asset events the killed attempt did not first), else cleared once to finish as a no-op."""
    p = plan({("model", 4), ("sink", 4)})
    store = StoreView(rows={("model", 4): Row("model", 4), ("sink", 4): Row("sink", 4)},
                      completed=frozenset({("model", 4)}))
    airflow = AirflowView(runs={4: run({"model": "failed", "sink": "failed"})})
    m = memory(p, stage="rerun")
    out = waiting.settle_refused_redos(at(p, store, airflow, now=5.0), m)
    assert [type(a).__name__ for a in out.actions] == ["MarkSuccess", "Clear", "Say"]  # said once done
    assert out.actions[1].tasks == ("sink",) and isinstance(out.status, Working)
    assert waiting.settle_refused_redos(at(p, store, airflow), out.memory).actions == ()  # once each


def test_stop_on_a_failed_rerun_names_it_and_how_to_resume():
    p = plan({("model", 4)})
    out = waiting.stop_on_a_failed_rerun(at(p, StoreView(rows={}), AirflowView(runs={4: run({"model": "failed"})})),
                                         memory(p, stage="rerun"))
    assert isinstance(out.status, Stopped) and not out.status.stalled
    assert out.status.reason.startswith("model of epoch 4 (epoch-4) ended failed") and "falkirk replay p1" in out.status.reason


def test_let_earlier_epochs_through_queues_again_a_later_run_holding_the_only_slot():
    """max_active_runs=1: epoch 5 runs, its stateful task waiting for epoch 4, which the replay
    cleared and which stays queued: neither ever moves."""
    p = plan({("model", 4)})
    active = ({"dag_run_id": "epoch-4", "state": "queued", "logical_date": "4"},
              {"dag_run_id": "epoch-5", "state": "running", "logical_date": "5"})
    airflow = AirflowView(runs={4: run({"model": None}, "queued")}, active=active, max_active_runs=1)
    out = waiting.let_earlier_epochs_through(at(p, StoreView(rows={}), airflow), memory(p, stage="rerun"))
    assert [(type(a).__name__, getattr(a, "run_id", None)) for a in out.actions] == [("QueueRun", "epoch-5"), ("Say", None)]
    assert "epoch-5 held one of the DAG's max_active_runs=1 slots" in out.actions[1].line
    assert out.memory.queued_again == {"epoch-5"}


def test_the_stall_detector_stops_on_slots_the_replay_cannot_free_naming_them():
    p = plan({("model", 4)})
    active = ({"dag_run_id": "epoch-4", "state": "queued", "logical_date": "4"},
              {"dag_run_id": "manual", "state": "running", "logical_date": "1"})
    airflow = AirflowView(runs={4: run({"model": None}, "queued")}, active=active, max_active_runs=1)
    m = memory(p, stage="rerun")
    assert waiting.let_earlier_epochs_through(at(p, StoreView(rows={}), airflow, now=60.0, stall=100.0), m).status is None
    stopped = waiting.let_earlier_epochs_through(at(p, StoreView(rows={}), airflow, now=101.0, stall=100.0), m).status
    assert isinstance(stopped, Stopped) and stopped.stalled and "held by manual" in stopped.reason


def test_queue_failed_runs_queues_again_a_run_failed_late_by_the_scheduler_once_quiet():
    """Airflow clears the instances downstream of one the replay marks success but leaves their run
    failed, and never starts an instance of a failed run."""
    p = plan({("sink", 4)})
    airflow = AirflowView(runs={4: run({"model": "success", "sink": None}, "failed")})
    m = memory(p, stage="rerun")
    assert waiting.queue_failed_runs(at(p, StoreView(rows={}), airflow, now=5.0), m).actions == ()  # not quiet yet
    out = waiting.queue_failed_runs(at(p, StoreView(rows={}), airflow, now=11.0), m)
    assert [(type(a).__name__, getattr(a, "run_id", None)) for a in out.actions] == [("QueueRun", "epoch-4"), ("Say", None)]
    assert out.memory.looked == 11.0


# -- the last stages ----------------------------------------------------------------------------


def test_later_runs_are_watched_then_cleared_and_a_run_deleted_by_a_discard_is_left_out():
    """Epochs 5 and 6 arrived during the recovery of epoch 4: model 5 failed waiting for the
    rolled-back epoch and is re-run; epoch 6's run was deleted by a discard (its rows are rolled
    back) and is left out."""
    p = plan({("model", 4)})
    m = memory(p, range(1, 5), stage="rerun")
    store = StoreView(rows={}, run_ids={5: "epoch-5", 6: "epoch-6"}, downstream=DOWN)
    looked = finishing.look_at_later_runs(at(p, store, AirflowView(runs={})), m)
    assert looked.memory.stage == "later" and {5, 6} <= looked.memory.watch
    airflow = AirflowView(runs={5: run({"model": "failed", "sink": "upstream_failed"}, "failed")},
                          missing=frozenset({6}))
    out = finishing.clear_later_runs(at(p, store, airflow), looked.memory)
    assert [(a.epoch, a.tasks) for a in out.actions] == [(5, ("model", "sink"))]
    assert out.memory.stage == "later-wait" and out.memory.todo == {("model", 5), ("sink", 5)}
    done = AirflowView(runs={5: run({"model": "success", "sink": "success"}, "success")}, missing=frozenset({6}))
    rows = {("model", 5): Row("model", 5, rollbacks_seen=9), ("sink", 5): Row("sink", 5, rollbacks_seen=9)}
    again = finishing.clear_later_runs(at(p, StoreView(rows=rows, run_ids=store.run_ids, downstream=DOWN), done),
                                       out.memory.but(stage="later"))
    assert again.actions == () and again.memory.stage == "settle"


def test_settle_runs_sets_done_runs_success_queues_cleared_ones_and_names_the_rest():
    p = plan({("model", 4), ("model", 5), ("model", 6)}, last=6)
    m = memory(p, stage="settle", cleared={"epoch-4": ("model",), "epoch-5": ("model",), "epoch-6": ("model",)})
    airflow = AirflowView(runs={4: run({"model": "success"}, "failed"), 5: run({"model": "success", "sink": None},
                                                                                 "failed"),
                                6: run({"model": "success", "notify": "failed"}, "failed")})
    out = finishing.settle_runs(at(p, StoreView(rows={}), airflow), m)
    assert [(type(a).__name__, getattr(a, "run_id", None)) for a in out.actions] == [
        ("SetRunState", "epoch-4"), ("Say", None), ("QueueRun", "epoch-5"), ("Say", None)]
    assert any("epoch-6 stays failed: notify is failed" in line for line in out.lines)
    assert out.memory.stage == "hand-back"


def test_hand_back_slots_keeps_a_later_run_from_taking_the_slot_of_a_run_queued_again():
    """Airflow starts queued runs never looked at first: epoch 7, triggered meanwhile, takes the
    slot of epoch 5 (queued again), and its stateful task waits on epoch 5 for ever."""
    p = plan({("model", 4)})
    active = ({"dag_run_id": "epoch-5", "state": "queued", "logical_date": "5"},
              {"dag_run_id": "epoch-7", "state": "running", "logical_date": "7"})
    m = memory(p, stage="hand-back", queued_again=frozenset({"epoch-5"}))
    out = finishing.hand_back_slots(at(p, StoreView(rows={}), AirflowView(runs={}, active=active,
                                                                          max_active_runs=1)), m)
    assert [(type(a).__name__, getattr(a, "run_id", None)) for a in out.actions] == [("QueueRun", "epoch-7"), ("Say", None)]
    assert out.lines[0].endswith("waiting for the runs it queued again to start: epoch-5")
    paused = finishing.hand_back_slots(at(p, StoreView(rows={}), AirflowView(runs={}, active=active, paused=True)), m)
    assert paused.actions == () and paused.memory.stage == "second-runs"
    free = finishing.hand_back_slots(at(p, StoreView(rows={}), AirflowView(runs={})), m)
    assert free.memory.stage == "second-runs"


def test_the_last_stage_settles_a_consumers_second_runs_and_the_replay_is_done():
    p = plan({("model", 4)})
    d = decide(p, StoreView(rows={}), AirflowView(runs={}), memory(p, stage="second-runs"), now=0.0)
    assert d.actions == (SettleSecondRuns(),) and d.status == Done(1)


# -- decide ---------------------------------------------------------------------------------------


def test_decide_runs_a_replay_from_its_first_pass_to_done():
    """The stages in order over a plan with nothing left behind: clear, wait, later runs (none),
    settle (the failed run set to success), hand back (nothing), second runs, done."""
    p = plan({("model", 4)})
    m = memory(p, range(1, 5))
    failed = AirflowView(runs={4: run({"source": "success", "model": "failed"}, "failed")})
    statuses, kinds = [], []
    views = [failed] + [AirflowView(runs={4: run({"source": "success", "model": "success"}, "failed")})] * 6
    for now, airflow in enumerate(views):
        d = decide(p, StoreView(rows={}), airflow, m, now=float(now))
        m = d.memory
        statuses.append(type(d.status).__name__)
        kinds += [type(a).__name__ for a in d.actions]
        if isinstance(d.status, Done):
            break
    assert kinds == ["Clear", "SetRunState", "Say", "SettleSecondRuns"]
    assert statuses[-1] == "Done" and m.stage == "done"


def test_a_pass_that_moves_on_without_acting_goes_on_over_the_same_views_until_it_acts():
    """No later run to clear: the same pass settles (epoch 4's failed run set to success) and
    ends there, as that changes what the next stage reads; the next pass hands back (nothing)
    and settles the second runs, done. ``later`` itself is always observed afresh, and only
    entered when the ledger names a later run: without one, the pass that sees the last re-run
    done settles, hands back and ends the replay."""
    p = plan({("model", 4)})
    m = memory(p, range(1, 5), stage="later", cleared={"epoch-4": ("model",)})
    airflow = AirflowView(runs={4: run({"source": "success", "model": "success"}, "failed")})
    first = decide(p, StoreView(rows={}, downstream=DOWN), airflow, m, now=0.0)
    assert [type(a).__name__ for a in first.actions] == ["SetRunState", "Say"]
    assert first.memory.stage == "hand-back"
    settled = AirflowView(runs={4: run({"source": "success", "model": "success"}, "success")})
    second = decide(p, StoreView(rows={}), settled, first.memory, now=1.0)
    assert second.actions == (SettleSecondRuns(),) and second.status == Done(1)
    waited = memory(p, range(1, 5), stage="rerun", cleared={"epoch-4": ("model",)})
    ended = decide(p, StoreView(rows={}), settled, waited, now=0.0)
    assert ended.actions == (SettleSecondRuns(),) and ended.status == Done(1)
    later = StoreView(rows={}, run_ids={5: "epoch-5"})
    looked = decide(p, later, settled, waited, now=0.0)
    assert looked.memory.stage == "later" and 5 in looked.memory.watch
    assert looked.actions == () and looked.status.again


def test_the_rules_import_nothing_from_plugins_and_open_no_connection(monkeypatch):
    """``falkirk.policies.replay`` loaded afresh with ``falkirk.plugins`` unimportable and every
    socket refused, then a whole first pass decided."""
    real_import = builtins.__import__

    def guarded(name, *args, **kwargs):
        if name.startswith(("falkirk.plugins", "airflow", "pyspark", "deltalake", "httpx", "boto3")):
            raise ImportError(f"the replay's rules must not import {name}")
        return real_import(name, *args, **kwargs)

    def no_network(*args, **kwargs):
        raise OSError("the replay's rules must not open a connection")

    for name in [n for n in sys.modules if n.startswith("falkirk.policies.replay")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(builtins, "__import__", guarded)
    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    fresh = importlib.import_module("falkirk.policies.replay")
    p = plan({("model", 4)})
    d = fresh.decide(p, fresh.StoreView(rows={}), fresh.AirflowView(runs={4: run({"model": "failed"}, "failed")}),
                     fresh.Memory.fresh(p.rerun_set(), {4: "epoch-4"}, 0.0, 4), now=0.0)
    assert [a.tasks for a in d.actions] == [("model",)]


@pytest.mark.parametrize("module", ["views", "actions", "rules", "waiting", "finishing", "decide"])
def test_the_replay_modules_stay_small(module: str):
    """Under 400 lines a module, under 60 a function: each rule is read in one look."""
    import ast
    import inspect

    source = inspect.getsource(importlib.import_module(f"falkirk.policies.replay.{module}"))
    assert len(source.splitlines()) < 400
    long = [f.name for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef)
            and f.end_lineno - f.lineno >= 60]
    assert long == []


def test_every_action_is_a_value():
    assert QueueRun(run_id="r", note="n") == QueueRun(run_id="r", note="n")
    assert SetRunState(run_id="r", state="success", note="n").state == "success"
