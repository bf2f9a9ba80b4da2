"""The rules of a pass that waits for re-runs: report, settle refused redos, stop on a failure,
free the slots the re-runs need, queue again the failed runs that hold them, move on when done."""

from __future__ import annotations

from falkirk.policies.planning.replay_decisions import FAILED, runs_to_settle, slots_to_free, wait_verdict
from falkirk.policies.replay.actions import QueueRun, Say, Stopped, Working
from falkirk.policies.replay.rules import QUIET_SECONDS, Acts, Outcome, Pass, clear_and_mark, needed
from falkirk.policies.replay.views import Memory


def report_changes(p: Pass, m: Memory) -> Outcome:
    """One progress line per waited-for instance whose state changed since the last pass; a change
    restarts the stall clock."""
    seen, lines = dict(m.seen), []
    for task, epoch in sorted(m.todo, key=lambda k: (k[1], k[0])):
        state = p.airflow.state((task, epoch))
        if seen.get((task, epoch), "-") != state:
            seen[task, epoch] = state
            lines.append(f"  {p.now - m.started:6.1f}s  epoch {epoch}  {task:<12} {state or 'waiting'}")
    return Outcome(m.but(seen=seen, changed=p.now if lines else m.changed), lines=tuple(lines))


def settle_refused_redos(p: Pass, m: Memory) -> Outcome:
    """Settle, once each, the re-runs Airflow shows failed although their redo is committed: a task
    process killed after its commit (with the scheduler that ran it) is run again by the next
    scheduler, and that attempt finds the epoch committed. Marked success when the epoch completed
    (the attempt was refused), else cleared once to finish as a no-op. The pass ends here."""
    redone = {k for k in m.todo if p.airflow.state(k) in FAILED and k in p.store.rows} - m.settled
    if not redone:
        return Outcome(m)
    acts = Acts(m.but(settled=m.settled | redone, changed=p.now))
    decided = needed(p, redone)
    clear_and_mark(p, acts, decided)
    acts.actions.append(Say(f"{p.name}: {', '.join(f'{t} of epoch {e}' for t, e in sorted(redone))} failed after "
                            f"the redo had committed (an attempt killed after its commit, run again): "
                            + ("cleared to finish as a no-op" if decided.clear else "marked success")))
    return acts.outcome(_working(p, m))


def stop_on_a_failed_rerun(p: Pass, m: Memory) -> Outcome:
    """Stop when a re-run failed without a commit: a real failure, whose cause a person fixes
    before resuming the plan."""
    verdict = wait_verdict(m.todo, {k: p.airflow.state(k) for k in m.todo})
    if verdict.failed is None:
        return Outcome(m)
    (task, epoch), state = verdict.failed
    return Outcome(m, status=Stopped(f"{task} of epoch {epoch} ({m.run_ids[epoch]}) ended {state}; see its log in "
                                     f"Airflow, fix the cause, then resume with: falkirk replay {p.plan.plan_id}"))


def let_earlier_epochs_through(p: Pass, m: Memory) -> Outcome:
    """Queue again the later runs that hold the DAG's ``max_active_runs`` slots while the epochs
    the replay waits for stay queued: Airflow leaves a running run running when it clears another,
    and a later epoch's stateful task waits (``depends_on_past``) for the earlier one for ever."""
    waiting = {m.run_ids[e] for _, e in m.todo}
    limit = p.airflow.max_active_runs
    return free_slots(p, m, waiting, so_that="the earlier epochs it re-runs can start", held=(
        f"held one of the DAG's max_active_runs={limit} slots while waiting (depends_on_past) for an earlier "
        f"epoch this plan re-runs"))


def free_slots(p: Pass, m: Memory, waiting: set[str], so_that: str, held: str) -> Outcome:
    """Queue again the later runs holding the slots ``waiting`` needs
    (:func:`~falkirk.policies.planning.replay_decisions.slots_to_free`); stops when they are held
    by runs the replay cannot free, and nothing changed for the stall time."""
    limit = p.airflow.max_active_runs
    slots = slots_to_free(p.airflow.active, waiting, limit)
    acts = Acts(m.but(queued_again=m.queued_again | set(slots.requeue)))
    for run in slots.requeue:
        acts.actions += [QueueRun(run_id=run, note=(
            f"queued again by Falkirk {p.name} so that {so_that} (max_active_runs={limit})")),
            Say(f"{p.name}: {run} {held}; queued it again")]
    return acts.outcome(_stalled(p, m, slots.stuck))


def queue_failed_runs(p: Pass, m: Memory) -> Outcome:
    """Queue again the failed DAG runs that hold instances the replay waits for, not started, and
    nothing else not done: Airflow clears the instances downstream of one marked success but
    leaves their run failed, and the scheduler never starts an instance of a failed run. Looked at
    only once the instances have been quiet a while; stops when a failed run holds them for
    another reason (an instance of it failed that the plan does not re-run)."""
    if p.now - max(m.changed, m.looked) <= QUIET_SECONDS:
        return Outcome(m)
    waiting = {e for t, e in m.todo if p.airflow.state((t, e)) is None}
    failed = {m.run_ids[e]: (run.state, dict(run.states)) for e, run in p.airflow.runs.items()
              if e in waiting and run.state == "failed"}
    decided = runs_to_settle(failed)
    acts = Acts(m.but(looked=p.now, queued_again=m.queued_again | set(decided.requeue)))
    for run in decided.requeue:
        acts.actions += [QueueRun(run_id=run, note=(
            f"queued again by Falkirk {p.name}: the instances it re-runs were cleared in a failed run")),
            Say(f"{p.name}: {run} was failed with instances this plan re-runs not started; queued it again")]
    stuck = None if not decided.left else "the re-runs wait in failed DAG runs: " + "; ".join(
        f"{run} ({why})" for run, why in sorted(decided.left.items())) + "; clear those instances or mark them success"
    return acts.outcome(_stalled(p, m, stuck))


def _stalled(p: Pass, m: Memory, why: str | None) -> Stopped | None:
    """The stall detector: stop, naming what the replay waits for, once nothing changed for the
    stall time while it waits on ``why``."""
    if why is None or p.now - m.changed <= p.stall_seconds:
        return None
    return Stopped(f"{why}; resume with: falkirk replay {p.plan.plan_id}", stalled=True)


def _working(p: Pass, m: Memory) -> Working:
    verdict = wait_verdict(m.todo, {k: p.airflow.state(k) for k in m.todo})
    return Working(verdict.done, verdict.total)


def finished(p: Pass, m: Memory) -> bool:
    """Whether every waited-for instance succeeded (or, a replica taken over, was skipped)."""
    return wait_verdict(m.todo, {k: p.airflow.state(k) for k in m.todo}).finished


def waiting_for(p: Pass, m: Memory) -> Outcome:
    """Poll again: how many of the waited-for instances are done."""
    return Outcome(m, status=_working(p, m))


__all__ = ["finished", "let_earlier_epochs_through", "queue_failed_runs", "report_changes",
           "settle_refused_redos", "stop_on_a_failed_rerun", "waiting_for"]
