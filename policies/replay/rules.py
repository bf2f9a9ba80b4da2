"""The replay's rules: each one a fault found in a real replay, decided over one pass's views.

A rule takes the :class:`Pass` (the plan, the two views, the time) and the memory so far, and
returns an :class:`Outcome`: actions, the memory after them, progress lines, and, when the pass
ends there, a status. A rule whose actions change what the rules after it would read (a mark
success makes Airflow clear what is downstream) ends the pass: the next one observes again. :func:`falkirk.policies.replay.decide.decide` runs them in the order its
``STAGES`` give. The fault behind each rule is named in its docstring; its test is in
``tests/unit/test_replay_rules.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from falkirk.policies.ids import ProcessorId, ReplicaId
from falkirk.policies.planning.recovery import LostWorker
from falkirk.policies.planning.replay_decisions import (
    Clears,
    Instance,
    LaterRow,
    affected_later,
    clears_needed,
    marks_in_order,
    rows_to_sweep,
)
from falkirk.policies.regimes import Regime
from falkirk.policies.replay.actions import (
    Action,
    Clear,
    Invalidate,
    MarkSuccess,
    RestorePairs,
    Say,
    Status,
    Working,
)
from falkirk.policies.replay.views import AirflowView, Memory, StoreView

QUIET_SECONDS = 10.0
"""How long the waited-for instances stay as they are before a pass looks at their failed runs."""


@dataclass(frozen=True)
class Pass:
    """One pass: the ``plan`` (a :class:`~falkirk.policies.planning.recovery.RecoveryPlan`), what
    it read, the time (``now``, monotonic seconds), and how long a replay waits, with nothing
    changing, on something it cannot change before it stops (``stall_seconds``)."""

    plan: Any
    store: StoreView
    airflow: AirflowView
    now: float
    stall_seconds: float = 600.0

    @property
    def name(self) -> str:
        return f"plan {self.plan.plan_id}"


@dataclass(frozen=True)
class Outcome:
    """What a rule decided: ``actions`` in order, the ``memory`` after them, progress ``lines``,
    and a ``status`` when the pass ends with this rule."""

    memory: Memory
    actions: tuple[Action, ...] = ()
    lines: tuple[str, ...] = ()
    status: Status | None = None


@dataclass
class Acts:
    """Actions being collected, with the memory they change."""

    memory: Memory
    actions: list[Action] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def outcome(self, status: Status | None = None) -> Outcome:
        return Outcome(self.memory, tuple(self.actions), tuple(self.lines), status)


def clear_and_mark(p: Pass, acts: Acts, decided: Clears) -> None:
    """Append the clears (one per DAG run) and marks of ``decided``, and remember them."""
    m = acts.memory
    runs, cleared, marked = m.run_ids, dict(m.cleared), set(m.marked)
    for task, epoch in decided.mark_success:
        acts.actions.append(MarkSuccess(row=p.store.rows[task, epoch], run_id=runs[epoch], note=(
            f"Falkirk {p.name}: this epoch is committed and completed; re-running it (refused) would change nothing")))
        marked.add(runs[epoch])
    for epoch in sorted({e for _, e in decided.clear}):
        tasks = tuple(sorted(str(t) for t, e in decided.clear if e == epoch))
        acts.actions.append(Clear(epoch=epoch, run_id=runs[epoch], tasks=tasks,
                                  line=f"{p.name}: cleared epoch {epoch} ({runs[epoch]}): {', '.join(tasks)}"))
        cleared[runs[epoch]] = tuple(sorted({*cleared.get(runs[epoch], ()), *tasks}))
    acts.memory = m.but(cleared=cleared, marked=frozenset(marked), changed=p.now if decided.clear else m.changed,
                        watch=m.watch | {e for _, e in decided.clear} | {e for _, e in decided.mark_success})


def needed(p: Pass, wanted: Iterable[Instance]) -> Clears:
    """Of ``wanted``, what needs a clear and what a mark success
    (:func:`~falkirk.policies.planning.replay_decisions.clears_needed`); a replica its twin took
    over stays skipped (run again, it would only find itself dead), and an instance waiting on a
    lost worker's queue is cleared so that placement moves it.

    >>> from falkirk.policies.planning.replay_decisions import AirflowRun
    >>> from falkirk.policies.replay.views import AirflowView, StoreView
    >>> p = Pass(plan=None, now=0.0, store=StoreView(rows={}, taken_over=frozenset({"s[2]"})),
    ...          airflow=AirflowView(runs={3: AirflowRun({"s[2]": "skipped", "s[3]": "failed"}, state="failed")}))
    >>> sorted(needed(p, [("s[2]", 3), ("s[3]", 3)]).clear)
    [('s[3]', 3)]
    """
    lost = {f.worker for f in getattr(p.plan, "failures", ()) if isinstance(f, LostWorker)}
    wanted = {(t, e) for t, e in wanted if e in p.airflow.runs
              and not (t in p.store.taken_over and p.airflow.state((t, e)) == "skipped")}
    runs = {e: p.airflow.runs[e] for e in {e for _, e in wanted}}
    return clears_needed(wanted, runs, set(p.store.rows), p.store.completed, lost)


# -- the first pass -------------------------------------------------------------------------------


def sweep_later_rows(p: Pass, m: Memory) -> Outcome:
    """Roll back the rows of DAG runs after the plan's last epoch that may have been computed from
    a row the plan (or an earlier sweep) rolled back: runs that arrived while the replay started.
    Decided in the order of the store's own commits (``rollbacks_seen`` against the version that
    recorded each rollback), never a clock
    (:func:`~falkirk.policies.planning.replay_decisions.rows_to_sweep`)."""
    swept = rows_swept(p)
    if not swept:
        return Outcome(m)
    digest = ",".join(sorted(str(r.commit_id) for r in swept))
    name = f"{p.plan.plan_id}+later:{hashlib.sha256(digest.encode()).hexdigest()[:12]}"
    return Outcome(m, (Invalidate(rows=tuple(swept), name=name, line=(
        f"{p.name}: invalidated {len(swept)} rows of later DAG runs computed from rolled-back epochs")),),
        status=Working(again=True))


def rows_swept(p: Pass) -> list[Any]:
    """The current rows :func:`sweep_later_rows` rolls back."""
    if p.store.rolled_back_at is None:  # the plan rolled nothing back: nothing later was computed from it
        return []
    last = p.plan.last_epoch
    rows = {LaterRow(processor=r.processor, epoch=r.epoch, incarnation=r.incarnation,
                     rollbacks_seen=r.rollbacks_seen, committed_at=r.committed_at): r
            for (_, epoch), r in p.store.rows.items() if epoch > last}
    down = p.store.downstream
    upstream: dict[str, set[str]] = {t: {u for u in down if t in down[u]} | {t} for t in down}
    swept = rows_to_sweep(rows, last, affected(p), p.store.rolled_back, upstream, p.store.rolled_back_at)
    return [rows[r] for r in swept]


def affected(p: Pass) -> set[ProcessorId]:
    """The tasks whose epochs after the plan's last one depend on epochs it redoes
    (:func:`~falkirk.policies.planning.replay_decisions.affected_later`)."""
    redone = {t.task_id for t in p.plan.tasks if t.rerun}
    keeps = {t.task_id for t in p.plan.tasks if Regime.parse(t.regime).keeps_state}
    return affected_later(p.store.downstream, redone, keeps)


def settle_kept_instances(p: Pass, m: Memory) -> Outcome:
    """Mark success the failed instances of the plan's epochs that it keeps (committed, current,
    completed): Airflow re-ran them (a Clear or a backfill of a completed epoch) and the operator
    refused, failing what is downstream too; left failed, the re-runs downstream would wait on
    them for ever. Marked furthest downstream first: Airflow clears the failed instances
    downstream of one marked success, and so clears only what the plan re-runs anyway."""
    rerun = p.plan.rerun_set()
    first = min((e for _, e in rerun), default=p.plan.last_epoch + 1)
    kept = {k for k in p.store.completed if k not in rerun and first <= k[1] <= p.plan.last_epoch
            and k[1] in m.run_ids and k[1] in p.airflow.runs}
    states = {e: dict(p.airflow.runs[e].states) for e in {e for _, e in kept}}
    reach = {t: len(d) for t, d in p.store.downstream.items()}
    marks = marks_in_order(kept, states, reach)
    acts = Acts(m)
    if not marks:
        return acts.outcome()
    clear_and_mark(p, acts, Clears(frozenset(), tuple(marks)))
    acts.actions.append(Say(f"{p.name}: marked {len(marks)} refused re-runs of kept epochs success"))
    return acts.outcome(Working(again=True))  # Airflow cleared what is downstream of them: look again


def restore_lost_pairs(p: Pass, m: Memory) -> Outcome:
    """Partitions of paired tasks that lost both replicas and that the plan re-executes get two new
    replicas, active, on live workers, before anything is cleared (the durable path)."""
    wanted = {(p_.task, ReplicaId.of(task=p_.task, map_index=p_.map_index).partition)
              for p_ in (ProcessorId.parse(t) for t, _ in p.plan.rerun_set()) if p_.partitioned}
    lost = tuple(sorted(wanted & p.store.lost_partitions))
    return Outcome(m, (RestorePairs(partitions=lost),), status=Working(again=True)) if lost else Outcome(m)


def clear_the_plan(p: Pass, m: Memory) -> Outcome:
    """Clear the plan's instances that still need it: not redone and settled in Airflow, or never
    run in a run that ended, or failed after their redo committed (they re-run as a no-op), or
    waiting on a lost worker's queue; mark success those redone whose epoch completed although
    Airflow shows them failed. What is queued or running is left alone, so a replay started again
    never clears what the one before it cleared."""
    acts = Acts(m)
    clear_and_mark(p, acts, needed(p, m.todo))
    skipped = len(m.todo) - len([a for a in acts.actions if isinstance(a, Clear) for _ in a.tasks])
    if skipped:
        acts.lines.append(f"{p.name}: {skipped} task instances already re-ran or are waiting to; not cleared again")
    acts.memory = acts.memory.but(handled=m.handled | m.todo, stage="rerun")
    return acts.outcome(Working(0, len(m.todo), again=True))
