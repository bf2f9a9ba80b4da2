"""The Falkirk view's data, without a server: checkpoint statuses, task order, recovery history."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from falkirk.plugins.grid_status import CheckpointStatus, grid_from_rows, unrecorded
from falkirk.plugins.view import DagTask, UNRECORDED, dag_view, plan_view, recovery_history, topological
from falkirk.policies.ids import CommitId, ProcessorId
from falkirk.policies.planning.recovery import FailedTask, RecoveryPlan, TaskPlan
from falkirk.policies.store.ledger import LedgerEntry, OutputRef


def commit(task: str, epoch: int, incarnation: int = 0) -> CommitId:
    return CommitId(dag="d", processor=ProcessorId(task=task), epoch=epoch, incarnation=incarnation)


def row(task: str, epoch: int, incarnation: int = 0, state: str | None = None, out: str = "scratch") -> dict:
    return LedgerEntry(dag_id="d", task_id=task, epoch=epoch, regime="eager_checkpoint" if state else "batch", run_id=f"epoch-{epoch}", try_number=1,
                       incarnation=incarnation, state_tier=state,
                       outputs=(OutputRef("output", "/o", out, 1, 1),)).to_row()


def test_a_rerun_after_a_rollback_shows_its_own_status_and_a_rollback_alone_shows_invalidated() -> None:
    rows = [row("m", 1, state="durable"), row("m", 2, state="scratch"), row("m", 2, 1, state="durable"),
            row("m", 3, state="scratch"), row("c", 1, out="durable"), row("c", 2, out="scratch")]
    gone = {commit("m", 2), commit("m", 3)}
    grid = grid_from_rows(["m", "c", "never"], rows, gone, last_epoch=4)
    assert grid.status == {"m": "DDI-", "c": "LS--", "never": "----"}
    assert grid.runs == {1: "epoch-1", 2: "epoch-2", 3: "epoch-3"} and grid.last_epoch == 4


def test_collected_epochs_show_as_collected_but_missing_ones_stay_missing() -> None:
    rows = [row("m", 1, state="durable"), row("m", 3, state="durable")]
    grid = grid_from_rows(["m"], rows, collected_through={"m": 2})
    assert [CheckpointStatus.of_code(c) for c in grid.status["m"]] == [
        CheckpointStatus.COLLECTED, CheckpointStatus.MISSING, CheckpointStatus.DURABLE]


def test_a_scratch_cell_whose_files_are_gone_shows_as_lost_and_a_durable_one_does_not() -> None:
    def entry(task: str, epoch: int, state: str | None, state_uri: str | None, out_uri: str, out_tier: str) -> dict:
        return LedgerEntry(dag_id="d", task_id=task, epoch=epoch, regime="lazy_checkpoint(every=2)", run_id=f"epoch-{epoch}", try_number=1, state_tier=state,
                           state_uri=state_uri, outputs=(OutputRef("output", out_uri, out_tier, 1, 1),)).to_row()

    rows = [entry("m", 1, "scratch", "/scratch/d/m/state", "/scratch/d/m/output", "scratch"),
            entry("m", 2, "durable", "/durable/d/m/state", "/scratch/d/m/output", "scratch"),
            entry("m", 3, "scratch", "/scratch/d/m/state", "/durable/d/m/output", "durable"),
            entry("k", 1, "scratch", "/scratch/d/k/state", "/scratch/d/k/output", "scratch")]
    asked = []

    def readable(uri, key):
        asked.append((uri, key.task_id, key.epoch))
        return not uri.startswith("/scratch/d/m")  # m's scratch directory was deleted

    grid = grid_from_rows(["m", "k"], rows, readable=readable)
    assert grid.status == {"m": "XDX", "k": "S--"}
    assert CheckpointStatus.of_code("X").label == "lost (scratch files gone)"
    # only scratch-only cells are read; a durable checkpoint is restorable whatever scratch holds
    assert {(t, e) for _, t, e in asked} == {("m", 1), ("m", 3), ("k", 1)}
    assert grid_from_rows(["m", "k"], rows).status == {"m": "SDS", "k": "S--"}  # without reading: as recorded


def test_tasks_are_ordered_upstream_first_with_ties_by_name() -> None:
    tasks = [DagTask("sink", None, ("b", "a")), DagTask("b", None, ("src",)), DagTask("a", None, ("src",)),
             DagTask("src", None, ())]
    assert [t.task_id for t in topological(tasks)] == ["src", "a", "b", "sink"]


def test_history_has_one_row_per_started_plan_newest_first_with_who_and_outcome() -> None:
    plan = RecoveryPlan("d", (FailedTask("a", 2),), 3, 7, (
        TaskPlan("a", "batch", 1, 1, (2,), None, (), (2, 3)),))
    other = RecoveryPlan("d", (FailedTask("a", 3),), 3, 9, (
        TaskPlan("a", "batch", 2, 2, (3,), None, (), (3,)),))
    t0 = datetime.now(timezone.utc) - timedelta(seconds=60)  # the default lease lasts 120 s
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    import json

    events = [
        {"plan_id": plan.plan_id, "event": "planned", "holder": "", "detail": json.dumps(plan.to_json()), "recorded_at": at(0)},
        {"plan_id": plan.plan_id, "event": "started", "holder": "alice", "detail": "", "recorded_at": at(1)},
        {"plan_id": plan.plan_id, "event": "failed", "holder": "alice", "detail": "boom", "recorded_at": at(2)},
        {"plan_id": other.plan_id, "event": "planned", "holder": "", "detail": json.dumps(other.to_json()), "recorded_at": at(3)},
        {"plan_id": other.plan_id, "event": "started", "holder": "bob", "detail": "", "recorded_at": at(4)},
        {"plan_id": "previewed-only", "event": "planned", "holder": "", "detail": json.dumps(other.to_json()), "recorded_at": at(5)},
    ]
    history = recovery_history(events)
    assert [(h["plan_id"], h["by"], h["outcome"]) for h in history] == [
        (other.plan_id, "bob", "running"), (plan.plan_id, "alice", "failed")]
    assert history[1]["failures"] == ["failed task a at epoch 2"] and history[1]["detail"] == "boom"
    assert (history[1]["rerun_count"], history[1]["clear_downstream_count"]) == (1, 2)
    assert history[1]["rerun"] == [["a", 2]] and history[0]["rerun"] == [["a", 3]]
    assert plan_view(plan)["rerun"] == [["a", 2]] and plan_view(plan)["clear_downstream"] == [["a", 2], ["a", 3]]
    assert history[0]["expires_at"] == at(124).isoformat()

    # bob's executor renews at 40 s, then dies: from 160 s on the history says the lease expired.
    events.append({"plan_id": other.plan_id, "event": "heartbeat", "holder": "bob", "detail": "", "recorded_at": at(40)})
    assert recovery_history(events)[0]["expires_at"] == at(160).isoformat()
    for e in events:
        e["recorded_at"] -= timedelta(seconds=200)
    expired = recovery_history(events)[0]
    assert expired["outcome"] == "expired" and "takes it over" in expired["detail"]


def test_a_success_without_a_current_ledger_row_is_flagged_and_preselected_unless_collected() -> None:
    """Airflow says success; the ledger has no row (clean 2), only a rolled-back one (model 2), or
    a collected one (clean 2 below a mark): the first two must run again, the third is history."""
    rows = [row("clean", 1, out="durable"), row("model", 1, state="durable"), row("model", 2, state="durable"),
            row("clean", 3, out="durable")]
    grid = grid_from_rows(["clean", "model"], rows, invalidated={commit("model", 2)})
    succeeded = [("clean", "epoch-1"), ("clean", "epoch-2"), ("clean", "epoch-3"), ("model", "epoch-1"),
                 ("model", "epoch-2"), ("model", "epoch-9")]
    assert unrecorded(grid, succeeded, collected_through={"clean": 2}) == [("model", 2, "epoch-2")]
    lost = unrecorded(grid, succeeded)
    assert lost == [("clean", 2, "epoch-2"), ("model", 2, "epoch-2")]
    tasks = [DagTask("clean", "batch(log_outputs=true)", ()), DagTask("model", "eager_checkpoint", ("clean",))]
    view = dag_view("d", tasks, grid, {("model", "epoch-3"): "failed"}, [], "/s", 4, True, unrecorded=lost)
    assert [(f["task_id"], f["epoch"], "why" in f) for f in view["failed"]] == [
        ("clean", 2, True), ("model", 2, True), ("model", 3, False)]
    assert view["airflow_states"] == {"clean": {"2": UNRECORDED}, "model": {"2": UNRECORDED, "3": "failed"}}


def test_the_grid_tells_how_far_an_uncommitted_epoch_got_inside_itself() -> None:
    """rank's epoch 3 failed after its checkpoint at iteration 20 of 30; its epoch 2 committed
    (its step checkpoints then mean nothing to a reader)."""
    from falkirk.plugins.view import epoch_progress
    from falkirk.policies.store.steps import StepCheckpoint

    cp = lambda epoch, step: StepCheckpoint(dag_id="d", task_id="rank", map_index=-1, epoch=epoch, incarnation=0, kind="iteration", step=step, of=30, uri="/t", tier="durable", version=0, rows=1)
    grid = grid_from_rows(["clean", "rank"], [row("clean", e, out="durable") for e in (1, 2, 3)]
                          + [row("rank", e, state="durable") for e in (1, 2)])
    tasks = [DagTask("clean", "batch(log_outputs=true)", ()), DagTask("rank", "eager_checkpoint", ("clean",))]
    progress = epoch_progress([cp(2, 10), cp(2, 20), cp(3, 10), cp(3, 20)])
    assert progress == {"rank": {2: "iteration 20 of 30", 3: "iteration 20 of 30"}}
    view = dag_view("d", tasks, grid, {("rank", "epoch-3"): "failed"}, [], "/s", 4, True, progress=progress)
    assert view["progress"] == {"rank": {"3": "iteration 20 of 30"}}
