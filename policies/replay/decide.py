"""One pass of a replay, decided: :func:`decide` runs the rules of the replay's stage in order.

Each stage's rules, in the order they run (a rule that gives a status ends the pass):

``start`` (the first pass, also of a replay started again)
    :func:`~.rules.sweep_later_rows`, :func:`~.rules.settle_kept_instances`,
    :func:`~.rules.restore_lost_pairs`, :func:`~.rules.clear_the_plan`
``rerun``, ``later-wait`` (waiting for re-runs)
    :func:`~.waiting.report_changes`, :func:`~.waiting.settle_refused_redos`,
    :func:`~.waiting.stop_on_a_failed_rerun`, :func:`~.waiting.let_earlier_epochs_through`,
    :func:`~.waiting.queue_failed_runs`, then, when every re-run is done,
    :func:`~.finishing.look_at_later_runs`
``later``
    :func:`~.rules.sweep_later_rows`, :func:`~.finishing.clear_later_runs`
``settle``, ``hand-back``, ``second-runs``
    :func:`~.finishing.settle_runs`, :func:`~.finishing.hand_back_slots`,
    :func:`~.finishing.settle_second_runs`

A pass that moves, without acting, into a stage of :data:`ON_THE_SAME_VIEWS` goes on into it.

``decide`` reads nothing and writes nothing: the views are what the observer read, the actions
what the applier will do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from falkirk.policies.replay import finishing, rules, waiting
from falkirk.policies.replay.actions import Action, Decision, Done, Say, Working
from falkirk.policies.replay.rules import Outcome, Pass
from falkirk.policies.replay.views import AirflowView, Memory, StoreView

Rule = Callable[[Pass, Memory], Outcome]

STAGES: Mapping[str, Sequence[Rule]] = {
    "start": (rules.sweep_later_rows, rules.settle_kept_instances, rules.restore_lost_pairs, rules.clear_the_plan),
    "rerun": (waiting.report_changes, waiting.settle_refused_redos, waiting.stop_on_a_failed_rerun,
              waiting.let_earlier_epochs_through, waiting.queue_failed_runs),
    "later": (rules.sweep_later_rows, finishing.clear_later_runs),
    "settle": (finishing.settle_runs,),
    "hand-back": (finishing.hand_back_slots,),
    "handing-back": (finishing.hand_back_slots,),
    "second-runs": (finishing.settle_second_runs,),
}
STAGES = {**STAGES, "later-wait": STAGES["rerun"]}

# Stages whose rules read only what any pass observes (the watched runs' states, the active runs,
# paused): a pass that moves into one without acting goes on into it over the same views, where
# another observation would find nothing new. ``later`` is not one: it watches runs the pass
# before it did not read, and reads the store more widely.
ON_THE_SAME_VIEWS = frozenset({"settle", "hand-back", "second-runs"})


def _one_stage(p: Pass, memory: Memory) -> Outcome:
    """The rules of ``memory``'s stage in order, until one gives a status; a waiting stage whose
    rules gave none ends with the later runs (all re-runs done) or with what it waits for."""
    actions: list[Action] = []
    lines: list[str] = []
    for rule in STAGES[memory.stage]:
        outcome = rule(p, memory)
        memory = outcome.memory
        actions += outcome.actions
        lines += outcome.lines
        if outcome.status is not None:
            return Outcome(memory, tuple(actions), tuple(lines), outcome.status)
    if memory.stage in ("rerun", "later-wait"):
        last = finishing.look_at_later_runs if waiting.finished(p, memory) else waiting.waiting_for
        outcome = last(p, memory)
        return Outcome(outcome.memory, tuple(actions), tuple(lines), outcome.status)
    return Outcome(memory, tuple(actions), tuple(lines))


def decide(plan: Any, store: StoreView, airflow: AirflowView, memory: Memory, now: float,
           stall_seconds: float = 600.0) -> Decision:
    """What the replay of ``plan`` does in this pass, given what it read and remembers.

    >>> from falkirk.policies.planning.replay_decisions import AirflowRun
    >>> from types import SimpleNamespace as NS
    >>> plan = NS(plan_id="p1", dag_id="d", last_epoch=4, failures=(), tasks=(),
    ...           rerun_set=lambda: frozenset({("model", 4)}))
    >>> m = Memory.fresh(plan.rerun_set(), {4: "epoch-4"}, now=0.0)
    >>> seen = AirflowView(runs={4: AirflowRun({"model": "failed"}, state="failed")})
    >>> d = decide(plan, StoreView(rows={}), seen, m, now=0.0)
    >>> [a.line for a in d.actions], d.memory.stage
    (['plan p1: cleared epoch 4 (epoch-4): model'], 'rerun')
    >>> done = AirflowView(runs={4: AirflowRun({"model": "success"}, state="success")})
    >>> decide(plan, StoreView(rows={}, run_ids={5: "epoch-5"}), done, d.memory, now=5.0).memory.stage
    'later'
    >>> decide(plan, StoreView(rows={}), done, d.memory, now=5.0).status   # no later run: done in this pass
    Done(reran=1)
    """
    p = Pass(plan, store, airflow, now, stall_seconds)
    if memory.stage == "done":
        return Decision((), memory, Done(len(plan.rerun_set())))
    actions: list[Action] = []
    lines: list[str] = []
    while True:
        stage = memory.stage
        outcome = _one_stage(p, memory)
        memory, status = outcome.memory, outcome.status
        actions += outcome.actions
        lines += outcome.lines
        acted = any(not isinstance(a, Say) for a in actions)
        if acted or memory.stage == stage or memory.stage not in ON_THE_SAME_VIEWS:
            break
    if memory.stage == "done":
        status = Done(len(plan.rerun_set()))
    return Decision(tuple(actions), memory, status or Working(), tuple(lines))
