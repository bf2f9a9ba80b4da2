"""The rules of a replay's last stages: re-run what later DAG runs computed from rolled-back
epochs, settle the DAG runs it touched, give back the slots it borrowed, settle a consumer's
second runs."""

from __future__ import annotations

from falkirk.policies.planning.replay_decisions import runs_to_settle
from falkirk.policies.replay.actions import QueueRun, Say, SetRunState, SettleSecondRuns, Working
from falkirk.policies.replay.rules import Acts, Outcome, Pass, affected, clear_and_mark, needed
from falkirk.policies.replay.views import Memory
from falkirk.policies.replay.waiting import free_slots


def look_at_later_runs(p: Pass, m: Memory) -> Outcome:
    """Once the re-runs are done, watch every DAG run after the plan's last epoch that the ledger
    names (runs that arrived during the recovery) from the next pass on. When the ledger names
    none, the DAG runs are settled in this pass: the ``later`` stage would sweep and clear nothing
    (a later run's row committed after this pass has seen the plan's rollback, as it would after
    the ``later`` pass)."""
    runs = {**{e: r for e, r in p.store.run_ids.items() if e not in m.run_ids}, **m.run_ids}
    later = {e for e in runs if e > p.plan.last_epoch}
    if not later:
        return Outcome(m.but(run_ids=runs, stage="settle"), status=Working(again=True))
    return Outcome(m.but(run_ids=runs, watch=m.watch | later, stage="later"), status=Working(again=True))


def clear_later_runs(p: Pass, m: Memory) -> Outcome:
    """Re-run the instances of later DAG runs that need it because of the plan: those of the tasks
    it affects (its stateful re-run tasks, and what is downstream of a re-run task) that failed
    waiting for a rolled-back epoch, or whose rows the sweep rolled back (the pass before). A
    later epoch whose run a discard deleted is left out. With nothing to clear, the DAG runs are
    settled next."""
    later = {e for e in m.run_ids if e > p.plan.last_epoch and e in p.airflow.runs and e not in p.airflow.missing}
    decided = needed(p, {(t, e) for e in later for t in affected(p)})
    if not decided.clear and not decided.mark_success:
        return Outcome(m.but(stage="settle"), status=Working(again=True))
    acts = Acts(m)
    clear_and_mark(p, acts, decided)
    if decided.clear:
        acts.lines.insert(0, f"{p.name}: later DAG runs arrived during the recovery; re-running " + ", ".join(
            f"{t}@{e}" for t, e in sorted(decided.clear, key=lambda x: (x[1], x[0]))))
    acts.memory = acts.memory.but(todo=frozenset(decided.clear), seen={}, stage="later-wait")
    return acts.outcome(Working(0, len(decided.clear), again=True))


def settle_runs(p: Pass, m: Memory) -> Outcome:
    """Set to success the failed DAG runs the replay touched whose every instance is now done
    (Airflow recomputes a run's state only while it runs); queue again those whose instances not
    done were cleared by Airflow and never started; name the others, which stay failed."""
    touched = set(m.cleared) | m.marked
    failed = {m.run_ids[e]: (run.state, dict(run.states)) for e, run in p.airflow.runs.items()
              if e in m.run_ids and m.run_ids[e] in touched and run.state == "failed"}
    decided = runs_to_settle(failed)
    acts = Acts(m.but(stage="hand-back", queued_again=m.queued_again | set(decided.requeue)))
    for run in decided.success:
        acts.actions.append(SetRunState(run_id=run, state="success", note=(
            f"Falkirk {p.name}: every task instance of this epoch is done")))
    if decided.success:
        acts.actions.append(Say(f"{p.name}: set {len(decided.success)} DAG runs to success: "
                                f"{', '.join(decided.success)}"))
    for run in decided.requeue:
        acts.actions.append(QueueRun(run_id=run, note=(
            f"Falkirk {p.name}: the rest of this epoch runs (Airflow cleared it when the plan marked a task success)")))
    if decided.requeue:
        acts.actions.append(Say(f"{p.name}: queued {len(decided.requeue)} DAG runs again to run the task instances "
                                f"Airflow cleared: {', '.join(decided.requeue)}"))
    acts.lines += [f"{p.name}: DAG run {run} stays failed: {why} (not a task this plan re-runs)"
                   for run, why in decided.left.items()]
    return acts.outcome(Working(again=True))


def hand_back_slots(p: Pass, m: Memory) -> Outcome:
    """Wait until every DAG run the replay queued again has started again. Airflow starts queued
    runs never looked at before the others, whatever their dates: an epoch triggered meanwhile
    takes the slot first, and if its stateful task waits (``depends_on_past``) on the run queued
    again, neither ever moves. So until those runs are running, the later runs that take their
    slots are queued again too. A paused DAG starts nothing: the order is left to its unpausing."""
    waiting = {str(r["dag_run_id"]) for r in p.airflow.active if r["state"] == "queued"} & m.queued_again
    if not waiting:
        return Outcome(m.but(stage="second-runs"), status=Working(again=True))
    if p.airflow.paused:
        return Outcome(m.but(stage="second-runs"), lines=(
            f"{p.name}: {p.plan.dag_id} is paused; once unpaused, check that {', '.join(sorted(waiting))} start before "
            f"later epochs",), status=Working(again=True))
    said = () if m.stage == "handing-back" else (
        f"{p.name}: waiting for the runs it queued again to start: {', '.join(sorted(waiting))}",)
    limit = p.airflow.max_active_runs
    freed = free_slots(p, m.but(stage="handing-back"), waiting, so_that="the earlier epochs it queued again start "
                        "first", held=f"took a max_active_runs={limit} slot before the earlier runs the plan queued "
                                      f"again")
    return Outcome(freed.memory, freed.actions, said + freed.lines, Working())


def settle_second_runs(p: Pass, m: Memory) -> Outcome:
    """Mark success the refused second runs of a consumer DAG's redone epochs (Airflow started them
    on a redone producer epoch's event); then the replay is done."""
    return Outcome(m.but(stage="done"), (SettleSecondRuns(),))
