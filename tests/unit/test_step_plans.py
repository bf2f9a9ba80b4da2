"""Recovery plans with checkpoints inside an epoch, against an independent brute force.

The pipeline of ``test_recovery`` (source → clean → model → sink, four regimes). A task
instance fails at epoch ``at`` after some checkpoints inside it, at lex times (at, 1),
(at, 2), ...; a scratch tier may be lost as well, or an upstream epoch declared bad. The
oracle enumerates every assignment of a lex frontier (epochs kept, and how far into the next
epoch) per task, keeps the consistent ones in plain terms (a task keeps nothing its producer
will redo; a checkpoint inside an epoch needs its table and every input it read), and takes
the greatest. The plan's frontiers, re-run set and resume points must be exactly that.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings, strategies as st

from falkirk.policies.ids import CommitId, ProcessorId
from falkirk.policies.planning.recovery import BadEpoch, FailedTask, LostScratch, plan_recovery
from falkirk.policies.store.steps import StepCheckpoint
from tests.unit.test_recovery import GRAPH, REGIMES, TASKS, UPSTREAM, history, oracle, readable_when

OF = 4  # checkpoints inside an epoch: iterations 1..4 (of 4; the last one is the epoch's commit)


def step_checkpoints(task: str, at: int, done: int) -> list[StepCheckpoint]:
    """The checkpoints a failed attempt of (task, at) committed before it died: steps 1..done."""
    regime = REGIMES[task]
    tier = regime.step_tier(at).value
    deps = [CommitId(dag="pipe", processor=ProcessorId(task=UPSTREAM[task]), epoch=at)] if task in UPSTREAM else []
    if regime.keeps_state and at > 1:
        deps.append(CommitId(dag="pipe", processor=ProcessorId(task=task), epoch=at - 1))
    return [StepCheckpoint(dag_id="pipe", task_id=task, map_index=-1, epoch=at, incarnation=0, kind="iteration", step=k, of=OF, uri=f"/{tier}/{task}/steps-iteration-{k}", tier=tier,
                           version=0, rows=5, depends_on=tuple(deps)) for k in range(1, done + 1)]


def lex_oracle(rows, epochs: int, failed: tuple[str, int], done: int, bad: tuple[str, int] | None,
               scratch_lost: bool) -> dict[str, tuple[int, int]]:
    """The greatest consistent lex frontier (last epoch kept, steps kept of the next) per task."""
    frontiers, _ = oracle(rows, epochs, bad, scratch_lost)
    task, at = failed
    untrusted = set()
    if bad:
        b_task, b_at = bad
        untrusted = {(b_task, e) for e in range(b_at, epochs + 1 if REGIMES[b_task].keeps_state else b_at + 1)}
    have = {(r.task_id, r.epoch) for r in rows} - untrusted
    lost = lambda tier: scratch_lost and tier == "scratch"  # noqa: E731
    best = {t: (f, 0) for t, f in frontiers.items()}
    # Only the failed task has checkpoints inside an epoch; try each with the epoch frontiers fixed
    # (a step never constrains another task: readers see epochs only).
    choices = [0] + [k for k in range(1, done + 1) if frontiers[task] == at - 1
                     and not lost(REGIMES[task].step_tier(at).value) and (bad is None or bad != (task, at))]
    for k in choices:
        up = UPSTREAM.get(task)
        ok = k == 0 or (
            (up is None or ((up, at) in have and frontiers[up] >= at))
            and (not REGIMES[task].keeps_state or at == 1 or (task, at - 1) in have))
        if ok:
            best[task] = max(best[task], (frontiers[task], k))
    return best


@settings(max_examples=300, deadline=None)
@given(epochs=st.integers(3, 6), task=st.sampled_from(TASKS), at=st.integers(1, 6), done=st.integers(0, OF - 1),
       kind=st.sampled_from(["failed", "failed+lost", "failed+bad"]), bad_task=st.sampled_from(TASKS),
       bad_at=st.integers(1, 6))
def test_a_failed_epochs_checkpoints_give_the_greatest_consistent_lex_frontier(
        epochs: int, task: str, at: int, done: int, kind: str, bad_task: str, bad_at: int) -> None:
    at, bad_at = min(at, epochs), min(bad_at, epochs)
    rows = history(epochs, (task, at))
    bad = (bad_task, bad_at) if kind == "failed+bad" and (bad_task, bad_at) in {(r.task_id, r.epoch) for r in rows} \
        else None
    failures = [FailedTask(task, at)] + ([LostScratch("/scratch")] if "lost" in kind else []) + (
        [BadEpoch(*bad)] if bad else [])
    steps = step_checkpoints(task, at, done)
    plan = plan_recovery("pipe", GRAPH, rows, failures, last_epoch=epochs, readable=readable_when("lost" in kind),
                         regimes=REGIMES, steps=steps)
    expected = lex_oracle(rows, epochs, (task, at), done, bad, "lost" in kind)
    got = {t.task_id: (t.kept_through, t.resume_from.step if t.resume_from else 0) for t in plan.tasks}
    assert got == expected
    # the plan's re-run set is the epoch-level one: a resumed epoch is still re-run, from inside
    _, redo = oracle(rows, epochs, bad, "lost" in kind)
    assert plan.rerun_set() == redo
    for t in plan.tasks:
        if t.resume_from:
            assert (t.resume_from.epoch, t.rerun[0]) == (at, at) and t.task_id == task


def test_the_plan_names_where_the_rerun_resumes_and_round_trips() -> None:
    import json

    from falkirk.policies.planning.recovery import RecoveryPlan

    rows = history(5, ("model", 4))
    plan = plan_recovery("pipe", GRAPH, rows, [FailedTask("model", 4)], last_epoch=5,
                         readable=readable_when(False), regimes=REGIMES, steps=step_checkpoints("model", 4, 3))
    model = plan.task("model")
    assert (model.kept_through, model.rerun, model.resume_from.step) == (3, (4, 5), 3)
    assert "iteration 3 of 4 of epoch 4 (on state of epoch 3)" in plan.table()
    again = RecoveryPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan and again.plan_id == plan.plan_id
    # without checkpoints inside epochs, the recorded plan has no resume_from at all (older plans keep their ids)
    plain = plan_recovery("pipe", GRAPH, rows, [FailedTask("model", 4)], last_epoch=5,
                          readable=readable_when(False), regimes=REGIMES)
    assert all("resume_from" not in t for t in plain.to_json()["tasks"]) and plain.plan_id != plan.plan_id
