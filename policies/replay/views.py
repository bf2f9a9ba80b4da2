"""What one pass of a replay sees, and what the replay remembers from one pass to the next.

A pass reads Airflow first and the store after (:class:`AirflowView`, then :class:`StoreView`): a
task commits before Airflow marks it success, so an instance seen settled in the first read has
its ledger row in the second. :class:`Memory` is all the replay carries between passes; a replay
that starts again (its process killed, its lease taken over) starts from ``Memory.fresh``, and
what it finds in the two views tells it what the previous one already did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from falkirk.policies.ids import ProcessorId
from falkirk.policies.planning.replay_decisions import AirflowRun, Instance, RolledBack

Stage = Literal["start", "rerun", "later", "later-wait", "settle", "hand-back", "handing-back", "second-runs", "done"]
"""Where a replay is: its first pass (``start``), waiting for the plan's re-runs (``rerun``), then
for the re-runs of later DAG runs that arrived meanwhile (``later``), then settling DAG runs, giving
back the ``max_active_runs`` slots it borrowed, and settling a consumer's second runs."""


@dataclass(frozen=True, kw_only=True)
class StoreView:
    """The store as one pass read it, after Airflow.

    ``rows``: the current ledger rows (anything with ``processor``, ``epoch``, ``incarnation``,
    ``rollbacks_seen``, ``committed_at`` and ``commit_id``), by instance; ``run_ids``: the DAG run of
    every epoch with a row, current or rolled back; ``completed``: the current rows whose epoch
    completed in Airflow; ``taken_over``: replicas of process pairs their twins took over;
    ``lost_partitions``: (task, partition) of paired tasks that lost both replicas; ``rolled_back``
    and ``rolled_back_at``: what the plan and its sweeps rolled back, and when the plan did;
    ``downstream``: each task's downstream tasks in the ledger's graph, itself excluded.
    """

    rows: Mapping[Instance, Any]
    run_ids: Mapping[int, str] = field(default_factory=dict)
    completed: frozenset[Instance] = frozenset()
    taken_over: frozenset[ProcessorId] = frozenset()
    lost_partitions: frozenset[tuple[str, int]] = frozenset()
    rolled_back: tuple[RolledBack, ...] = ()
    rolled_back_at: datetime | None = None
    downstream: Mapping[ProcessorId, frozenset[ProcessorId]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class AirflowView:
    """Airflow as one pass read it, before the store.

    ``runs``: each watched epoch's DAG run (instance states and queues, the run's state);
    ``missing``: watched epochs whose DAG run no longer exists (a discard deleted it); ``active``:
    the DAG's active runs (``dag_run_id``, ``state``, ``logical_date``); ``max_active_runs`` and
    ``paused``: the DAG's.
    """

    runs: Mapping[int, AirflowRun]
    missing: frozenset[int] = frozenset()
    active: tuple[Mapping[str, Any], ...] = ()
    max_active_runs: int | None = None
    paused: bool = False

    def state(self, instance: Instance) -> str | None:
        """The Airflow state of ``instance`` (``None``: not started, or its run unwatched).

        >>> AirflowView(runs={3: AirflowRun({"clean": "running"})}).state(("clean", 3))
        'running'
        """
        run = self.runs.get(instance[1])
        return run.states.get(instance[0]) if run is not None else None


@dataclass(frozen=True, kw_only=True)
class Memory:
    """What a replay carries from one pass to the next.

    ``run_ids``: the DAG run of each epoch it works on; ``watch``: the epochs the next pass reads
    from Airflow; ``todo``: the instances it waits for; ``handled``: the instances it already
    decided on (cleared, marked success, or left running); ``settled``: failed re-runs whose redo
    had committed, settled once each; ``cleared``/``marked``/``queued_again``: the DAG runs it
    cleared instances of, marked instances success in, and queued again; ``seen``: each waited-for
    instance's state as last reported; ``changed``: when one last changed (the stall detector's
    clock); ``looked``: when the failed runs were last looked at; ``started``: when the replay
    started (monotonic seconds, as the three others).
    """

    stage: Stage = "start"
    run_ids: Mapping[int, str] = field(default_factory=dict)
    watch: frozenset[int] = frozenset()
    todo: frozenset[Instance] = frozenset()
    handled: frozenset[Instance] = frozenset()
    settled: frozenset[Instance] = frozenset()
    cleared: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    marked: frozenset[str] = frozenset()
    queued_again: frozenset[str] = frozenset()
    seen: Mapping[Instance, str | None] = field(default_factory=dict)
    started: float = 0.0
    changed: float = 0.0
    looked: float = 0.0

    @classmethod
    def fresh(cls, rerun: frozenset[Instance], run_ids: Mapping[int, str], now: float,
              last_epoch: int | None = None) -> Memory:
        """The memory of a replay's first pass over the re-run set ``rerun``, whose runs are
        ``run_ids``: it watches the epochs it re-runs and, through the plan's ``last_epoch``, the
        epochs between them that it keeps.

        >>> m = Memory.fresh(frozenset({("model", 4), ("model", 6)}), {3: "e3", 4: "e4", 5: "e5", 6: "e6"}, now=10.0,
        ...                  last_epoch=6)
        >>> m.stage, sorted(m.watch), m.changed
        ('start', [4, 5, 6], 10.0)
        """
        first = min((e for _, e in rerun), default=None)
        kept = {e for e in run_ids if first is not None and last_epoch is not None and first <= e <= last_epoch}
        return cls(run_ids=dict(run_ids), watch=frozenset({e for _, e in rerun} | kept), todo=frozenset(rerun),
                   started=now, changed=now, looked=now)

    def but(self, **changes: Any) -> Memory:
        """This memory with ``changes``.

        >>> Memory().but(stage="rerun").stage
        'rerun'
        """
        return replace(self, **changes)
